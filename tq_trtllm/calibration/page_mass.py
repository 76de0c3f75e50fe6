"""The pages' log-mass shift: how much quantization noise inflates the softmax mass of packed keys.

A packed key's logit is s + e with e the quantization error of q . k, roughly zero-mean. The mass
sum exp(s + e) over many keys grows on average by a factor E[exp(e)] ~ exp(var(e) / 2), while the
exact parts of the attention (the recent window, the sink tokens) keep their mass. So the pages draw
too much weight away from the exact rows, most in the layers with the fewest key bits. The shift is
that inflation, measured per query head on calibration text: the runtime subtracts it from the
pages' log-sum-exp before merging them with the exact parts (packed_attention).
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from .capture import run_observed
from .table import KVTable


def lse_inflation(q: torch.Tensor, k: torch.Tensor, k_hat: torch.Tensor, scale: float, first: int,
                  recent: int) -> torch.Tensor:
    """Mean over rows of lse(q . k_hat) - lse(q . k) over the keys each row reads from the pages.

    q [Hq, T, d]; k, k_hat [Hkv, T, d] exact and dequantized; row i reads keys first .. i - recent
    through the pages. Rows that read none are left out. Returns float64 [Hq]."""
    group = q.shape[0] // k.shape[0]
    q = q.double()
    s, s_hat = (q @ x.double().repeat_interleave(group, 0).transpose(-1, -2) * scale for x in (k, k_hat))
    i = torch.arange(q.shape[1], device=q.device)  # the masks live where the logits do
    paged = (i[None, :] <= i[:, None] - recent) & (i[None, :] >= first)
    rows = paged.any(dim=-1)
    lse = lambda x: torch.logsumexp(x.masked_fill(~paged, float("-inf")), dim=-1)[:, rows]  # noqa: E731
    return (lse(s_hat) - lse(s)).mean(dim=-1)


def measure_page_shifts(model, windows: torch.Tensor, table: KVTable,
                        progress: bool = False) -> list[torch.Tensor]:
    """The table's per-layer shifts, float32 [heads], averaged over the token windows [n, T]."""
    totals: dict[int, torch.Tensor] = {}
    scale = table.head_dim ** -0.5

    def add(layer, query, key, value):
        codec, _ = table.codecs(layer)
        key = key[0].detach()  # [Hkv, T, d]
        packed = torch.arange(key.shape[1], device=key.device) - table.sink_tokens
        k_hat = codec.roundtrip(key.double().transpose(0, 1), packed).transpose(0, 1)
        shift = lse_inflation(query[0].detach(), key, k_hat, scale, table.sink_tokens,
                              table.recent_tokens)
        totals[layer] = totals.get(layer, 0) + shift / windows.shape[0]

    for row in tqdm(windows, desc="page mass shift", disable=not progress):
        run_observed(model, row[None], add)
    return [totals[i].float() for i in range(len(table.layers))]
