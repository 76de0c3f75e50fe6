"""How a TurboQuantLayer's pages are written and read: one interface, two implementations.

A layer's storage is the format's (core.paged.PagedLayerCache: the pools, with the layer's block
table), whichever backend runs it. A backend does three things to it: `append` quantizes rows into
the pages, `gather` dequantizes a sequence's positions, and `attend` computes the part of a step's
attention that reads the pages (output and log-sum-exp, for packed_attention to merge with the
exact parts). ReferenceBackend does them with the Python reference (any device, any dtype),
KernelBackend with the CUDA kernel library (CUDA tensors in float16 or bfloat16). The abstract
methods follow transformers' QuantizedLayer (cache_utils.py: `_quantize` / `_dequantize`, one
subclass per quantizer), held by the layer rather than subclassing it, so that the layer's storage
and rules are written once for both.

`choose_backend` picks one when a layer sees its first keys, from the cache's `backend` argument
("auto" | "kernels" | "reference") and those keys; the layer keeps it until it is reset. Each layer
chooses for itself, since a model's layers may sit on different devices.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .. import kernels
from ..core.errors import TQError
from .packed_attention import dense_part

BACKENDS = ("auto", "kernels", "reference")
KERNEL_DTYPES = (torch.float16, torch.bfloat16)


class PagesBackend(ABC):
    """The operations on one layer's pages. Row tensors are [n, num_kv_heads, head_dim]."""

    name: str

    def __init__(self, layer):
        self.layer = layer

    def moved(self) -> None:
        """The layer replaced its pools and block table (it grew): drop what was derived from them."""

    @abstractmethod
    def append(self, k: torch.Tensor, v: torch.Tensor, seq_idx: torch.Tensor,
               pos: torch.Tensor) -> None:
        """Quantize rows k[i], v[i] into packed position pos[i] of sequence seq_idx[i]."""

    @abstractmethod
    def gather(self, seq: int, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of packed positions start .. start + length - 1 of `seq`, as rows in the layer's
        dtype."""

    @abstractmethod
    def attend(self, q: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The pages' part of the attention of q [B, Hq, T, d], the layer's last T positions (which
        positions each row reads: packed_attention's doc): float32 (normalized output
        [B, Hq, T, d], lse [B, Hq, T]), the lse lowered by the layer's page_lse_shift."""


class ReferenceBackend(PagesBackend):
    name = "reference"

    def append(self, k, v, seq_idx, pos) -> None:
        layer = self.layer
        layer.pages.append(layer.block_table, k, v, seq_idx, pos)

    def gather(self, seq, start, length):
        layer = self.layer
        return layer.pages.gather(layer.block_table, seq, start, length, dtype=layer.dtype)

    def attend(self, q, scaling):
        layer = self.layer
        end = layer.packed_end
        k, v = (x[:, :, :end] for x in layer.read_packed())
        # "exact": every row sees all `end` positions; "cache": row j up to end - T + j
        first = end if layer.chunk_reads == "exact" else end - q.shape[2]
        out, lse = dense_part(q, k, v, scaling, first)
        if layer.page_lse_shift is not None:
            lse = lse - layer.page_lse_shift[:, None]
        return out, lse


class KernelBackend(PagesBackend):
    name = "kernels"

    def __init__(self, layer):
        super().__init__(layer)
        self._kernel_cache = None  # kernels.KernelCache of the current pools and block table

    def moved(self) -> None:
        self._kernel_cache = None

    def kernel_cache(self) -> kernels.KernelCache:
        """The library's view of the layer's pages (the codec tables uploaded once per growth)."""
        if self._kernel_cache is None:
            layer = self.layer
            self._kernel_cache = kernels.KernelCache(layer.pages, layer.block_table,
                                                     layer.page_lse_shift)
        return self._kernel_cache

    def append(self, k, v, seq_idx, pos) -> None:
        kernels.quantize_append(self.kernel_cache(), k, v, seq_idx, pos)

    def gather(self, seq, start, length):
        return kernels.dequantize(self.kernel_cache(), seq, start, length, self.layer.dtype)

    def attend(self, q, scaling):
        layer = self.layer
        b, hq, t, d = q.shape
        end, kc, rows = layer.packed_end, self.kernel_cache(), q.transpose(1, 2).contiguous()
        if layer.chunk_reads == "exact" and t > 1:
            if end == 0:  # nothing older than the step's rows: no launch
                return q.new_zeros(q.shape, dtype=torch.float32), q.new_full((b, hq, t), float("-inf"),
                                                                             dtype=torch.float32)
            # every row sees the same pages: one-token sequences over copies of its block table row
            kc = kc.over(layer.block_table.repeat_interleave(t, dim=0))
            rows = rows.view(b * t, 1, hq, d)
        lse = torch.empty(*rows.shape[:3], dtype=torch.float32, device=q.device)
        lens = torch.full((rows.shape[0],), end, dtype=torch.int32, device=q.device)
        # the plan of this step's shape is made by the first layer's call and reused by the others
        out = kernels.attention(kc, rows, lens, end, scaling, lse=lse)
        return out.view(b, t, hq, d).transpose(1, 2).float(), lse.view(b, t, hq).transpose(1, 2)


def choose_backend(backend: str, layer, x: torch.Tensor) -> PagesBackend:
    """The backend for a layer holding tensors like x under the cache's `backend` argument: the
    kernels where they can run ("auto"), or a clear error where "kernels" was asked and they cannot."""
    why = kernels.unavailable_reason()
    if why is None and not x.is_cuda:
        why = "the model runs on the CPU"
    if why is None and x.dtype not in KERNEL_DTYPES:
        why = f"the kernels take float16 or bfloat16 activations, the model runs in {x.dtype}"
    if backend == "kernels" and why:
        raise TQError(f"the kernel backend cannot run here: {why}")
    use_kernels = backend != "reference" and why is None
    return (KernelBackend if use_kernels else ReferenceBackend)(layer)
