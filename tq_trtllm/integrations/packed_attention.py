"""Attention that reads a TurboQuantLayer in place: the packed tokens through the kernel library
(CUDA) or the Python reference (CPU), the exact sink tokens densely, merged by log-sum-exp.

Query row j of a chunk of T new tokens sits at position `length - T + j` and sees every position up
to its own (bottom-right causal). Rows at positions below the sink count see sinks only; every
other row sees all sinks, the packed tokens before its own position and its own key and value
exactly (the kernels' k_new/v_new rule), which the kernels' `kv_len - q_len + j` rule gives
directly because packed position i is sequence position sinks + i. `dense_attention` applies the
same rule to a dense cache (padded batches, the evaluation's reference caches).
"""

from __future__ import annotations

import torch

from ..core.attention import bottom_right_causal, masked_attention
from ..kernels import ops


def mask_allows(mask: torch.Tensor | None, q_len: int, kv_len: int, device) -> torch.Tensor:
    """transformers' mask (None: plain causal; bool or additive [B, 1, T, S]) as a bool tensor."""
    if mask is None:
        return bottom_right_causal(q_len, kv_len, device)
    return mask if mask.dtype == torch.bool else mask == 0


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


def dense_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    own: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None,
                    scaling: float) -> torch.Tensor:
    """query [B, Hq, T, d] of the last T positions of a dense cache key, value [B, Hkv, S, d],
    own = those T tokens' exact (k, v) [B, Hkv, T, d], under transformers' mask (any: padded
    batches too). -> [B, T, Hq, d] in query's dtype."""
    allowed = mask_allows(mask, query.shape[2], key.shape[2], query.device)
    out, _ = masked_attention(query, key, value, scaling, allowed, own)
    return out.transpose(1, 2).to(query.dtype)


def _packed_kernels(layer, q: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels over the layer's pages and the step's own rows: q [B, Hq, T, d] -> (output,
    lse) as dense_part's."""
    b, hq, t, _ = q.shape
    rows = q.transpose(1, 2).contiguous()
    lse = torch.empty(b, t, hq, dtype=torch.float32, device=q.device)
    lens = torch.full((b,), layer.packed_length, dtype=torch.int32, device=q.device)
    own, append = layer.new_rows()  # append: the rows are still to be written (update held them back)
    own = tuple(x.transpose(1, 2) for x in own)
    if t <= ops.MAX_DECODE_Q_LEN:
        out = ops.decode_attention(layer.kernel_cache(), rows, lens, layer.packed_length, scaling,
                                   lse=lse, own=own, append=append)
    else:
        out = ops.prefill_attention(layer.kernel_cache(), rows, lens, layer.packed_length, scaling,
                                    lse=lse, own=own)
    return out.transpose(1, 2).float(), lse.transpose(1, 2)


def _packed_reference(layer, q: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = layer.read_packed()
    own, _ = layer.new_rows()
    allowed = bottom_right_causal(q.shape[2], layer.packed_length, q.device)
    return masked_attention(q, k, v, scaling, allowed, own)


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
        packed = _packed_kernels if layer.uses_kernels else _packed_reference
        parts = [packed(layer, late, scaling)]
        if sinks:
            parts.append(dense_part(late, sk, sv, scaling, sinks))
        outs.append(merge(parts))
    return torch.cat(outs, dim=2).transpose(1, 2).to(query.dtype)
