"""TurboQuantCache: transformers' Cache interface over one PagedLayerCache per layer.

Every token's key and value is quantized into the pages as it arrives, except the first
`sink_tokens` tokens of each sequence, which a table may keep exact in fp16. A query attends to its
`recent_tokens` most recent positions (its own included) through their keys and values as computed
(the table's recent window: the last recent_tokens - 1 rows are kept in fp16 beside the pages, the
step's own rows are at hand) and to every older one through the pages. With chunk_reads "exact"
(the default) the rows of a step of several tokens (a prompt's prefill, a chunk) also read every
earlier position of their own step, and the kept window, exactly, as a context phase over fresh K
and V does: reading a prompt's own tokens through the pages caused about 80% of the 3-bit
passkey loss (docs/QUALITY.md#why-the-prompt-is-read-exactly). "cache" keeps the per-token rule
for every row, so that a prefill reads what decode steps would (tq-eval ppl's protocol).

Backends (integrations.backends, chosen once per layer at its first update): "kernels" keeps the
pages on the GPU and appends and reads them with the CUDA library; "reference" uses the Python
reference (any device); "auto" takes the kernels where they can run (CUDA tensors in fp16/bf16 and
the library built). Either way `update` returns the sink tokens only, tagged with the layer
(attribute `tq_layer`), and the "turboquant" attention function (integrations.attention, which the
cache requires) hands the call to the layer, which reads the packed tokens in place
(packed_attention). Written against the layer API that transformers 4.56 and 5.x share (see
get_mask_sizes for the one signature that differs).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ..calibration.table import KVTable
from ..core.errors import TQError
from ..core.paged import PagedLayerCache
from ..core.quantizer import check_finite
from .attention import CHUNK_READS  # how a step's rows read the step's other positions (see above)
from .backends import BACKENDS, KernelBackend, PagesBackend, choose_backend
from .packed_attention import layer_attention

TOKENS_PER_BLOCK = 16


def check_chunk_reads(chunk_reads: str) -> str:
    if chunk_reads not in CHUNK_READS:
        raise TQError(f"chunk_reads {chunk_reads!r} is unknown; use one of {', '.join(CHUNK_READS)}")
    return chunk_reads


class TurboQuantLayer(DynamicLayer):
    def __init__(self, key_codec, value_codec, num_kv_heads: int, sink_tokens: int,
                 recent_tokens: int = 1, tokens_per_block: int = TOKENS_PER_BLOCK,
                 backend: str = "auto", page_lse_shift: torch.Tensor | None = None,
                 chunk_reads: str = "exact"):
        super().__init__()
        if backend not in BACKENDS:
            raise TQError(f"backend {backend!r} is unknown; use one of {', '.join(BACKENDS)}")
        self.chunk_reads = check_chunk_reads(chunk_reads)
        self.codecs = (key_codec, value_codec)
        self.num_kv_heads = num_kv_heads
        self.sink_tokens = sink_tokens
        self.recent_tokens = recent_tokens
        self.tokens_per_block = tokens_per_block
        self.backend = backend
        self.page_lse_shift = page_lse_shift  # [Hq], subtracted from the pages' log-sum-exp
        self._clear()

    def _clear(self) -> None:
        self.pages: PagedLayerCache | None = None
        self.block_table: torch.Tensor | None = None  # int32 [batch, 2, blocks]
        self.sinks: tuple[torch.Tensor, torch.Tensor] | None = None  # fp16 [batch, H, s, d]
        self.length = 0
        self.pages_backend: PagesBackend | None = None  # chosen at the first update (backends.py)
        # the most recent packed positions' rows as computed, (k, v) [batch, H, n, d], model dtype:
        # the kept window (fp16) before the last update, then that update's packed rows
        self.exact: tuple[torch.Tensor, torch.Tensor] | None = None
        self.is_initialized = False

    def lazy_initialization(self, key_states, value_states=None) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch = key_states.shape[0]
        if key_states.shape[1] != self.num_kv_heads:
            raise TQError(f"the model has {key_states.shape[1]} KV heads but the table "
                          f"{self.num_kv_heads}")
        self.pages_backend = choose_backend(self.backend, self, key_states)
        if self.page_lse_shift is not None:
            self.page_lse_shift = self.page_lse_shift.to(self.device, torch.float32)
        self.pages = PagedLayerCache(*self.codecs, self.num_kv_heads, self.tokens_per_block, 0,
                                     device=self.device)
        self.block_table = torch.zeros(self.batch, 2, 0, dtype=torch.int32, device=self.device)
        empty = key_states[:, :, :0].to(torch.float16)
        self.sinks = (empty, empty.clone())
        self.exact = (empty.to(self.dtype), empty.to(self.dtype))
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """key_states, value_states: [batch, H, T, d], the next T positions of every sequence.
        Returns the sink tokens, tagged with this layer for the attention function."""
        # the kernels cannot refuse NaN or Inf (they would store a finite wrong vector), and the
        # exact sinks and window would keep it: refuse it here, whatever the backend
        check_finite("the key/value input", key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, steps = self.length, key_states.shape[2]
        exact = max(0, min(self.sink_tokens, start + steps) - start)
        if exact:
            self.sinks = tuple(torch.cat([s, x[:, :, :exact].to(torch.float16)], dim=2)
                               for s, x in zip(self.sinks, (key_states, value_states)))
        if steps > exact:
            new = (key_states[:, :, exact:], value_states[:, :, exact:])
            self._append(*new, start + exact - self.sink_tokens)
            # the window kept from before (its last recent_tokens - 1 rows, stored in fp16), then
            # the step's rows
            first_kept = max(0, self.exact[0].shape[2] - (self.recent_tokens - 1))
            self.exact = tuple(torch.cat([w[:, :, first_kept:].to(torch.float16).to(self.dtype), x],
                                         dim=2) for w, x in zip(self.exact, new))
        self.length = start + steps
        out = tuple(s.to(self.dtype).view_as(s) for s in self.sinks)  # fresh objects to tag
        for t in out:
            t.tq_layer = self
        return out

    @property
    def sink_count(self) -> int:
        return min(self.length, self.sink_tokens)

    @property
    def packed_length(self) -> int:
        return self.length - self.sink_count

    @property
    def exact_recent(self) -> int:
        """How many most recent positions each row of the last step reads through `exact`, the rows
        as computed: the recent window, or with chunk_reads "exact" every row held there (the kept
        window and the step's own), each row up to its own position."""
        return self.exact[0].shape[2] if self.chunk_reads == "exact" else self.recent_tokens

    @property
    def packed_end(self) -> int:
        """The packed positions that the last step's rows read through the pages: 0 .. packed_end - 1
        for every row with chunk_reads "exact"; with "cache", row j of T up to packed_end - T + j."""
        return max(0, self.packed_length - self.exact_recent)

    def _append(self, k, v, first: int) -> None:
        """Quantize [batch, H, n, d] into packed positions first .. first + n - 1."""
        n = k.shape[2]
        self._reserve(first + n)
        seq_idx = torch.arange(self.batch, device=self.device).repeat_interleave(n)
        pos = torch.arange(first, first + n, device=self.device).repeat(self.batch)
        flat = [x.permute(0, 2, 1, 3).reshape(self.batch * n, self.num_kv_heads, -1) for x in (k, v)]
        self.pages_backend.append(flat[0], flat[1], seq_idx, pos)

    def _reserve(self, tokens: int) -> None:
        """Blocks for `tokens` packed positions per sequence; block i of sequence b is chunk i*batch+b.
        The table at least doubles when it grows, so a long generation copies the pool O(log n) times."""
        have = self.block_table.shape[2]
        need = -(-tokens // self.tokens_per_block)
        if need <= have:
            return
        need = max(need, 2 * have)
        self.pages.grow(need * self.batch)
        chunks = torch.arange(have * self.batch, need * self.batch, dtype=torch.int32,
                              device=self.device).view(need - have, self.batch).T
        self.block_table = torch.cat([self.block_table, chunks[:, None, :].expand(-1, 2, -1)], dim=2)
        self.pages_backend.moved()

    @property
    def uses_kernels(self) -> bool:
        """Whether the layer runs on the kernel library (False until its first update)."""
        return isinstance(self.pages_backend, KernelBackend)

    def read_packed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed tokens dequantized: K, V [batch, H, packed_length, d] in the model's dtype."""
        keys, values = [], []
        for b in range(self.batch):
            k, v = self.pages_backend.gather(b, 0, self.packed_length)
            keys.append(k.transpose(0, 1))
            values.append(v.transpose(0, 1))
        return torch.stack(keys), torch.stack(values)

    def read_dense(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every cached token as dense K, V [batch, H, length, d]: sinks, then the packed tokens."""
        k, v = self.read_packed()
        return (torch.cat([self.sinks[0].to(self.dtype), k], dim=2),
                torch.cat([self.sinks[1].to(self.dtype), v], dim=2))

    def attention(self, query: torch.Tensor, mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
        """The "turboquant" attention function's call on the keys this layer returned:
        query [B, Hq, T, d] of the last update's T tokens -> [B, T, Hq, d]."""
        return layer_attention(self, query, mask, scaling)

    def packed_logit_bias(self) -> torch.Tensor | None:
        """What the pages' shift adds to each query head's logits over the cache read back densely
        ([Hq, 1, length]: 0 on the sinks, -shift on the packed tokens), or None."""
        if self.page_lse_shift is None:
            return None
        packed = torch.arange(self.length, device=self.device) >= self.sink_count
        return -self.page_lse_shift[:, None, None] * packed

    def get_seq_length(self, *args) -> int:
        return self.length

    def get_mask_sizes(self, query) -> tuple[int, int]:
        """transformers 4.x passes cache_position (a tensor), 5.x the query length (an int)."""
        query_length = query if isinstance(query, int) else query.shape[0]
        return self.length + query_length, 0

    def get_max_cache_shape(self) -> int:
        return -1

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self._clear()

    def _unsupported(self, *args, **kwargs):
        raise TQError("the TurboQuant cache does not support beam search, cropping or batch "
                      "reordering; use greedy or sampled decoding")

    crop = reorder_cache = batch_repeat_interleave = batch_select_indices = _unsupported


class TurboQuantCache(Cache):
    """A packed TurboQuant KV cache for one model, laid out by a calibration table."""

    def __init__(self, table: KVTable, tokens_per_block: int = TOKENS_PER_BLOCK,
                 backend: str = "auto", chunk_reads: str = "exact"):
        self.table = table
        layers = [TurboQuantLayer(*table.codecs(i), table.kv_heads, table.sink_tokens,
                                  table.recent_tokens, tokens_per_block, backend,
                                  table.layers[i].page_lse_shift, chunk_reads)
                  for i in range(len(table.layers))]
        super().__init__(layers=layers)

    def stored_bytes(self) -> int:
        """Bytes the cache holds for the tokens written so far."""
        return sum(layer.batch * self.table.layer_cache_bytes(i, layer.length)
                   for i, layer in enumerate(self.layers) if layer.is_initialized)

    def fp16_bytes(self) -> int:
        """What an fp16 cache would hold for the same tokens."""
        per_token = self.table.kv_heads * self.table.fp16_token_bytes()
        return sum(layer.batch * layer.length * per_token
                   for layer in self.layers if layer.is_initialized)
