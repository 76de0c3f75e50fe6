"""The calibration table: everything the quantized cache needs for every layer of one model
(`KVTable`; its safetensors file: tables_io.py). Not to be confused with a layer table, the one
layer's blob that the TensorRT plugin's field carries (trt/plugin_fields.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.quantizer import VectorCodec
from ..core.rotary_mean import RotaryMean
from ..core.spec import CodecSpec
from .options import MAX_RECENT_TOKENS  # noqa: F401  (defined where tq-build reads it, torch-free)

CALIBRATION_FILE_VERSION = 2  # of the safetensors file's header (tables_io.py)
# a shift of 4 would mean logit noise of std ~2.8, far beyond any width the format has: a table
# that holds more is damaged
MAX_PAGE_LSE_SHIFT = 4.0
FP16_BYTES = 2
OUTLIER_INDEX_BYTES = 1


@dataclass
class LayerTable:
    """One layer's codecs. Tensors are per KV head: mean/scale [kv_heads, head_dim] float32,
    outliers [kv_heads, n_hi] int64 (fractional widths only). None means the format's default.
    page_lse_shift [heads] float32, per query head: what the runtime subtracts from the pages'
    log-sum-exp (calibration/page_mass.py); None: nothing. key_rotary_*: the keys' RotaryMean
    (channels int64 [kv_heads, P], freq float32 [kv_heads, P], mean float32 [kv_heads, P, 2]),
    all three or none."""

    key_width: float
    value_width: float
    seed: int
    key_mean: torch.Tensor | None = None
    key_scale: torch.Tensor | None = None
    key_outliers: torch.Tensor | None = None
    value_mean: torch.Tensor | None = None
    value_scale: torch.Tensor | None = None
    value_outliers: torch.Tensor | None = None
    page_lse_shift: torch.Tensor | None = None
    key_rotary_channels: torch.Tensor | None = None
    key_rotary_freq: torch.Tensor | None = None
    key_rotary_mean: torch.Tensor | None = None

    ROTARY = ("key_rotary_channels", "key_rotary_freq", "key_rotary_mean")
    TENSORS = ("key_mean", "key_scale", "key_outliers", "value_mean", "value_scale", "value_outliers",
               "page_lse_shift") + ROTARY

    @property
    def key_rotary(self) -> RotaryMean | None:
        if self.key_rotary_freq is None:
            return None
        return RotaryMean(self.key_rotary_channels, self.key_rotary_freq, self.key_rotary_mean)

    @key_rotary.setter
    def key_rotary(self, rotary: RotaryMean | None) -> None:
        parts = (None,) * 3 if rotary is None else (
            rotary.channels.long(), rotary.freq.float(), rotary.mean.float())
        for name, t in zip(self.ROTARY, parts):
            setattr(self, name, t)

    def codecs(self, head_dim: int) -> tuple[VectorCodec, VectorCodec]:
        key = VectorCodec(CodecSpec(head_dim, self.key_width), seed=self.seed, mean=self.key_mean,
                          scale=self.key_scale, outliers=self.key_outliers, rotary=self.key_rotary)
        value = VectorCodec(CodecSpec(head_dim, self.value_width), seed=self.seed,
                            mean=self.value_mean, scale=self.value_scale, outliers=self.value_outliers)
        return key, value


@dataclass
class KVTable:
    fingerprint: dict
    layers: list[LayerTable]
    sink_tokens: int = 0  # the first tokens of every sequence, kept exact in fp16
    kv_bits: str = "3"  # the budget as asked for (parse_kv_bits syntax)
    calibration: dict = field(default_factory=dict)  # how it was made: data, options
    # each query reads its recent_tokens most recent positions (its own included) exact: the
    # last recent_tokens - 1 are kept in fp16 beside the pages, which hold every token too
    recent_tokens: int = 1

    @property
    def head_dim(self) -> int:
        return int(self.fingerprint["head_dim"])

    @property
    def kv_heads(self) -> int:
        return int(self.fingerprint["kv_heads"])

    def codecs(self, layer: int) -> tuple[VectorCodec, VectorCodec]:
        return self.layers[layer].codecs(self.head_dim)

    def average_widths(self) -> tuple[float, float]:
        n = len(self.layers)
        return (sum(t.key_width for t in self.layers) / n, sum(t.value_width for t in self.layers) / n)

    def side_bytes(self) -> int:
        """Bytes stored beside the pages: means, scales, shifts and rotary frequencies at fp32,
        outlier and rotary channel indices at one byte each (head_dim <= 256); counted once per
        sequence, as a conservative bound."""
        total = 0
        for layer in self.layers:
            for name in LayerTable.TENSORS:
                t = getattr(layer, name)
                if t is not None:
                    total += t.numel() * (OUTLIER_INDEX_BYTES if name.endswith(("outliers", "channels"))
                                          else 4)
        return total

    def layer_cache_bytes(self, layer: int, tokens: int) -> int:
        """Bytes of one layer's cache for a `tokens`-long sequence, all KV heads: pages, exact sinks
        and the kept recent window."""
        t = self.layers[layer]
        sinks = min(tokens, self.sink_tokens)
        window = min(tokens - sinks, self.recent_tokens - 1)
        per_token = (CodecSpec(self.head_dim, t.key_width).bytes_per_token
                     + CodecSpec(self.head_dim, t.value_width).bytes_per_token)
        return self.kv_heads * ((tokens - sinks) * per_token + (sinks + window) * self.fp16_token_bytes())

    def fp16_token_bytes(self) -> int:
        """One token's K and V of one layer and KV head in an fp16 cache."""
        return 2 * self.head_dim * FP16_BYTES

    def cache_bytes(self, tokens: int) -> int:
        """Bytes of a `tokens`-long sequence's cache, all layers and KV heads."""
        return sum(self.layer_cache_bytes(i, tokens) for i in range(len(self.layers)))

    def effective_bits(self, tokens: int) -> float:
        """Stored bits per cached coordinate over a `tokens`-long sequence, side bytes included."""
        coords = tokens * len(self.layers) * 2 * self.kv_heads * self.head_dim
        return (self.cache_bytes(tokens) + self.side_bytes()) * 8 / coords


def oblivious_table(fingerprint: dict, key_width: float, value_width: float, seed: int = 0,
                    kv_bits: str | None = None) -> KVTable:
    """Plain TurboQuant: no calibration data, the same widths in every layer, the format's defaults."""
    layers = [LayerTable(key_width, value_width, seed + i) for i in range(fingerprint["layers"])]
    return KVTable(fingerprint, layers, 0, kv_bits or f"k{key_width:g}v{value_width:g}",
                   {"mode": "data-oblivious"})
