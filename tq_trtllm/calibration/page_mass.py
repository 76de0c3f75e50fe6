"""The pages' log-mass shift: how much quantization noise inflates the softmax mass of packed keys.

A packed key's logit is s + e with e the quantization error of q . k, roughly zero-mean. The mass
sum exp(s + e) over many keys grows on average by a factor E[exp(e)] ~ exp(var(e) / 2), while the
exact parts of the attention (the recent window, the sink tokens) keep their mass. So the pages draw
too much weight away from the exact rows, most in the layers with the fewest key bits. The shift is
that inflation, measured per query head on calibration text: the runtime subtracts it from the
pages' log-sum-exp before merging them with the exact parts (packed_attention).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

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
    """The table's per-layer shifts, float32 [heads], averaged over the token windows [n, T].

    The windows' queries and keys are captured first; then per layer one roundtrip over all
    windows' keys, the layers shared among threads (each roundtrip too small to keep the cores
    busy alone)."""
    captured: dict[int, list] = {}
    scale = table.head_dim ** -0.5

    def keep(layer, query, key, value):
        captured.setdefault(layer, []).append((query[0].detach(), key[0].detach()))

    bar = tqdm(total=windows.shape[0] + len(table.layers), desc="page mass shift", disable=not progress)
    for row in windows:
        run_observed(model, row[None], keep)
        bar.update()

    def layer_shift(layer: int) -> torch.Tensor:
        codec, _ = table.codecs(layer)
        keys = torch.stack([key for _, key in captured[layer]])  # [n, Hkv, T, d]
        packed = torch.arange(keys.shape[2], device=keys.device) - table.sink_tokens
        k_hat = codec.roundtrip(keys.double().transpose(1, 2), packed).transpose(1, 2)
        total = 0
        for (query, key), rows in zip(captured[layer], k_hat):
            total = total + lse_inflation(query, key, rows, scale, table.sink_tokens,
                                          table.recent_tokens) / windows.shape[0]
        bar.update()
        return total.float()

    with ThreadPoolExecutor(max_workers=max(1, min(4, torch.get_num_threads()))) as pool:
        shifts = list(pool.map(layer_shift, range(len(table.layers))))
    bar.close()
    return shifts
