"""Channel statistics of post-RoPE queries, keys and values, per layer and KV head, and the codec
parameters they imply.

Per-channel key scale. Quantizing z = (k - mean) / s adds an error that the rotation spreads evenly
over channels, so the logit error q . (s * e) has variance proportional to
sum_c E[z_c^2] * sum_c E[q_c^2] s_c^2 = sum_c E[k'_c^2] / s_c^2 * sum_c E[q_c^2] s_c^2 (k' = k - mean).
By Cauchy-Schwarz this is smallest at s_c = (E[k'_c^2] / E[q_c^2])^(1/4); the scale folds into the
query at attention time (q . k = (q * s) . (k / s)), so logits are unchanged in exact arithmetic.
Outlier channels of a fractional key width are those with the largest sqrt(E[k'_c^2] E[q_c^2]), the
channel's share of the logit error after scaling.

Per-channel value scale. The same argument with the output projection in place of the query: a value
error e of a KV head reaches the layer's output through the o_proj columns of the group's query
heads, with expected squared norm sum_c w_c E[e_c^2] (output_weights), so s_c = (E[v'_c^2] / w_c)^(1/4)
and the outliers of a value width are the largest sqrt(E[v'_c^2] w_c); without the value scale,
the largest E[v'_c^2]. The decoder multiplies the scale back in: outputs are unchanged in exact
arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.rotary_mean import RotaryMean

SCALE_FLOOR = 1e-6


@dataclass
class ChannelStats:
    """Running sums for one layer: tensors are [kv_heads, head_dim] float64."""

    k_sum: torch.Tensor
    k_sq: torch.Tensor
    v_sum: torch.Tensor
    v_sq: torch.Tensor
    q_sq: torch.Tensor  # summed over the query heads of each KV head's group
    tokens: int = 0
    value_weight: torch.Tensor | None = None  # w_c of output_weights, a model constant

    @classmethod
    def zeros(cls, kv_heads: int, head_dim: int,
              value_weight: torch.Tensor | None = None) -> "ChannelStats":
        z = lambda: torch.zeros(kv_heads, head_dim, dtype=torch.float64)  # noqa: E731
        return cls(z(), z(), z(), z(), z(), value_weight=value_weight)

    def add(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, skip: int,
            rotary: RotaryMean | None = None) -> None:
        """query [B, Hq, T, d], key/value [B, Hkv, T, d]; the first `skip` positions are left out
        (attention sinks, kept exact, would dominate the means). With `rotary`, the statistics are
        those of the keys less their rotary mean (what the codec quantizes)."""
        if rotary is not None:
            packed = torch.arange(key.shape[2], device=key.device) - skip
            key = key.to(torch.float64) - rotary.vectors(packed, key.shape[-1]).transpose(0, 1)
        q, k, v = (x[:, :, skip:].detach().to(torch.float64) for x in (query, key, value))
        hkv = k.shape[1]
        q = q.reshape(q.shape[0], hkv, -1, *q.shape[2:])  # [B, Hkv, group, T, d]
        self.k_sum += k.sum(dim=(0, 2))
        self.k_sq += (k * k).sum(dim=(0, 2))
        self.v_sum += v.sum(dim=(0, 2))
        self.v_sq += (v * v).sum(dim=(0, 2))
        self.q_sq += (q * q).sum(dim=(0, 2, 3)) / q.shape[2]
        self.tokens += k.shape[0] * k.shape[2]

    @property
    def key_mean(self) -> torch.Tensor:
        return self.k_sum / self.tokens

    @property
    def value_mean(self) -> torch.Tensor:
        return self.v_sum / self.tokens

    def key_power(self, centred: bool) -> torch.Tensor:
        """E[k'_c^2] with k' = k - mean when centred, else E[k_c^2]."""
        power = self.k_sq / self.tokens
        return power - self.key_mean**2 if centred else power

    def value_power(self, centred: bool) -> torch.Tensor:
        power = self.v_sq / self.tokens
        return power - self.value_mean**2 if centred else power

    def key_scale(self, centred: bool) -> torch.Tensor:
        """s_c = (E[k'_c^2] / E[q_c^2])^(1/4), normalized to geometric mean 1 per head."""
        return _balanced_scale(self.key_power(centred), self.q_sq / self.tokens)

    def value_scale(self, centred: bool) -> torch.Tensor:
        """s_c = (E[v'_c^2] / w_c)^(1/4), normalized to geometric mean 1 per head."""
        return _balanced_scale(self.value_power(centred), self.value_weight)

    def key_outliers(self, n_hi: int, centred: bool) -> torch.Tensor:
        return _largest((self.key_power(centred).clamp_min(0) * self.q_sq).sqrt(), n_hi)

    def value_outliers(self, n_hi: int, centred: bool, scaled: bool) -> torch.Tensor:
        power = self.value_power(centred).clamp_min(0)
        return _largest((power * self.value_weight).sqrt() if scaled else power, n_hi)


def _balanced_scale(power: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(power / weight)^(1/4) per channel, normalized to geometric mean 1 per head."""
    s = (power.clamp_min(SCALE_FLOOR) / weight.clamp_min(SCALE_FLOOR)) ** 0.25
    return s / s.log().mean(dim=-1, keepdim=True).exp()


def _largest(share: torch.Tensor, n: int) -> torch.Tensor:
    """The n channels of largest share per head, ascending."""
    return share.topk(n, dim=-1).indices.sort(dim=-1).values


def output_weights(o_proj: torch.Tensor, kv_heads: int, head_dim: int) -> torch.Tensor:
    """w_c per KV head [kv_heads, head_dim] float64: the sum, over the query heads hq of the head's
    group, of ||W_o[:, hq * head_dim + c]||^2, W_o [hidden, q_heads * head_dim] the attention
    output projection. Every query head of the group reads the same values; the rotation leaves
    the channels' errors uncorrelated, so the squared output error is sum_c w_c E[e_c^2]
    (correlations between the query heads' attention outputs left out)."""
    column = o_proj.detach().to(torch.float64).square().sum(dim=0)
    return column.view(kv_heads, -1, head_dim).sum(dim=1)
