"""The rotary key mean (FORMAT.md section 1.1): the part of the key mean that turns with the position.

Keys are cached after RoPE, which turns channel pair (a, b) of a key at position p by the angle
p * freq. A model's keys carry a large mean before RoPE that hardly depends on the position; after
RoPE it turns with p, so a constant mean removes only the slowly turning pairs' share near the
positions it was measured at. The codec subtracts R(p) m for the few pairs that carry most of it,
and adds it back when decoding; attention adds q . R(p) m to the logit of position p.

Positions are the cache's packed positions (the sequence position minus the sink tokens): the
encoder and every reader use the same one, so the restoration is exact whatever RoPE positions the
model used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import TQError
from .spec import MAX_ROTARY_PAIRS  # noqa: F401  (defined in spec.py, torch-free)


@dataclass
class RotaryMean:
    """Per KV head, P rotate-half channel pairs (a, a + head_dim / 2): channels int64 [H, P] (each
    pair's a), freq [H, P] radians per position, mean [H, P, 2] (m_a, m_b) at packed position 0."""

    channels: torch.Tensor
    freq: torch.Tensor
    mean: torch.Tensor

    def __post_init__(self):
        heads, pairs = self.freq.shape
        if tuple(self.channels.shape) != (heads, pairs) or tuple(self.mean.shape) != (heads, pairs, 2):
            raise TQError(f"a rotary mean needs channels of shape [{heads}, {pairs}] and a mean of shape "
                          f"[{heads}, {pairs}, 2], got {list(self.channels.shape)} and "
                          f"{list(self.mean.shape)}")
        if pairs > MAX_ROTARY_PAIRS:
            raise TQError(f"a rotary mean has {pairs} pairs; at most {MAX_ROTARY_PAIRS} are supported")

    def vectors(self, positions: torch.Tensor, head_dim: int) -> torch.Tensor:
        """R(p) m at each position: float64 [*positions.shape, H, head_dim]."""
        angle = positions.to(torch.float64)[..., None, None] * self.freq.to(positions.device, torch.float64)
        cos, sin = angle.cos(), angle.sin()
        m = self.mean.to(positions.device, torch.float64)
        turned = torch.stack([m[..., 0] * cos - m[..., 1] * sin, m[..., 1] * cos + m[..., 0] * sin], -1)
        out = torch.zeros(*angle.shape[:-1], head_dim, dtype=torch.float64, device=positions.device)
        index = pair_channels(self.channels.to(positions.device), head_dim).expand(*angle.shape[:-1], -1)
        return out.scatter_(-1, index, turned.flatten(-2))


def pair_channels(first: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[..., P] channels a -> [..., 2P]: a_0, a_0 + d/2, a_1, a_1 + d/2, ..."""
    return torch.stack([first, first + head_dim // 2], dim=-1).flatten(-2)


def pre_rope(key: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Undo transformers' rotate-half RoPE (pairs (i, i + d/2) turned by p * inv_freq[i]):
    key [..., T, d] at positions [T] -> float64 [..., T, d]."""
    half = key.shape[-1] // 2
    angle = positions.to(torch.float64)[:, None] * inv_freq.to(key.device, torch.float64)
    cos, sin = angle.cos(), angle.sin()
    k = key.to(torch.float64)
    a, b = k[..., :half], k[..., half:]
    return torch.cat([a * cos + b * sin, b * cos - a * sin], dim=-1)


def select_pairs(pre_mean: torch.Tensor, inv_freq: torch.Tensor, pairs: int,
                 offset: int = 0) -> RotaryMean:
    """The rotary mean of the `pairs` rotate-half pairs with the largest pre-RoPE mean energy, per
    head: pre_mean [H, d] (the mean of keys with RoPE undone), stated at packed position 0, i.e.
    turned by `offset` positions (the sink tokens ahead of the packed ones)."""
    heads, d = pre_mean.shape
    half = d // 2
    energy = pre_mean[:, :half] ** 2 + pre_mean[:, half:] ** 2
    chosen = energy.topk(pairs, dim=-1).indices.sort(dim=-1).values  # [H, P]
    index = pair_channels(chosen, d)
    freq = inv_freq.to(torch.float64)[chosen]
    mean = torch.gather(pre_mean.to(torch.float64), 1, index).view(heads, pairs, 2)
    at_zero = RotaryMean(chosen, freq, mean)
    if offset == 0:
        return at_zero
    turned = at_zero.vectors(torch.tensor(offset), d)  # [H, d]
    return RotaryMean(chosen, freq, torch.gather(turned, 1, index).view(heads, pairs, 2))
