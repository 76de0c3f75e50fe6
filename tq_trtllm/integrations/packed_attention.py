"""Attention that reads a TurboQuantLayer in place: the packed tokens through the kernel library
(CUDA) or the Python reference (CPU), the layer's exact rows (the kept recent window and the step's
own rows, as computed) and the exact sink tokens densely, merged by log-sum-exp, the pages'
log-sum-exp first lowered by the table's page_lse_shift (calibration/page_mass.py).

Query row j of a step of T new tokens sits at position `length - T + j` and sees every position up
to its own (bottom-right causal). Rows at positions below the sink count see sinks only; every
other row sees all sinks, its `layer.exact_recent` most recent positions through their rows as
computed (`layer.exact`) and the older packed tokens through the pages (`layer.packed_end`). Under
chunk_reads "cache" that is each row's own recent window, and the kernels' `kv_len - q_len + j` rule
gives the pages' part directly with kv_len = packed_end, because packed position i is sequence
position sinks + i. Under "exact" every row of a step reads the same pages, 0 .. packed_end - 1; the
kernels then take the rows as sequences of one token each over the same block table.
`dense_attention` applies the same rules to a dense cache (padded batches, the evaluation's
reference caches).
"""

from __future__ import annotations

import torch

from ..core.attention import bottom_right_causal, masked_attention, recent_band
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
                    exact: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None,
                    scaling: float, recent: int = 1, bias: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """query [B, Hq, T, d] of the last T positions of a dense cache key, value [B, Hkv, S, d];
    exact = the last n positions' (k, v) [B, Hkv, n, d] as computed, read for each row's `recent`
    most recent positions; under transformers' mask (any: padded batches too); bias as
    masked_attention's. -> [B, T, Hq, d] in query's dtype."""
    allowed = mask_allows(mask, query.shape[2], key.shape[2], query.device)
    out, _ = masked_attention(query, key, value, scaling, allowed, exact, recent, bias)
    return out.transpose(1, 2).to(query.dtype)


def _packed_kernels(layer, q: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels over the layer's pages (see the module's doc for which positions each row
    reads): q [B, Hq, T, d] -> (output, lse) as dense_part's, the lse lowered by the layer's shift
    (the kernel cache carries it)."""
    b, hq, t, d = q.shape
    end, kc, rows = layer.packed_end, layer.kernel_cache(), q.transpose(1, 2).contiguous()
    if layer.chunk_reads == "exact" and t > 1:
        if end == 0:  # nothing older than the step's rows: no launch
            return q.new_zeros(q.shape, dtype=torch.float32), q.new_full((b, hq, t), float("-inf"),
                                                                         dtype=torch.float32)
        # every row sees the same pages: one-token sequences over copies of its block table row
        kc = kc.over(layer.block_table.repeat_interleave(t, dim=0))
        rows = rows.view(b * t, 1, hq, d)
    lse = torch.empty(*rows.shape[:3], dtype=torch.float32, device=q.device)
    lens = torch.full((rows.shape[0],), end, dtype=torch.int32, device=q.device)
    attention = ops.decode_attention if rows.shape[1] <= ops.MAX_DECODE_Q_LEN else ops.prefill_attention
    out = attention(kc, rows, lens, end, scaling, lse=lse)
    return out.view(b, t, hq, d).transpose(1, 2).float(), lse.view(b, t, hq).transpose(1, 2)


def _packed_reference(layer, q: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """_packed_kernels through the Python reference."""
    end = layer.packed_end
    k, v = (x[:, :, :end] for x in layer.read_packed())
    # "exact": every row sees all `end` positions; "cache": row j up to end - T + j
    first = end if layer.chunk_reads == "exact" else end - q.shape[2]
    out, lse = dense_part(q, k, v, scaling, first)
    if layer.page_lse_shift is not None:
        lse = lse - layer.page_lse_shift[:, None]
    return out, lse


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
        packed = _packed_kernels if layer.uses_kernels else _packed_reference
        parts = [packed(layer, late, scaling), _recent(layer, late, scaling)]
        if sinks:
            parts.append(dense_part(late, sk, sv, scaling, sinks))
        outs.append(merge(parts))
    return torch.cat(outs, dim=2).transpose(1, 2).to(query.dtype)
