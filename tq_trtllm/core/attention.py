"""fp32 attention over a dequantized cache: what every attention kernel is compared with, and the
dense paths of the runtime. One rule throughout: a query attends to the positions its mask allows,
and to its most recent ones (with the kernels' k_new/v_new: the call's positions up to its own)
through their keys and values as computed, exactly, rather than through the cache."""

from __future__ import annotations

import torch


def recent_band(q_len: int, kv_len: int, recent: int, device=None) -> torch.Tensor:
    """[q_len, kv_len] bool: query j sits at position p = kv_len - q_len + j and sees positions
    p - recent + 1 .. p."""
    rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    cols = torch.arange(kv_len, device=device)
    return (cols <= rows) & (cols > rows - recent)


def bottom_right_causal(q_len: int, kv_len: int, device=None) -> torch.Tensor:
    """[q_len, kv_len] bool: query j sits at position kv_len - q_len + j and sees up to its own."""
    return recent_band(q_len, kv_len, kv_len, device)


def mask_allows(mask: torch.Tensor | None, q_len: int, kv_len: int, device) -> torch.Tensor:
    """transformers' mask (None: plain causal; bool or additive [B, 1, T, S]) as a bool tensor."""
    if mask is None:
        return bottom_right_causal(q_len, kv_len, device)
    return mask if mask.dtype == torch.bool else mask == 0


# float32 logits per chunk of query rows (256 MiB): a dense 8,000-token prompt at once took 25-45 GB
LOGITS_PER_CHUNK = 1 << 26


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     allowed: torch.Tensor,
                     exact: tuple[torch.Tensor, torch.Tensor] | None = None, recent: int = 1,
                     bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q [..., Hq, T, d] (the last T positions); k, v [..., Hkv, S, d]; GQA by head groups.

    allowed: bool, broadcastable to [..., Hq, T, S]. exact: (k, v) [..., Hkv, n, d], the keys and
    values of the last n positions as computed, or None; given, row j (position p = S - T + j) sees
    each allowed position of its `recent` most recent ones, p - recent + 1 .. p, that lies among
    them through them instead of the cache (recent 1: its own position only). bias, broadcastable
    to [..., Hq, T, S], is added to the logits of the positions read through the cache.
    Returns float32 (output [..., Hq, T, d], natural-log log-sum-exp [..., Hq, T]); a row that sees
    nothing gets output 0 and lse -inf. Rows are taken in chunks of at most LOGITS_PER_CHUNK logits.
    """
    group = q.shape[-3] // k.shape[-3]
    t, s = q.shape[-2], k.shape[-2]
    kf, vf = (x.float().repeat_interleave(group, dim=-3) for x in (k, v))
    ek = ev = band = None
    if exact is not None:
        ek, ev = (x.float().repeat_interleave(group, dim=-3) for x in exact)
        band = recent_band(t, ek.shape[-2], recent, q.device)  # [T, n]: the exact rows each query takes
        vf = torch.cat([vf, ev], dim=-2)
    per_row = q[..., 0, 0].numel() * vf.shape[-2]
    step = max(1, LOGITS_PER_CHUNK // max(1, per_row))
    parts = [_attend_rows(q[..., a:a + step, :].float(), kf, vf, ek, scale, _rows(allowed, a, step, t),
                          None if band is None else band[a:a + step], _rows(bias, a, step, t))
             for a in range(0, t, step)]
    return torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-1)


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


def _rows(x: torch.Tensor | None, start: int, count: int, t: int) -> torch.Tensor | None:
    """Rows start .. start + count of a mask or bias broadcastable to [..., T, S]."""
    if x is None or x.dim() < 2 or x.shape[-2] != t:
        return x
    return x[..., start:start + count, :]


def _attend_rows(qf, kf, vf, ek, scale, allowed, band, bias):
    """masked_attention for a chunk of query rows: qf float32 [..., Hq, t, d]; kf [..., Hq, S, d];
    vf the values of the cache followed by the exact ones (if any), ek the exact keys (or None) and
    band their [t, n] rule for these rows."""
    s = kf.shape[-2]
    logits = qf @ kf.transpose(-1, -2) * scale
    if bias is not None:
        logits = logits + bias
    if ek is None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    else:
        n = ek.shape[-2]
        in_band = torch.zeros(band.shape[0], s, dtype=torch.bool, device=qf.device)
        in_band[:, s - n:] = band
        elogits = (qf @ ek.transpose(-1, -2) * scale).masked_fill(
            ~(band & allowed.expand(logits.shape)[..., s - n:]), float("-inf"))
        logits = torch.cat([logits.masked_fill(~allowed | in_band, float("-inf")), elogits], dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    # rows that see nothing (lse = -inf) get weight 0; keep their output finite
    p = torch.exp(logits - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    return p @ vf, lse


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
                        own: tuple[torch.Tensor, torch.Tensor] | None = None,
                        page_shift: torch.Tensor | None = None) -> torch.Tensor:
    """q: [q_len, Hq, d] for the LAST q_len positions of k, v: [kv_len, Hkv, d]; causal; GQA.
    own: the new tokens' (k, v) [q_len, Hkv, d] as written, or None. Given, each query reads the
    new tokens' positions up to its own from them (the kernels' k_new/v_new rule) and only the
    older ones from k, v. page_shift: [Hq] taken from the logits of the positions read from k (not
    own's), or None. Returns fp32 [q_len, Hq, d]."""
    q_len = q.shape[0]
    allowed = bottom_right_causal(q_len, k.shape[0], q.device)
    heads_first = [x.transpose(0, 1) for x in (q, k, v)]
    own = None if own is None else tuple(x.transpose(0, 1) for x in own)
    bias = None if page_shift is None else -page_shift.to(q.device, torch.float32)[:, None, None]
    out, _ = masked_attention(*heads_first, softmax_scale, allowed, exact=own, recent=q_len, bias=bias)
    return out.transpose(0, 1)
