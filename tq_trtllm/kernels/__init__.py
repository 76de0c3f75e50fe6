"""The CUDA kernel library (libtq_kernels.so) from Python, through ctypes.

Importing this package never needs a GPU: the library loads on the first call (see _lib.py for
where it is searched). available() says whether the kernels can run here.
"""

from __future__ import annotations

from ._lib import find_library, library
from .ops import (
    KernelCache,
    attention,
    attention_plan,
    decode_attention,
    dequantize,
    page_bytes,
    prefill_attention,
    quantize_append,
    workspace_bytes,
)


def unavailable_reason() -> str | None:
    """None when the kernels can run here, else why not (for pytest skips and CLI messages)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    if find_library() is None:
        return "libtq_kernels.so is not built (build_scripts/build_kernels.sh or TQ_KERNELS_LIB)"
    return None


def available() -> bool:
    return unavailable_reason() is None


__all__ = [
    "KernelCache", "attention", "attention_plan", "available", "decode_attention", "dequantize",
    "library", "page_bytes", "prefill_attention", "quantize_append", "unavailable_reason",
    "workspace_bytes",
]
