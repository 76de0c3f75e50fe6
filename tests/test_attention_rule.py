"""The attention rule every path follows (core.attention.masked_attention): causal over the cache,
and each query's most recent positions through their exact keys and values where they are given
(the kernels' new rows: the call's positions up to each query's own)."""

import pytest
import torch

from tq_trtllm.core import attention
from tq_trtllm.core.attention import bottom_right_causal, masked_attention, reference_attention


def explicit(q, k, v, scale, exact, recent=1):
    """Row by row, the definition: query j (position p = S - T + j) sees cache positions up to
    p - recent and then p - recent + 1 .. p from `exact`, the rows of the last n positions (those
    before them from the cache). q [T, Hq, d]; k, v [S, Hkv, d]; exact [n, Hkv, d]."""
    t, hq, _ = q.shape
    s, hkv, _ = k.shape
    n = exact[0].shape[0]
    out = torch.zeros(t, hq, q.shape[-1], dtype=torch.float64)
    for j in range(t):
        pos = s - t + j
        for h in range(hq):
            kv = h // (hq // hkv)
            rows = [(k[i, kv], v[i, kv]) if i < pos - recent + 1 or i < s - n
                    else (exact[0][i - s + n, kv], exact[1][i - s + n, kv]) for i in range(pos + 1)]
            keys = torch.stack([r[0] for r in rows]).double()
            values = torch.stack([r[1] for r in rows]).double()
            p = torch.softmax(keys @ q[j, h].double() * scale, dim=0)
            out[j, h] = p @ values
    return out


@pytest.mark.parametrize("t,s,hq,hkv", [(1, 9, 4, 2), (5, 5, 3, 3), (4, 17, 8, 1)])
def test_own_rows_replace_the_cache_at_the_calls_positions(t, s, hq, hkv, gen):
    q = torch.randn(t, hq, 16, generator=gen)
    k, v = torch.randn(2, s, hkv, 16, generator=gen)
    own = tuple(torch.randn(2, t, hkv, 16, generator=gen))
    got = reference_attention(q, k, v, 0.25, own)
    assert torch.allclose(got.double(), explicit(q, k, v, 0.25, own, recent=t), atol=1e-5)
    if t > 1:  # not the rule of the own position alone
        assert not torch.allclose(got.double(), explicit(q, k, v, 0.25, own, recent=1), atol=1e-3)
    # without own rows the cache's own position is attended to (and the answers differ)
    cached = reference_attention(q, k, v, 0.25)
    assert torch.allclose(cached.double(), explicit(q, k, v, 0.25, (k[s - t:], v[s - t:])), atol=1e-5)
    assert not torch.allclose(cached, got, atol=1e-3)


@pytest.mark.parametrize("t,s,n,recent", [(1, 9, 4, 4), (3, 12, 6, 4), (4, 10, 4, 2), (2, 6, 5, 8)])
def test_a_recent_window_reads_each_querys_last_positions_exact(t, s, n, recent, gen):
    q = torch.randn(1, 2, t, 16, generator=gen)
    k, v = torch.randn(2, 1, 1, s, 16, generator=gen)
    exact = tuple(torch.randn(2, 1, 1, n, 16, generator=gen))
    got, _ = masked_attention(q, k, v, 0.25, bottom_right_causal(t, s), exact, recent)
    want = explicit(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), 0.25,
                    tuple(x[0].transpose(0, 1) for x in exact), recent)
    assert torch.allclose(got[0].transpose(0, 1).double(), want, atol=1e-5)


def test_without_own_rows_it_is_sdpa_with_the_causal_mask(gen):
    q = torch.randn(2, 6, 7, 32, generator=gen)
    k, v = torch.randn(2, 2, 3, 20, 32, generator=gen)
    allowed = bottom_right_causal(7, 20)
    got, lse = masked_attention(q, k, v, 0.2, allowed)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=0.2,
                                                            enable_gqa=True)
    assert torch.allclose(got, want, atol=1e-5)
    logits = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) * 0.2
    assert torch.allclose(lse, logits.masked_fill(~allowed, float("-inf")).logsumexp(-1), atol=1e-5)


def test_a_masked_own_position_is_not_seen_and_an_empty_row_gives_zero(gen):
    q = torch.randn(1, 2, 3, 8, generator=gen)
    k, v = torch.randn(2, 1, 1, 5, 8, generator=gen)
    own = tuple(torch.randn(2, 1, 1, 3, 8, generator=gen))
    allowed = bottom_right_causal(3, 5).clone()
    allowed[2] = False          # row 2 sees nothing at all
    allowed[1, 3] = False       # row 1's own position (3) is masked: only positions 0-2
    out, lse = masked_attention(q, k, v, 0.5, allowed, own)
    assert torch.equal(out[..., 2, :], torch.zeros_like(out[..., 2, :])) and (lse[..., 2] == -torch.inf).all()
    seen_only = masked_attention(q[..., 1:2, :], k[..., :3, :], v[..., :3, :], 0.5,
                                 torch.ones(1, 3, dtype=torch.bool))[0]
    assert torch.allclose(out[..., 1:2, :], seen_only, atol=1e-6)


@pytest.mark.parametrize("budget", [1, 600, 1000])
def test_rows_taken_in_chunks_attend_as_all_rows_at_once(budget, gen, monkeypatch):
    # 2 x 4 heads x (20 cache + 5 exact) = 200 logits a row: chunks of 1, 3 and 5 of the 7 rows,
    # each with its rows of the batched mask, the per-row bias and the recent band
    t, s = 7, 20
    q = torch.randn(2, 4, t, 16, generator=gen)
    k, v = torch.randn(2, 2, 2, s, 16, generator=gen)
    exact = tuple(torch.randn(2, 2, 2, 5, 16, generator=gen))
    allowed = bottom_right_causal(t, s) & (torch.rand(2, 1, t, s, generator=gen) > 0.3)
    bias = torch.randn(1, 4, t, s, generator=gen)
    want = masked_attention(q, k, v, 0.3, allowed, exact, 3, bias)
    monkeypatch.setattr(attention, "LOGITS_PER_CHUNK", budget)
    got = masked_attention(q, k, v, 0.3, allowed, exact, 3, bias)
    assert torch.allclose(got[0], want[0], atol=1e-6) and torch.equal(got[1].isinf(), want[1].isinf())
    assert torch.allclose(got[1].nan_to_num(neginf=0.0), want[1].nan_to_num(neginf=0.0), atol=1e-6)
