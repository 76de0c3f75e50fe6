"""Reference caches to compare TurboQuant with, for evaluation only: each stores dense K/V after
a quantize-dequantize roundtrip of every token as it is written, with the packed cache's attention
rule: a token attends to every earlier position through the cache and to its own key and value
exactly, and with chunk_reads "exact" to every earlier position of its own step too, as
TurboQuantCache does (the step's rows travel with the keys as `tq_exact`; integrations.attention
applies the rule).

  fp16      the baseline every delta is measured against
  fp8       float8 e4m3 with one scale per tensor (each layer's K or V of the sequence)
  kivi3/4   uniform asymmetric quantization per token and head (fp16 scale and zero point)
  mse3/4    TurboQuant-MSE exactly as in the paper (stored gain = the norm, no calibration)
  prod3/4   TurboQuant-prod: (b-1)-bit TurboQuant-MSE + 1-bit QJL residual (paper, Alg. 2)
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ..core.errors import TQError
from ..core.quantizer import ProdCodec, VectorCodec
from ..core.spec import CodecSpec
from ..integrations.cache import check_chunk_reads

FP8_MAX = 448.0  # largest finite float8 e4m3fn value


def fp16_roundtrip(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(x.dtype)


def fp8_roundtrip(x: torch.Tensor) -> torch.Tensor:
    scale = (x.abs().amax() / FP8_MAX).clamp_min(1e-12)
    return ((x / scale).to(torch.float8_e4m3fn).to(x.dtype) * scale)


def uniform_roundtrip(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-token, per-head min-max uniform quantization over head_dim; fp16 scale and minimum."""
    lo = x.amin(dim=-1, keepdim=True).to(torch.float16).to(x.dtype)
    step = ((x.amax(dim=-1, keepdim=True) - lo) / (2**bits - 1)).to(torch.float16).to(x.dtype)
    step = step.clamp_min(1e-8)
    return (torch.round((x - lo) / step).clamp(0, 2**bits - 1) * step + lo)


def _paper_mse(bits: int, head_dim: int):
    return VectorCodec(CodecSpec(head_dim, bits), seed=0, gain="norm").roundtrip


def _prod(bits: int, head_dim: int):
    codec = ProdCodec(head_dim, bits, seed=0)
    return codec.roundtrip


# name -> (factory of a roundtrip function given head_dim, effective bits per coordinate at d)
BASELINES = {
    "fp16": (lambda d: fp16_roundtrip, lambda d: 16.0),
    "fp8": (lambda d: fp8_roundtrip, lambda d: 8.0),
    "kivi3": (lambda d: (lambda x: uniform_roundtrip(x, 3)), lambda d: 3 + 32 / d),
    "kivi4": (lambda d: (lambda x: uniform_roundtrip(x, 4)), lambda d: 4 + 32 / d),
    "mse3": (lambda d: _paper_mse(3, d), lambda d: 3 + 16 / d),
    "mse4": (lambda d: _paper_mse(4, d), lambda d: 4 + 16 / d),
    "prod3": (lambda d: _prod(3, d), lambda d: 3 + 32 / d),
    "prod4": (lambda d: _prod(4, d), lambda d: 4 + 32 / d),
}


def check_baseline(name: str) -> None:
    if name not in BASELINES:
        raise TQError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")


class RoundtripLayer(DynamicLayer):
    def __init__(self, roundtrip, chunk_reads: str):
        super().__init__()
        self.roundtrip = roundtrip
        self.chunk_reads = chunk_reads

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = super().update(self.roundtrip(key_states), self.roundtrip(value_states),
                                      *args, **kwargs)
        steps = key_states.shape[2]
        keys.tq_exact = (key_states, value_states, steps if self.chunk_reads == "exact" else 1)
        return keys, values


class RoundtripCache(Cache):
    def __init__(self, name: str, num_layers: int, head_dim: int, chunk_reads: str = "exact"):
        check_baseline(name)
        check_chunk_reads(chunk_reads)
        make = BASELINES[name][0]
        super().__init__(layers=[RoundtripLayer(make(head_dim), chunk_reads) for _ in range(num_layers)])


def baseline_effective_bits(name: str, head_dim: int) -> float:
    check_baseline(name)
    return BASELINES[name][1](head_dim)
