"""Channel statistics of queries, keys and values, per layer and KV head, and the codec parameters
they imply.

Queries and keys are cached after RoPE, which turns each rotate-half channel pair (a, a + d/2) by
an angle that grows with the position. Their statistics are therefore summed with RoPE undone (the
model's own inverse frequencies), as each pair's first and second moments; the post-RoPE statistics
the codec needs follow for any range of positions by turning those moments (`context`: positions 0
to context - 1, each weighted alike). Measured post-RoPE on the calibration windows alone, a
per-channel scale and mean fit the windows' few hundred positions and lose their use where slowly
turning pairs have turned further (docs/QUALITY.md#statistics-context).

Per-channel key scale. Quantizing z = (k - mean) / s adds an error that the rotation spreads evenly
over channels, so the logit error q . (s * e) has variance proportional to
sum_c E[z_c^2] * sum_c E[q_c^2] s_c^2 = sum_c E[k'_c^2] / s_c^2 * sum_c E[q_c^2] s_c^2 (k' = k - mean).
By Cauchy-Schwarz this is smallest at s_c = (E[k'_c^2] / E[q_c^2])^(1/4); the scale folds into the
query at attention time (q . k = (q * s) . (k / s)), so logits are unchanged in exact arithmetic.
One scale serves every position, but RoPE turns slowly rotating pairs on: on SmolLM2-135M, the scale
fitted to positions 0-2,047 leaves the logit error of 8,000-token prompts 30% above that length's
optimum (docs/QUALITY.md#key-scale-balanced-over-lengths). Balanced over prompt lengths L, the scale
minimizes sum_L log E_L(s), E_L the error above with keys at positions 0 .. L - 1 and queries at the
last quarter of them: each length's error relative to its own optimum counts alike. That sum is
convex in log s, and its stationary point solves s_c^4 = sum_L (K_Lc / A_L) / sum_L (Q_Lc / B_L),
A_L = sum_c K_Lc / s_c^2, B_L = sum_c Q_Lc s_c^2, which is iterated to its fixed point; with one
length it is the closed form above.
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

from dataclasses import dataclass, replace
from functools import cached_property

import torch

from ..core.rotary_mean import pre_rope

SCALE_FLOOR = 1e-6
BALANCE_ITERATIONS = 500  # fixed-point steps of the length-balanced key scale (converges in ~50)
BALANCE_TOLERANCE = 1e-9  # largest relative change of a channel's scale that ends the iteration


@dataclass
class ChannelStats:
    """Running sums for one layer, float64. Keys and queries with RoPE undone: k_sum [H, d], and
    per rotate-half pair (a, a + d/2) the sums of a^2, b^2 and a b, k_pairs and q_pairs [H, d/2, 3]
    (q_pairs averaged over the query heads of each KV head's group). Values (no RoPE): v_sum, v_sq
    [H, d]. inv_freq [d/2]: RoPE's angle per position of each pair; context: the positions the
    post-RoPE statistics stand for."""

    inv_freq: torch.Tensor
    context: int
    k_sum: torch.Tensor
    k_pairs: torch.Tensor
    q_pairs: torch.Tensor
    v_sum: torch.Tensor
    v_sq: torch.Tensor
    tokens: int = 0
    value_weight: torch.Tensor | None = None  # w_c of output_weights, a model constant

    @classmethod
    def zeros(cls, kv_heads: int, head_dim: int, inv_freq: torch.Tensor, context: int,
              value_weight: torch.Tensor | None = None) -> "ChannelStats":
        z = lambda *shape: torch.zeros(kv_heads, *shape, dtype=torch.float64)  # noqa: E731
        return cls(inv_freq.to(torch.float64), context, z(head_dim), z(head_dim // 2, 3),
                   z(head_dim // 2, 3), z(head_dim), z(head_dim), value_weight=value_weight)

    def add(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, skip: int) -> None:
        """query [B, Hq, T, d], key/value [B, Hkv, T, d] after RoPE at positions 0 .. T - 1; the
        first `skip` positions are left out (attention sinks, kept exact, would dominate the means)."""
        positions = torch.arange(skip, key.shape[2], device=key.device)
        q, k = (pre_rope(x.detach()[:, :, skip:], positions, self.inv_freq) for x in (query, key))
        v = value.detach()[:, :, skip:].to(torch.float64)
        hkv = k.shape[1]
        q = q.reshape(q.shape[0], hkv, -1, *q.shape[2:])  # [B, Hkv, group, T, d]
        self.k_sum += k.sum(dim=(0, 2)).cpu()
        self.k_pairs += _pair_products(k).sum(dim=(0, 2)).cpu()
        self.q_pairs += _pair_products(q).sum(dim=(0, 2, 3)).cpu() / q.shape[2]
        self.v_sum += v.sum(dim=(0, 2)).cpu()
        self.v_sq += (v * v).sum(dim=(0, 2)).cpu()
        self.tokens += k.shape[0] * k.shape[2]

    def less(self, pre_mean: torch.Tensor) -> "ChannelStats":
        """The statistics of the keys less a constant vector in RoPE's frame at position 0,
        pre_mean [H, d] (a rotary key mean, which turns with the position after RoPE)."""
        mean = self.pre_rope_key_mean
        half = mean.shape[-1] // 2
        m_a, m_b, x_a, x_b = pre_mean[:, :half], pre_mean[:, half:], mean[:, :half], mean[:, half:]
        # E[(a - m_a)(b - m_b)] = E[ab] - m_a E[b] - m_b E[a] + m_a m_b, and so on
        shift = torch.stack([m_a * m_a - 2 * m_a * x_a, m_b * m_b - 2 * m_b * x_b,
                             m_a * m_b - m_a * x_b - m_b * x_a], dim=-1)
        return replace(self, k_sum=self.k_sum - pre_mean * self.tokens,
                       k_pairs=self.k_pairs + shift * self.tokens)

    @property
    def pre_rope_key_mean(self) -> torch.Tensor:
        """The keys' mean with RoPE undone, [H, d]."""
        return self.k_sum / self.tokens

    @property
    def key_mean(self) -> torch.Tensor:
        """The post-RoPE key mean over the context's positions."""
        return self._turned_mean(self._turn_averages)

    def _turned_mean(self, averages: tuple[torch.Tensor, ...]) -> torch.Tensor:
        mean = self.pre_rope_key_mean
        half = mean.shape[-1] // 2
        cos, sin = averages[:2]
        a, b = mean[:, :half], mean[:, half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    @property
    def value_mean(self) -> torch.Tensor:
        return self.v_sum / self.tokens

    def key_power(self, centred: bool, averages: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """E[k'_c^2] over the context's positions (or those of turn_averages `averages`),
        k' = k less its mean over the same positions when centred, else k."""
        averages = self._turn_averages if averages is None else averages
        power = self._turned_power(self.k_pairs / self.tokens, averages)
        return power - self._turned_mean(averages)**2 if centred else power

    @property
    def query_power(self) -> torch.Tensor:
        """E[q_c^2] over the context's positions."""
        return self._query_power(self._turn_averages)

    def _query_power(self, averages: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self._turned_power(self.q_pairs / self.tokens, averages)

    def value_power(self, centred: bool) -> torch.Tensor:
        power = self.v_sq / self.tokens
        return power - self.value_mean**2 if centred else power

    def key_scale(self, centred: bool, lengths: tuple[int, ...] = ()) -> torch.Tensor:
        """s_c = (E[k'_c^2] / E[q_c^2])^(1/4) over the context, or balanced over prompt `lengths`;
        normalized to geometric mean 1 per head."""
        if not lengths:
            return _balanced_scale(self.key_power(centred), self.query_power)
        keys = torch.stack([self.key_power(centred, turn_averages(self.inv_freq, 0, n)) for n in lengths])
        queries = torch.stack([self._query_power(turn_averages(self.inv_freq, n - n // 4, n))
                               for n in lengths])
        return _length_balanced_scale(keys.clamp_min(SCALE_FLOOR), queries.clamp_min(SCALE_FLOOR))

    def value_scale(self, centred: bool) -> torch.Tensor:
        """s_c = (E[v'_c^2] / w_c)^(1/4), normalized to geometric mean 1 per head."""
        return _balanced_scale(self.value_power(centred), self.value_weight)

    def key_outliers(self, n_hi: int, centred: bool) -> torch.Tensor:
        return _largest((self.key_power(centred).clamp_min(0) * self.query_power).sqrt(), n_hi)

    def value_outliers(self, n_hi: int, centred: bool, scaled: bool) -> torch.Tensor:
        power = self.value_power(centred).clamp_min(0)
        return _largest((power * self.value_weight).sqrt() if scaled else power, n_hi)

    @cached_property
    def _turn_averages(self) -> tuple[torch.Tensor, ...]:
        """The turn averages of the context's positions: constants of inv_freq and context, which
        never change, so computed once however many tables the calibration builds from these
        statistics."""
        return turn_averages(self.inv_freq, 0, self.context)

    @staticmethod
    def _turned_power(pairs: torch.Tensor, averages: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Per channel, the mean square after RoPE over the positions of `averages`, from the
        pairs' second moments [H, d/2, 3] with RoPE undone: a' = a cos - b sin, b' = b cos + a sin."""
        cc, ss, cs = averages[2:]
        aa, bb, ab = pairs.unbind(dim=-1)
        return torch.cat([aa * cc + bb * ss - 2 * ab * cs, bb * cc + aa * ss + 2 * ab * cs], dim=-1)


def turn_averages(inv_freq: torch.Tensor, first: int, end: int) -> tuple[torch.Tensor, ...]:
    """The means over positions first .. end - 1 of cos, sin, cos^2, sin^2 and cos sin of every
    pair's angle, [d/2] each."""
    angle = torch.arange(first, end, dtype=torch.float64)[:, None] * inv_freq
    cos, sin = angle.cos(), angle.sin()
    return tuple(t.mean(dim=0) for t in (cos, sin, cos * cos, sin * sin, cos * sin))


def _pair_products(x: torch.Tensor) -> torch.Tensor:
    """[..., d] -> [..., d/2, 3]: a^2, b^2, a b of each rotate-half pair (a, a + d/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.stack([a * a, b * b, a * b], dim=-1)


def _balanced_scale(power: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(power / weight)^(1/4) per channel, normalized to geometric mean 1 per head."""
    s = (power.clamp_min(SCALE_FLOOR) / weight.clamp_min(SCALE_FLOOR)) ** 0.25
    return s / s.log().mean(dim=-1, keepdim=True).exp()


def _length_balanced_scale(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """The scale minimizing sum_L log E_L(s) (module docstring), by its fixed point, from the key
    and query powers of each length, [L, H, d] each; geometric mean 1 per head."""
    s = torch.ones_like(keys[0])
    for _ in range(BALANCE_ITERATIONS):
        a = (keys / s**2).sum(dim=-1, keepdim=True)
        b = (queries * s**2).sum(dim=-1, keepdim=True)
        new = ((keys / a).sum(dim=0) / (queries / b).sum(dim=0)) ** 0.25
        new = new / new.log().mean(dim=-1, keepdim=True).exp()
        done = ((new - s).abs() / s).max() < BALANCE_TOLERANCE
        s = new
        if done:
            break
    return s


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
