"""fp32 attention over a dequantized cache: what every attention kernel is compared with, and the
dense path of the runtime. One rule throughout (the kernels' k_new/v_new rule): a query attends to
the positions its mask allows, and where the new tokens' own keys and values are given, to its own
position through them exactly rather than through the cache."""

from __future__ import annotations

import torch


def bottom_right_causal(q_len: int, kv_len: int, device=None) -> torch.Tensor:
    """[q_len, kv_len] bool: query j sits at position kv_len - q_len + j and sees up to its own."""
    rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    return torch.arange(kv_len, device=device) <= rows


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     allowed: torch.Tensor,
                     own: tuple[torch.Tensor, torch.Tensor] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [..., Hq, T, d] (the last T positions); k, v [..., Hkv, S, d]; GQA by head groups.

    allowed: bool, broadcastable to [..., Hq, T, S]. own: (k, v) [..., Hkv, T, d] or None; given,
    row j sees position S - T + j (if allowed) through own[.][..., j, :] instead of the cache.
    Returns float32 (output [..., Hq, T, d], natural-log log-sum-exp [..., Hq, T]); a row that sees
    nothing gets output 0 and lse -inf.
    """
    group = q.shape[-3] // k.shape[-3]
    t, s = q.shape[-2], k.shape[-2]
    kf, vf = (x.float().repeat_interleave(group, dim=-3) for x in (k, v))
    logits = (q.float() @ kf.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    if own is not None:
        rows, cols = torch.arange(t, device=q.device), torch.arange(s - t, s, device=q.device)
        ko, vo = (x.float().repeat_interleave(group, dim=-3) for x in own)
        own_logit = (q.float() * ko).sum(-1) * scale
        seen = allowed.expand(logits.shape)[..., rows, cols]
        logits[..., rows, cols] = own_logit.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    # rows that see nothing (lse = -inf) get weight 0; keep their output finite
    p = torch.exp(logits - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    out = p @ vf
    if own is not None:
        out = out + p[..., rows, cols][..., None] * (vo - vf[..., cols, :])
    return out, lse


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
                        own: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q: [q_len, Hq, d] for the LAST q_len positions of k, v: [kv_len, Hkv, d]; causal; GQA.
    own: the new tokens' (k, v) [q_len, Hkv, d] as written, or None (masked_attention's rule).
    Returns fp32 [q_len, Hq, d]."""
    allowed = bottom_right_causal(q.shape[0], k.shape[0], q.device)
    heads_first = [x.transpose(0, 1) for x in (q, k, v)]
    own = None if own is None else tuple(x.transpose(0, 1) for x in own)
    out, _ = masked_attention(*heads_first, softmax_scale, allowed, own)
    return out.transpose(0, 1)
