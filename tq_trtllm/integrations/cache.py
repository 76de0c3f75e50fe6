"""TurboQuantCache: transformers' Cache interface over one PagedLayerCache per layer.

Every token's key and value, the one being processed included, is quantized into the pages before
attention reads them (the kernels' quantize-append-then-attend order), except the first
`sink_tokens` tokens of each sequence, which a table may keep exact in fp16. `update` returns the
keys and values read back from the pages, so any attention implementation sees the cache's contents.
Written against the layer API that transformers 4.56 and 5.x share (see get_mask_sizes for the one
signature that differs).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ..calibration.table import KVTable
from ..core.errors import TQError
from ..core.paged import PagedLayerCache

TOKENS_PER_BLOCK = 16


class TurboQuantLayer(DynamicLayer):
    def __init__(self, key_codec, value_codec, num_kv_heads: int, sink_tokens: int,
                 tokens_per_block: int = TOKENS_PER_BLOCK):
        super().__init__()
        self.codecs = (key_codec, value_codec)
        self.num_kv_heads = num_kv_heads
        self.sink_tokens = sink_tokens
        self.tokens_per_block = tokens_per_block
        self._clear()

    def _clear(self) -> None:
        self.pages: PagedLayerCache | None = None
        self.block_table: torch.Tensor | None = None  # int32 [batch, 2, blocks]
        self.sinks: tuple[torch.Tensor, torch.Tensor] | None = None  # fp16 [batch, H, s, d]
        self.length = 0
        self.is_initialized = False

    def lazy_initialization(self, key_states, value_states=None) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch = key_states.shape[0]
        if key_states.shape[1] != self.num_kv_heads:
            raise TQError(f"the model has {key_states.shape[1]} KV heads but the table "
                          f"{self.num_kv_heads}")
        self.pages = PagedLayerCache(*self.codecs, self.num_kv_heads, self.tokens_per_block, 0,
                                     device=self.device)
        self.block_table = torch.zeros(self.batch, 2, 0, dtype=torch.int32, device=self.device)
        empty = key_states[:, :, :0].to(torch.float16)
        self.sinks = (empty, empty.clone())
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """key_states, value_states: [batch, H, T, d], the next T positions of every sequence."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, steps = self.length, key_states.shape[2]
        exact = max(0, min(self.sink_tokens, start + steps) - start)
        if exact:
            self.sinks = tuple(torch.cat([s, x[:, :, :exact].to(torch.float16)], dim=2)
                               for s, x in zip(self.sinks, (key_states, value_states)))
        if steps > exact:
            self._append(key_states[:, :, exact:], value_states[:, :, exact:],
                         start + exact - self.sink_tokens)
        self.length = start + steps
        return self._read()

    def _append(self, k, v, first: int) -> None:
        """Quantize [batch, H, n, d] into packed positions first .. first + n - 1."""
        n = k.shape[2]
        self._reserve(first + n)
        seq_idx = torch.arange(self.batch, device=self.device).repeat_interleave(n)
        pos = torch.arange(first, first + n, device=self.device).repeat(self.batch)
        flat = [x.permute(0, 2, 1, 3).reshape(self.batch * n, self.num_kv_heads, -1) for x in (k, v)]
        self.pages.append(self.block_table, flat[0], flat[1], seq_idx, pos)

    def _reserve(self, tokens: int) -> None:
        """Blocks for `tokens` packed positions per sequence; block i of sequence b is chunk i*batch+b."""
        have = self.block_table.shape[2]
        need = -(-tokens // self.tokens_per_block)
        if need <= have:
            return
        self.pages.grow(need * self.batch)
        chunks = torch.arange(have * self.batch, need * self.batch, dtype=torch.int32,
                              device=self.device).view(need - have, self.batch).T
        self.block_table = torch.cat([self.block_table, chunks[:, None, :].expand(-1, 2, -1)], dim=2)

    def _read(self):
        packed = self.length - min(self.length, self.sink_tokens)
        keys, values = [], []
        for b in range(self.batch):
            k, v = self.pages.gather(self.block_table, b, 0, packed, dtype=self.dtype)
            keys.append(k.transpose(0, 1))
            values.append(v.transpose(0, 1))
        k, v = torch.stack(keys), torch.stack(values)
        return (torch.cat([self.sinks[0].to(self.dtype), k], dim=2),
                torch.cat([self.sinks[1].to(self.dtype), v], dim=2))

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

    def __init__(self, table: KVTable, tokens_per_block: int = TOKENS_PER_BLOCK):
        self.table = table
        layers = [TurboQuantLayer(*table.codecs(i), table.kv_heads, table.sink_tokens, tokens_per_block)
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
