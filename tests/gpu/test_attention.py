"""Decode and chunked-prefill attention match fp32 attention over the reference's dequantized cache."""

import pytest
import torch

from tq_trtllm.core.attention import reference_attention
from tq_trtllm.core.errors import TQError
from tq_trtllm.kernels import (KernelCache, attention, attention_plan, decode_attention, dequantize,
                               prefill_attention, quantize_append, workspace_bytes)

from .cases import make_cache, positions, twin
from .written import check_written

TOL = 2e-3


def fill(kc, lengths, heads, head_dim, gen):
    seq, pos = positions(lengths, gen)
    x = torch.randn(2, seq.numel(), heads, head_dim, generator=gen).half().cuda()
    quantize_append(kc, x[0], x[1], seq, pos)


def new_rows(batch, q_len, heads, head_dim, dtype, gen):
    """Own rows (k, v) [batch, q_len, heads, head_dim] for the last q_len positions: random, so
    unlike what the cache holds there (a kernel that read the cache instead would fail)."""
    x = torch.randn(2, batch, q_len, heads, head_dim, generator=gen).to(dtype).cuda()
    return x[0], x[1]


# Long contexts: TOL (2e-3) is more than what losing a whole 32-token tile of the cache changes at
# 40,000 tokens and beyond: a tile holds 32 / n of the softmax's mass, and its loss moves the output
# by (P o - S) / (1 - P) (P its mass, S its share of the output), at most 7.2e-4 at 40,000 tokens,
# 2.7e-4 at 70,000 (head_dim 64) and 2.2e-4 at 131,072 for the smallest tile of random queries,
# keys and values (about 19-40 / n; one lost token: a median 3.3e-4, 9.4e-5 and 1.0e-4, below the
# kernels' rounding at 131,072). From LONG_CONTEXT tokens on, each sequence's bound is half its own
# smallest tile's change, computed from the reference's dequantized cache: 1.1e-4 at 131,072, 3-4
# times the kernels' worst error there (2.8-3.1e-5 with tables, docs/BENCHMARKS.md, "the grid bias
# out of the value accumulators every tile").
LONG_CONTEXT = 20000
TILE = 32


def lost_tile_change(q, k, v, scale, own):
    """The smallest change of the output (max abs over query rows, heads and channels) that losing
    one whole TILE-token tile of the cached positions makes, over every tile: float32 attention of
    q [q_len, Hq, d] over k, v [n, Hkv, d] whose last q_len positions are read from own (k, v)."""
    q_len, hq, d = q.shape
    hkv, cached = k.shape[1], k.shape[0] - q_len
    tiles = cached // TILE
    qg = q.float().view(q_len, hkv, hq // hkv, d)
    logits = torch.einsum("qagd,nad->qagn", qg, k[:cached].float()) * scale
    own_logits = torch.einsum("qagd,jad->qagj", qg, own[0].float()) * scale
    later = torch.arange(q_len, device=q.device)[None, :] > torch.arange(q_len, device=q.device)[:, None]
    own_logits = own_logits.masked_fill(later[:, None, None, :], float("-inf"))
    lse = torch.cat([logits, own_logits], dim=-1).logsumexp(dim=-1, keepdim=True)
    p, p_own = (logits - lse).exp(), (own_logits - lse).exp()
    out = torch.einsum("qagn,nad->qagd", p, v[:cached].float()) + \
        torch.einsum("qagj,jad->qagd", p_own, own[1].float())
    per_tile = p[..., :tiles * TILE].reshape(*p.shape[:3], tiles, TILE)
    mass = per_tile.sum(dim=-1)
    share = torch.einsum("qagtk,tkad->qagtd", per_tile, v[:tiles * TILE].float().view(tiles, TILE, hkv, d))
    change = (mass[..., None] * out[:, :, :, None] - share) / (1 - mass)[..., None]
    return change.abs().amax(dim=(0, 1, 2, 4)).min().item()


def check_against_reference(cache, table, q, out, lengths, scale, own=None, shift=None):
    """Max abs error vs fp32 attention over the reference-dequantized history, per sequence; own:
    the new tokens' rows the kernel was given, or None; shift: the cache's page_lse_shift. From
    LONG_CONTEXT tokens with own rows, the bound is the tighter one above."""
    q_len = q.shape[1]
    worst = 0.0
    for b, n in enumerate(lengths):
        k, v = cache.gather(table, b, 0, n)
        want = reference_attention(q[b].float(), k, v, scale,
                                   None if own is None else (own[0][b], own[1][b]), shift)
        got = out[b].float()
        assert torch.isfinite(got).all(), "NaN or Inf in the output"
        # the output carries its own rounding on top of the bound: half an ulp, up to 2^-8 (bf16) or
        # 2^-11 (fp16) relative (an fp16 output of 4 or more alone rounds by up to 1.95e-3)
        slack = want.abs() * (2**-8 if out.dtype == torch.bfloat16 else 2**-11)
        err = ((got - want).abs() - slack).max().item()
        worst = max(worst, err)
        tol = TOL
        if n >= LONG_CONTEXT and own is not None and shift is None:
            tile = lost_tile_change(q[b], k, v, scale, (own[0][b], own[1][b]))
            tol = min(TOL, tile / 2)
        assert err <= tol, (f"sequence {b} (length {n}, q_len {q_len}): max abs error {err:.2e} "
                            f"(bound {tol:.2e})")
    return worst


CASES = [
    # head_dim, q heads, kv heads, k width, v width, q_len, dtype, tables
    (128, 8, 2, 3, 3, 1, torch.float16, False),
    (128, 32, 8, 3, 3, 1, torch.float16, True),
    (128, 16, 2, 3, 3, 8, torch.bfloat16, True),   # group 8 x 8 query tokens: 4 row tiles
    (128, 4, 4, 4, 2, 3, torch.float16, False),    # group 1
    (128, 8, 2, 4, 4, 2, torch.bfloat16, False),   # the width-specialized kernels: 4, 3 and 2 bits
    (128, 8, 2, 2, 2, 1, torch.float16, True),
    (128, 8, 2, 2.5, 3.5, 2, torch.bfloat16, True),  # values wider than keys: the generic kernel
    (128, 8, 2, 3.5, 2, 1, torch.float16, True),     # mixed widths of the allocator: specialized too
    (128, 8, 2, 1, 1.5, 1, torch.float16, False),
    (64, 9, 3, 3, 3, 1, torch.float16, False),     # SmolLM2's attention shape
    (64, 9, 3, 3.5, 2.5, 5, torch.bfloat16, True),
    (64, 16, 2, 4, 4, 8, torch.float16, True),
    (64, 6, 6, 1.5, 2, 4, torch.float16, False),
    (128, 8, 2, 5, 3, 1, torch.float16, True),     # 5-bit keys beside 3-bit values
    (64, 9, 3, 2.5, 2, 1, torch.bfloat16, True),
    (64, 9, 3, 5, 3.5, 1, torch.float16, True),
    (64, 9, 3, 4.5, 5, 2, torch.bfloat16, True),   # 5-bit codes in the generic kernel
    (128, 14, 2, 3, 3, 3, torch.float16, True),    # group 7 x 3 tokens: rows and row tiles by SmallDivisor
    (64, 10, 2, 3, 3, 2, torch.bfloat16, False),   # group 5
]


def decode_error(case, lengths, gen, tokens_per_block=64, spare_blocks=1):
    """Decode attention with own rows over a cache of random vectors in the case's shape and widths
    (CASES' fields): its worst error against the reference (check_against_reference's bound)."""
    d, hq, hkv, kw, vw, q_len, dtype, tables = case
    cache, table, kc = make_cache(d, kw, vw, hkv, tokens_per_block, lengths, gen, tables, spare_blocks)
    fill(kc, lengths, hkv, d, gen)
    q = torch.randn(len(lengths), q_len, hq, d, generator=gen).to(dtype).cuda()
    own = new_rows(len(lengths), q_len, hkv, d, dtype, gen)
    out = decode_attention(kc, q, torch.tensor(lengths), max(lengths), own=own)
    return check_against_reference(cache, table, q, out, lengths, d**-0.5, own)


def case_id(c):
    return f"d{c[0]}-h{c[1]}x{c[2]}-k{c[3]}v{c[4]}-q{c[5]}-{str(c[6])[6:]}-{'tab' if c[7] else 'plain'}"


@pytest.mark.parametrize("with_own", [False, True], ids=["cache", "own"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_decode_attention_ragged(case, with_own, gen):
    """Every position from the cache, or (own) the call's positions up to each query's own from
    the new rows."""
    d, hq, hkv, kw, vw, q_len, dtype, tables = case
    T = 32
    lengths = [max(1, q_len), T - 1, 3 * T + 5, 777, 16, 2048 + 3]
    cache, table, kc = make_cache(d, kw, vw, hkv, T, lengths, gen, tables)
    fill(kc, lengths, hkv, d, gen)
    q = torch.randn(len(lengths), q_len, hq, d, generator=gen).to(dtype).cuda()
    own = new_rows(len(lengths), q_len, hkv, d, dtype, gen) if with_own else None
    scale = d**-0.5
    lens = torch.tensor(lengths, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    decode_attention(kc, q, lens, max(lengths), scale, out=out, own=own)
    check_against_reference(cache, table, q, out, lengths, scale, own)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_row_makes_what_reads_it_nan(bad, gen):
    """A kernel cannot refuse a NaN or Inf activation (the TensorRT plugin's path; the Python
    reference raises TQError): the row is stored with a NaN gain, so every output that attends to
    it is NaN, as with an fp16 cache, and never a finite wrong answer. Sequence 0 gets one bad key
    coordinate, sequence 1 one bad value coordinate, sequence 2 none."""
    lengths = [300, 300, 300]
    cache, table, kc = make_cache(128, 3, 3, 2, 64, lengths, gen, tables=True)
    fill(kc, lengths, 2, 128, gen)
    rows = torch.randn(2, 2, 2, 128, generator=gen).half().cuda()  # K/V, sequence, head, dim
    rows[0, 0, 1, 17] = bad
    rows[1, 1, 0, 90] = bad
    seq, pos = torch.tensor([0, 1], dtype=torch.int32).cuda(), torch.tensor([123, 45], dtype=torch.int32).cuda()
    quantize_append(kc, rows[0], rows[1], seq, pos)
    k, v = dequantize(kc, 0, 123, 1)
    assert torch.isnan(k[0, 1]).all() and torch.isfinite(k[0, 0]).all()
    lens = torch.tensor(lengths)
    q1, q20 = (torch.randn(3, n, 8, 128, generator=gen).half().cuda() for n in (1, 20))
    # one decode token (the split pass), a chunk of 20 (80 rows per KV head: the prefill pass)
    for out in (decode_attention(kc, q1, lens, 300), prefill_attention(kc, q20, lens, 300)):
        assert torch.isnan(out[0, :, 4:]).all() and torch.isfinite(out[0, :, :4]).all(), \
            "the bad key's KV head (query heads 4-7) must read NaN, the other head finite"
        assert torch.isnan(out[1, :, :4]).all() and torch.isfinite(out[1, :, 4:]).all()
        assert torch.isfinite(out[2]).all()


@pytest.mark.parametrize("q_len", [1, 4, 20])  # the merge pass's chunk term; 20: the chunk pass
def test_a_non_finite_new_row_reaches_every_row_that_reads_it(q_len, gen):
    """A NaN in the call's new rows (k_new, v_new, read exactly, not through the cache) reaches what
    reads it, as in fp16 attention, and no other sequence or KV head. Sequence 0 gets a NaN key
    coordinate at token `bad`: from that token on, the rows of its KV head are NaN, output and
    log-sum-exp. Sequence 1 gets a NaN value coordinate there: from that token on, that output
    coordinate of its KV head's rows is NaN. Rows of earlier tokens may read a later value's NaN
    (times a zero probability, as in fp16 flash attention) and are not checked."""
    lengths, bad = [300, 300, 300], q_len // 2
    cache, table, kc = make_cache(128, 3, 3, 2, 64, lengths, gen, tables=True)
    fill(kc, lengths, 2, 128, gen)
    q = torch.randn(3, q_len, 8, 128, generator=gen).half().cuda()
    own = new_rows(3, q_len, 2, 128, torch.float16, gen)
    own[0][0, bad, 1, 17] = float("nan")
    own[1][1, bad, 0, 90] = float("nan")
    lse = torch.empty(3, q_len, 8, device="cuda")
    run = decode_attention if q_len <= 8 else prefill_attention
    out = run(kc, q, torch.tensor(lengths), 300, lse=lse, own=own)
    for got in (out, lse[..., None]):
        assert torch.isnan(got[0, bad:, 4:]).all(), "the bad key's KV head (query heads 4-7) must read NaN"
        assert torch.isfinite(got[0, :, :4]).all() and torch.isfinite(got[2]).all()
    assert torch.isnan(out[1, bad:, :4, 90]).all(), "the bad value's coordinate must be NaN"
    assert torch.isfinite(out[1, bad:, :4, :90]).all() and torch.isfinite(out[1, :, 4:]).all()
    assert torch.isfinite(lse[1]).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_query_makes_its_own_outputs_nan(bad, gen):
    """A NaN or Inf in one query head's vector (the 8-bit query rows of the split pass take a
    per-row scale, which must not hide it) makes that head's output NaN and no other's."""
    lengths = [300, 300]
    cache, table, kc = make_cache(128, 3, 3, 2, 64, lengths, gen)
    fill(kc, lengths, 2, 128, gen)
    lens = torch.tensor(lengths)
    for q_len in (1, 20):  # the split pass, the prefill pass (80 rows per KV head)
        q = torch.randn(2, q_len, 8, 128, generator=gen).half().cuda()
        q[1, q_len - 1, 5, 33] = bad
        run = decode_attention if q_len == 1 else prefill_attention
        out = run(kc, q, lens, 300)
        assert torch.isnan(out[1, q_len - 1, 5]).all(), "the bad query head's output must be NaN"
        out[1, q_len - 1, 5] = 0
        assert torch.isfinite(out).all(), "only the bad query head's output may be NaN"


def test_decode_attention_length_one_and_block_edges(gen):
    T = 64
    lengths = [1, T - 1, T, T + 1, 5 * T]
    cache, table, kc = make_cache(128, 3, 3, 2, T, lengths, gen)
    fill(kc, lengths, 2, 128, gen)
    q = torch.randn(len(lengths), 1, 8, 128, generator=gen).half().cuda()
    out = decode_attention(kc, q, torch.tensor(lengths), max(lengths))
    check_against_reference(cache, table, q, out, lengths, 128**-0.5)


def test_a_cache_over_another_block_table_reads_through_that_table(gen):
    """KernelCache.over: the pools and codec tables under another block table (the sequences'
    rows reordered, one of them twice) read what that table names; the original reads its own."""
    lengths = [70, 300, 5]
    cache, table, kc = make_cache(64, 3, 3, 3, 32, lengths, gen, True)
    fill(kc, lengths, 3, 64, gen)
    order = [2, 1, 0, 1]
    moved_table, moved_lengths = table[torch.tensor(order).cuda()], [lengths[i] for i in order]
    moved = kc.over(moved_table)
    assert moved.key is kc.key and moved.batch == len(order), "the codec tables are shared"
    q = torch.randn(len(order), 1, 9, 64, generator=gen).half().cuda()
    out = decode_attention(moved, q, torch.tensor(moved_lengths), max(moved_lengths))
    check_against_reference(cache, moved_table, q, out, moved_lengths, 64**-0.5)
    out = decode_attention(kc, q[:3], torch.tensor(lengths), max(lengths))
    check_against_reference(cache, table, q[:3], out, lengths, 64**-0.5)


@pytest.mark.parametrize("q_len,tables", [(1, False), (4, False), (1, True)])
def test_decode_attention_longest_context(q_len, tables, gen):
    """Batch 1 at 131,072 tokens, Llama-3-8B's attention shape, 3-bit keys and values; with
    tables, a rotary mean turned through 131,072 positions."""
    decode_error((128, 32, 8, 3, 3, q_len, torch.float16, tables), [131072], gen, spare_blocks=0)


@pytest.mark.parametrize("n", [100, 1000, 3000, 4096, 9000, 20000, 40000])
@pytest.mark.parametrize("q_len", [1, 4])
def test_decode_attention_at_batch_one_over_lengths(n, q_len, gen):
    """Llama-3-8B's shape at batch 1 with tables and own rows, over the split plan's range: one
    split of a few tiles at 100 tokens, 8 to 16 splits of 1 to 20 steps beyond, so that every
    merge sees a different count of partial states, some of them holding masked tails."""
    decode_error((128, 32, 8, 3, 3, q_len, torch.float16, True), [n], gen)


@pytest.mark.parametrize("d,hq,hkv", [(128, 32, 8), (64, 9, 3)])
@pytest.mark.parametrize("q_len", [1, 4])
def test_a_call_captured_in_a_cuda_graph_gives_the_eager_output(d, hq, hkv, q_len, gen):
    """Captured into a CUDA graph, a call lets its merge pass start with the split pass at every
    head_dim (AttnArgs::in_graph): the replay must give the eager call's output and log-sum-exp
    bit for bit, and both the reference's."""
    lengths = [3000, 700]
    cache, table, kc = make_cache(d, 3, 3, hkv, 64, lengths, gen, tables=True)
    fill(kc, lengths, hkv, d, gen)
    q = torch.randn(len(lengths), q_len, hq, d, generator=gen).half().cuda()
    own = new_rows(len(lengths), q_len, hkv, d, torch.float16, gen)
    lens = torch.tensor(lengths, dtype=torch.int32).cuda()
    ws = torch.empty(workspace_bytes(len(lengths), q_len, hq, hkv, d, max(lengths)), dtype=torch.uint8,
                     device="cuda")
    outs = [torch.full_like(q, float("nan")) for _ in range(2)]
    lses = [torch.empty(len(lengths), q_len, hq, device="cuda") for _ in range(2)]

    def call(i):
        decode_attention(kc, q, lens, max(lengths), out=outs[i], workspace=ws, lse=lses[i], own=own)

    call(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(outs[1], outs[0]) and torch.equal(lses[1], lses[0])
    check_against_reference(cache, table, q, outs[1], lengths, d**-0.5, own)


def test_one_plan_serves_every_layer_of_a_step(gen):
    """The Python front end plans a step's shape once (attention_plan) and every layer's call reuses
    it, whatever the layer's widths: 3-bit codecs run the plan's 8-warp CTAs at 1 x 40,000, 5-bit
    ones its 4-warp CTAs (their stages do not fit two 8-warp CTAs per SM). Each layer's output is
    its reference's, and bit for bit what the call gives with the plan it makes itself."""
    hq, hkv, d, n = 32, 8, 128, 40000
    plan = attention_plan(1, 1, hq, hkv, d, n)
    assert plan.wide_num_splits > 0 and plan.num_splits != plan.wide_num_splits
    ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    for width in (3, 5):
        cache, table, kc = make_cache(d, width, width, hkv, 64, [n], gen)
        fill(kc, [n], hkv, d, gen)
        q = torch.randn(1, 1, hq, d, generator=gen).half().cuda()
        out = attention(kc, q, torch.tensor([n]), n, plan=plan, workspace=ws)
        check_against_reference(cache, table, q, out, [n], d**-0.5)
        assert torch.equal(out, decode_attention(kc, q, torch.tensor([n]), n))


def test_a_smaller_call_runs_in_the_workspace_of_a_larger_one(gen):
    """The TensorRT plugin sizes the workspace once, for its profile's largest batch; 8 sequences
    split their keys more finely than 32 do and must still fit (tests/test_kernels_binding.py
    checks the sizes over many shapes)."""
    hq, hkv, d, n, batch = 32, 8, 128, 32768, 8
    cache, table, kc = make_cache(d, 3, 3, hkv, 64, [n] * batch, gen, spare_blocks=0)
    fill(kc, [n] * batch, hkv, d, gen)
    q = torch.randn(batch, 1, hq, d, generator=gen).half().cuda()
    ws = torch.empty(workspace_bytes(32, 1, hq, hkv, d, n), dtype=torch.uint8, device="cuda")
    out = decode_attention(kc, q, torch.tensor([n] * batch), n, workspace=ws)
    check_against_reference(cache, table, q, out, [n] * batch, d**-0.5)


PREFILL_CASES = [
    # head_dim, q heads, kv heads, k width, v width, chunk, dtype, tables; chunk x group > 64 rows
    # per KV head runs the prefill pass (256-row CTAs on wgmma), fewer the split pass
    (128, 8, 2, 3, 3, 100, torch.float16, True),
    (128, 8, 2, 3, 3, 100, torch.bfloat16, True),
    (128, 4, 4, 4, 2, 70, torch.float16, False),     # group 1
    (128, 8, 2, 2.5, 3.5, 33, torch.bfloat16, True),  # 132 rows: a second, nearly empty row tile
    (128, 8, 2, 1, 1.5, 50, torch.float16, False),
    (128, 8, 2, 3, 3, 12, torch.float16, True),      # 48 rows: the split pass
    (64, 9, 3, 3, 3, 64, torch.float16, False),      # SmolLM2's attention shape
    (64, 9, 3, 3.5, 2.5, 40, torch.bfloat16, True),
    (64, 16, 2, 2, 2, 17, torch.float16, True),
    (128, 8, 2, 5, 4.5, 40, torch.float16, True),
    (128, 12, 2, 3, 3, 30, torch.float16, True),     # group 6: 180 rows
]


@pytest.mark.parametrize("with_own", [False, True], ids=["cache", "own"])
@pytest.mark.parametrize("case", PREFILL_CASES, ids=case_id)
def test_prefill_attention_chunk_over_history(case, with_own, gen):
    """A chunk of new tokens (keys appended first) attends causally to its history and itself
    (own: the chunk's positions up to each token's own from its new rows): ragged histories, none at all, and one long
    enough to be split."""
    d, hq, hkv, kw, vw, chunk, dtype, tables = case
    lengths = [chunk + 300, chunk + 29, chunk, chunk + 3001]
    cache, table, kc = make_cache(d, kw, vw, hkv, 32, lengths, gen, tables)
    fill(kc, lengths, hkv, d, gen)
    q = torch.randn(len(lengths), chunk, hq, d, generator=gen).to(dtype).cuda()
    own = new_rows(len(lengths), chunk, hkv, d, dtype, gen) if with_own else None
    out = prefill_attention(kc, q, torch.tensor(lengths), max(lengths), own=own)
    check_against_reference(cache, table, q, out, lengths, d**-0.5, own)


# The fused append's cases. A one-token step encodes in CTAs of its own, of the split or the merge
# pass: the d 64 one-token case here takes the split pass's, the d 128 one the merge pass's, and
# the 8-warp test below both (tests/test_kernels_binding.py pins that both paths stay covered);
# longer steps encode in the splits.
FUSED_CASES = [CASES[1], CASES[2], CASES[4], CASES[6], CASES[9], CASES[12]]


def fused_lengths(q_len):
    return [q_len, 31 + q_len, 3 * 32 + 5, 777, 2048 + 3, 9000]


def check_fused_append(case, lengths, gen):
    """decode_attention(own=(k, v), append=True) leaves the history's bytes as they were, writes the
    new rows as the reference does when it rounds y itself (the fused append has no scale search:
    FORMAT.md step 4.4), and returns what decode_attention(own=(k, v)) returns over the bytes it
    wrote: the reference's attention over them."""
    d, hq, hkv, kw, vw, q_len, dtype, tables = case
    cache, table, kc = make_cache(d, kw, vw, hkv, 32, lengths, gen, tables)
    history = [n - q_len for n in lengths]
    seq, pos = positions(history, gen)
    x = torch.randn(2, seq.numel(), hkv, d, generator=gen).to(dtype).cuda()
    quantize_append(kc, x[0], x[1], seq, pos)
    new = torch.randn(2, len(lengths), q_len, hkv, d, generator=gen).to(dtype).cuda()
    q = torch.randn(len(lengths), q_len, hq, d, generator=gen).to(dtype).cuda()
    lens = torch.tensor(lengths, dtype=torch.int32)
    new_seq = torch.arange(len(lengths)).repeat_interleave(q_len).int().cuda()
    new_pos = torch.tensor([n - q_len + j for n in lengths for j in range(q_len)]).int().cuda()
    new_k, new_v = new[0].reshape(-1, hkv, d), new[1].reshape(-1, hkv, d)
    plain, _ = twin(cache, table, gen)
    for mine, theirs in zip(plain.pools, cache.pools):
        mine.copy_(theirs)
    plain.append(table, new_k, new_v, new_seq.long(), new_pos.long(), search=False)
    got = decode_attention(kc, q, lens, max(lengths), own=(new[0], new[1]), append=True)
    for kind, (rows, codec) in enumerate(((new_k, cache.key), (new_v, cache.value))):
        mine, theirs = (c.read(table, kind, seq.long(), pos.long()) for c in (cache, plain))
        assert all(map(torch.equal, mine.codes, theirs.codes)) and torch.equal(mine.norms, theirs.norms), \
            f"the fused append changed the {'kv'[kind]} history"
        mine, theirs = (c.read(table, kind, new_seq.long(), new_pos.long()) for c in (cache, plain))
        check_written(mine, theirs, codec, rows, new_pos.long(), search=False)
    want = decode_attention(kc, q, lens, max(lengths), own=(new[0], new[1]))
    assert torch.equal(got, want), "the fused call's attention differs from the same call without the append"
    check_against_reference(cache, table, q, got, lengths, d**-0.5, (new[0], new[1]))


@pytest.mark.parametrize("case", FUSED_CASES, ids=case_id)
def test_fused_append_writes_rounded_codes_and_attends_as_without_it(case, gen):
    """For new tokens in any split."""
    check_fused_append(case, fused_lengths(case[5]), gen)


# Splits of at least 8 tiles per warp at up to 8 query rows run on 8-warp CTAs where the model
# allows (attention.cu, plan_splits; tests/test_kernels_binding.py pins that these lengths take
# them): Llama-3-8B's shape at 1 x 40,000 tokens for each kind of split kernel, SmolLM2's at
# 1 x 70,000.
WIDE_CASES = [
    ((128, 32, 8, 3, 3, 1, torch.float16, True), 40000),
    ((128, 32, 8, 4, 4, 2, torch.bfloat16, False), 40000),  # q_len 2: 8 rows
    ((128, 32, 8, 5, 3, 1, torch.float16, True), 40000),
    ((128, 32, 8, 3.5, 2, 1, torch.bfloat16, True), 40000),
    ((128, 32, 8, 2.5, 3.5, 1, torch.float16, True), 40000),  # the generic kernel
    ((64, 9, 3, 3, 3, 1, torch.float16, True), 70000),
    ((64, 9, 3, 4.5, 5, 1, torch.bfloat16, True), 70000),  # 5-bit codes: generic
]


@pytest.mark.parametrize("case,n", WIDE_CASES, ids=lambda c: case_id(c) if isinstance(c, tuple) else str(c))
def test_eight_warp_ctas_match_the_reference(case, n, gen):
    decode_error(case, [n], gen)


# Long splits with calibrated tables (8 x 32,768: 1,024 tokens per warp on 8-warp CTAs; 1 x 131,072:
# 512). The value accumulators once held the look-up grid's bias (kGridBias) over a whole split,
# and the tensor cores' truncating fp32 sums lost 2.0-2.3e-3 of the output at 8 x 32,768, 1.0e-3 at
# 1 x 131,072 (growing with the tokens per warp); with the bias taken out every tile the worst error
# was 3.7e-5 (docs/BENCHMARKS.md#correctness-and-memory-checking). This bound lies well between
# the two.
LONG_SPLIT_TOL = 3e-4


@pytest.mark.parametrize("lengths", [[32768] * 8, [131072]], ids=["8x32768", "1x131072"])
def test_long_splits_keep_the_outputs_precision(lengths, gen):
    worst = decode_error((128, 32, 8, 3, 3, 1, torch.float16, True), lengths, gen, tokens_per_block=32)
    assert worst <= LONG_SPLIT_TOL, f"max abs error {worst:.2e} over long splits (bound {LONG_SPLIT_TOL})"


# A one-token step beside 8-warp splits encodes in CTAs of the split pass where all fit one wave
# (1 x 40,000: 128 split CTAs and 8), else in CTAs of the merge pass (8 x 32,768: 256 and 64, more
# than 2 per SM); tests/test_kernels_binding.py checks that they do.
WIDE_FUSED_LENGTHS = [[40000], [32768] * 8]


@pytest.mark.parametrize("lengths", WIDE_FUSED_LENGTHS, ids=["split-pass", "merge-pass"])
def test_the_fused_append_beside_eight_warp_ctas(lengths, gen):
    case = (128, 32, 8, 3, 3, 1, torch.float16, True)
    check_fused_append(case, lengths, gen)


def reference_lse(cache, table, q, lengths, scale, own_k=None, shift=None):
    """float64 log-sum-exp of scale * q . k_hat over the keys each query row sees, k_hat the
    reference-dequantized keys (key mean included; own_k [batch, q_len, Hkv, d] at the call's
    positions where given; the cached ones' logits lowered by shift [Hq] where given):
    [batch, q_len, Hq], -inf where none."""
    q_len, hq = q.shape[1:3]
    rows = []
    for b, n in enumerate(lengths):
        k, _ = cache.gather(table, b, 0, n, dtype=torch.float64)
        k = k.repeat_interleave(hq // k.shape[1], dim=1)
        logits = torch.einsum("qhd,khd->qhk", q[b].double(), k) * scale
        qpos = torch.arange(n - q_len, n, device=q.device)[:, None, None]
        kpos = torch.arange(n, device=q.device)[None, None, :]
        logits = logits.masked_fill(kpos > qpos, float("-inf"))
        if shift is not None:
            logits = logits - shift.to(logits)[None, :, None]
        if own_k is not None:  # row j reads the call's tokens i <= j that have a position
            mine = own_k[b].double().repeat_interleave(hq // own_k.shape[2], dim=1)
            for i in range(max(0, q_len - n), q_len):
                logits[i:, :, n - q_len + i] = (q[b].double()[i:] * mine[i]).sum(-1) * scale
        rows.append(logits.logsumexp(dim=-1))
    return torch.stack(rows)


def check_lse(got, want):
    none = want == float("-inf")
    assert (got[none] == float("-inf")).all(), "a row that sees no key must get -inf"
    err = (got[~none].double() - want[~none]).abs().max().item()
    assert err <= TOL, f"lse: max abs error {err:.2e}"


LSE_CASES = [
    # head_dim, q heads, kv heads, k width, v width, q_len, dtype, tables (key mean)
    (128, 8, 2, 3, 3, 1, torch.float16, True),      # GQA 4, key mean
    (128, 4, 4, 4, 2, 3, torch.float16, False),     # group 1, no mean, q_len > 1
    (64, 9, 3, 3.5, 2.5, 5, torch.bfloat16, True),  # fractional widths, q_len > 1, key mean
]


@pytest.mark.parametrize("case", LSE_CASES, ids=case_id)
def test_decode_attention_returns_the_lse(case, gen):
    d, hq, hkv, kw, vw, q_len, dtype, tables = case
    T = 32
    lengths = [q_len, max(1, q_len - 2), T + 7, 777, 2048 + 3]  # q_len - 2: early rows see nothing
    cache, table, kc = make_cache(d, kw, vw, hkv, T, lengths, gen, tables)
    fill(kc, lengths, hkv, d, gen)
    q = torch.randn(len(lengths), q_len, hq, d, generator=gen).to(dtype).cuda()
    scale = d**-0.5
    lens = torch.tensor(lengths, dtype=torch.int32)
    lse = torch.full(q.shape[:3], float("nan"), device="cuda")
    out = decode_attention(kc, q, lens, max(lengths), scale, lse=lse)
    check_lse(lse, reference_lse(cache, table, q, lengths, scale))
    assert torch.equal(out, decode_attention(kc, q, lens, max(lengths), scale)), \
        "asking for the lse must not change the output"
    own = new_rows(len(lengths), q_len, hkv, d, dtype, gen)
    decode_attention(kc, q, lens, max(lengths), scale, lse=lse, own=own)
    check_lse(lse, reference_lse(cache, table, q, lengths, scale, own[0]))


def test_prefill_attention_returns_the_lse(gen):
    lengths = [400, 130, 97]  # 97: the chunk's first three tokens have no position
    cache, table, kc = make_cache(128, 3, 3, 2, 32, lengths, gen, tables=True)
    fill(kc, lengths, 2, 128, gen)
    q = torch.randn(3, 100, 8, 128, generator=gen).half().cuda()
    lse = torch.empty(3, 100, 8, device="cuda")
    prefill_attention(kc, q, torch.tensor(lengths), max(lengths), lse=lse)
    check_lse(lse, reference_lse(cache, table, q, lengths, 128**-0.5))
    own = new_rows(3, 100, 2, 128, torch.float16, gen)
    prefill_attention(kc, q, torch.tensor(lengths), max(lengths), lse=lse, own=own)
    check_lse(lse, reference_lse(cache, table, q, lengths, 128**-0.5, own[0]))


def test_bad_input_raises_with_a_message(gen):
    cache, table, kc = make_cache(128, 3, 3, 2, 32, [40], gen)
    q = torch.randn(1, 1, 8, 128, generator=gen).half().cuda()
    with pytest.raises(TQError, match="beyond the block table"):
        decode_attention(kc, q, torch.tensor([40]), 10**6)
    with pytest.raises(TQError, match="q_len"):
        decode_attention(kc, torch.randn(1, 9, 8, 128).half().cuda(), torch.tensor([40]), 40)
    with pytest.raises(TQError, match="num_q_heads"):
        decode_attention(kc, torch.randn(1, 1, 3, 128).half().cuda(), torch.tensor([40]), 40)
    with pytest.raises(TQError, match="lse must be"):
        decode_attention(kc, q, torch.tensor([40]), 40, lse=torch.empty(1, 1, 8, device="cuda").half())
    with pytest.raises(TQError, match="workspace"):
        decode_attention(kc, q, torch.tensor([40]), 40,
                         workspace=torch.empty(8, dtype=torch.uint8, device="cuda"))
    kc.struct.k_pool = None
    with pytest.raises(TQError, match="k_pool"):
        decode_attention(kc, q, torch.tensor([40]), 40)
    kc.struct.k_pool = cache.pools[0].data_ptr() + 4
    with pytest.raises(TQError, match="aligned"):
        decode_attention(kc, q, torch.tensor([40]), 40)
    kc.struct.k_pool = cache.pools[0].data_ptr()
    kc.struct.key.head_dim = 96
    with pytest.raises(TQError, match="head_dim 96"):
        quantize_append(kc, q[0, :, :2], q[0, :, :2], torch.tensor([0]), torch.tensor([0]))
    kc.struct.key.head_dim = 128
    kc.struct.value.group_bits[0] = 6
    with pytest.raises(TQError, match="6 bits"):
        decode_attention(kc, q, torch.tensor([40]), 40)


@pytest.mark.parametrize("q_len", [1, 4])
def test_the_page_shift_lowers_the_cached_positions_against_the_own_rows(q_len, gen):
    """tq_paged_cache::page_lse_shift: every cached position's logit lowered by its query head's
    shift, the own rows' not; output and lse against the fp32 / float64 references."""
    d, hq, hkv = 64, 9, 3
    lengths = [q_len, 5, 40, 777]  # short histories: the own rows weigh much, the shift shows
    cache, table, kc = make_cache(d, 3, 3, hkv, 32, lengths, gen, True)
    fill(kc, lengths, hkv, d, gen)
    shift = torch.rand(hq, generator=gen) + 0.5
    shifted = KernelCache(cache, kc.block_table, shift)
    q = torch.randn(len(lengths), q_len, hq, d, generator=gen).half().cuda()
    own = new_rows(len(lengths), q_len, hkv, d, torch.float16, gen)
    lens, scale = torch.tensor(lengths), d**-0.5
    lse = torch.empty(len(lengths), q_len, hq, device="cuda")
    out = decode_attention(shifted, q, lens, max(lengths), scale, lse=lse, own=own)
    check_against_reference(cache, table, q, out, lengths, scale, own, shift)
    check_lse(lse, reference_lse(cache, table, q, lengths, scale, own[0], shift))
    plain = decode_attention(kc, q, lens, max(lengths), scale, own=own)
    assert (out - plain).abs().max().item() > 0.05, "the shift must move the output"
