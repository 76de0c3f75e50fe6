"""fp32 attention over a dequantized cache: what every attention kernel is compared with."""

from __future__ import annotations

import torch


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        softmax_scale: float) -> torch.Tensor:
    """q: [q_len, Hq, d] for the LAST q_len positions of k, v: [kv_len, Hkv, d]; causal; GQA.

    Query j sits at position kv_len - q_len + j and sees positions up to its own. Returns fp32
    [q_len, Hq, d].
    """
    q_len, hq, _ = q.shape
    kv_len, hkv, _ = k.shape
    group = hq // hkv
    kf = k.float().repeat_interleave(group, dim=1)  # [kv_len, Hq, d]
    vf = v.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q.float(), kf) * softmax_scale
    qpos = torch.arange(kv_len - q_len, kv_len, device=q.device)[:, None]
    kpos = torch.arange(kv_len, device=q.device)[None, :]
    logits = logits.masked_fill(kpos > qpos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(logits, dim=-1), vf)
