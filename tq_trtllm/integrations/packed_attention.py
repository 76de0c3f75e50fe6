"""Attention that reads a TurboQuantLayer in place: the packed tokens through the layer's backend
(integrations.backends: the kernel library or the Python reference), the layer's exact rows (the
kept recent window and the step's own rows, as computed) and the exact sink tokens densely, merged
by log-sum-exp, the pages' log-sum-exp first lowered by the table's page_lse_shift
(calibration/page_mass.py).

Query row j of a step of T new tokens sits at position `length - T + j` and sees every position up
to its own (bottom-right causal). Rows at positions below the sink count see sinks only; every
other row sees all sinks, its `layer.exact_recent` most recent positions through their rows as
computed (`layer.exact`) and the older packed tokens through the pages (`layer.packed_end`). Under
chunk_reads "cache" that is each row's own recent window, and the kernels' `kv_len - q_len + j` rule
gives the pages' part directly with kv_len = packed_end, because packed position i is sequence
position sinks + i. Under "exact" every row of a step reads the same pages, 0 .. packed_end - 1; the
kernels then take the rows as sequences of one token each over the same block table.
`dense_attention` (core.attention) applies the same rules to a dense cache (padded batches, the
evaluation's reference caches).
"""

from __future__ import annotations

import torch

from ..core.attention import (
    bottom_right_causal,
    dense_attention,
    mask_allows,
    masked_attention,
    recent_band,
)


def is_bottom_right_causal(mask: torch.Tensor | None, q_len: int, kv_len: int) -> bool:
    """Whether transformers' mask is the plain causal mask for T new tokens at the end (no padding):
    None (sdpa's "is_causal" shortcut, taken only where it means the same) or a bool/additive
    [B, 1, T, S] tensor equal to it."""
    if mask is None:
        return True
    if mask.dim() != 4 or mask.shape[-2:] != (q_len, kv_len):
        return False
    allowed = mask_allows(mask, q_len, kv_len, mask.device)
    return bool(torch.equal(allowed, bottom_right_causal(q_len, kv_len, mask.device).expand_as(allowed)))


def dense_part(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float,
               first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q [B, Hq, T, d] over k, v [B, Hkv, S, d] where row j sees keys
    0 .. first + j, in float32: (normalized output [B, Hq, T, d], lse [B, Hq, T])."""
    t, n = q.shape[2], k.shape[2]
    allowed = torch.arange(n, device=q.device) <= first + torch.arange(t, device=q.device)[:, None]
    return masked_attention(q, k, v, scaling, allowed)


def merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Combine normalized partial attentions over disjoint key sets by their log-sum-exps."""
    lse = torch.stack([p[1] for p in parts])
    weights = torch.softmax(lse, dim=0).nan_to_num(0.0)  # a row with no key anywhere gets 0
    return sum(w[..., None] * o for w, (o, _) in zip(weights, parts))


def _recent(layer, q: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's exact_recent most recent packed positions, from their rows as computed."""
    k, v = layer.exact
    band = recent_band(q.shape[2], k.shape[2], layer.exact_recent, q.device)
    return masked_attention(q, k, v, scaling, band)


def attend(layer, query: torch.Tensor, scaling: float) -> torch.Tensor:
    """query [B, Hq, T, d] of the layer's last T tokens -> attention output [B, T, Hq, d]."""
    t = query.shape[2]
    sinks = layer.sink_count
    early = min(t, max(0, sinks - (layer.length - t)))  # rows whose position is a sink's
    sk, sv = layer.sinks
    outs = []
    if early:
        o, _ = dense_part(query[:, :, :early], sk, sv, scaling, layer.length - t)
        outs.append(o)
    if early < t:
        late = query[:, :, early:]
        parts = [layer.pages_backend.attend(late, scaling), _recent(layer, late, scaling)]
        if sinks:
            parts.append(dense_part(late, sk, sv, scaling, sinks))
        outs.append(merge(parts))
    return torch.cat(outs, dim=2).transpose(1, 2).to(query.dtype)


def layer_attention(layer, query: torch.Tensor, mask: torch.Tensor | None,
                    scaling: float) -> torch.Tensor:
    """The registered attention function's call over a layer (TurboQuantLayer.attention): the
    packed tokens read in place under the plain causal mask, else (a padded batch) the cache read
    back densely under the same rule. -> [B, T, Hq, d] in query's dtype."""
    if is_bottom_right_causal(mask, query.shape[2], layer.length):
        return attend(layer, query, scaling)
    key, value = layer.read_dense()
    return dense_attention(query, key, value, layer.exact, mask, scaling, layer.exact_recent,
                           layer.packed_logit_bias())
