"""tq_quantize_append writes the reference's bytes (codes and gains); tq_dequantize reads
them like the reference."""

import pytest
import torch

from tq_trtllm.core.packing import read_tokens
from tq_trtllm.core.rotation import fwht
from tq_trtllm.core.spec import SUPPORTED_WIDTHS as WIDTHS
from tq_trtllm.kernels import dequantize, quantize_append

from .cases import make_cache, positions, twin

BOUNDARY_EPS = 1e-5


def rotated_coordinates(codec, x, positions):
    """The reference's y (FORMAT.md step 4.3) per group, float64."""
    p = codec._to_permuted(x, positions)
    out = []
    for g in codec.spec.groups:
        part = p[..., g.start:g.start + g.dim]
        norm = part.norm(dim=-1, keepdim=True)
        out.append(fwht(torch.where(norm > 0, part / torch.where(norm > 0, norm, 1.0), 0.0)))
    return out


def all_tokens(cache, table, lengths, kv):
    """Codes and norms of every written token, in (seq, pos) order, read by the reference."""
    pages = cache.pools[kv].view(-1, cache.layouts[kv].page_bytes)
    seq = torch.cat([torch.full((n,), s) for s, n in enumerate(lengths)]).cuda()
    pos = torch.cat([torch.arange(n) for n in lengths]).cuda()
    page, slot = cache._locate(table, kv, seq, pos)
    return read_tokens(pages, cache.layouts[kv], page, slot), seq, pos


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("width", WIDTHS)
def test_quantize_append_matches_reference(width, head_dim, dtype, gen):
    heads, T = 3, 32
    lengths = [1, T - 1, 2 * T + 5]
    tables = width in (2.5, 3, 3.5)  # mean, scale and outliers on some widths
    ref, table, _ = make_cache(head_dim, width, width, heads, T, lengths, gen, tables)
    mine, kc = twin(ref, table, gen)
    seq, pos = positions(lengths, gen)
    n = seq.numel()
    k = (torch.randn(n, heads, head_dim, generator=gen) * 2).to(dtype).cuda()
    v = torch.randn(n, heads, head_dim, generator=gen).to(dtype).cuda()
    ref.append(table, k, v, seq.long(), pos.long())
    quantize_append(kc, k, v, seq, pos)
    torch.cuda.synchronize()
    # tokens in (seq, pos) order
    order = torch.argsort(seq.long() * 10**6 + pos.long())
    for kv, (x, codec) in enumerate(((k, ref.key), (v, ref.value))):
        want, _, _ = all_tokens(ref, table, lengths, kv)
        got, _, _ = all_tokens(mine, table, lengths, kv)
        # the gain depends on the codes: compare it where the group's codes agree (a code
        # may flip at a decision boundary, checked below)
        same = torch.stack([(cg == cw).all(dim=-1) for cg, cw in zip(got.codes, want.codes)], dim=-1)
        ulps = (got.norms.view(torch.int16).int() - want.norms.view(torch.int16).int()).abs()
        assert ulps[same].max().item() <= 1, f"gains differ by {ulps[same].max().item()} fp16 ulps"
        ys = rotated_coordinates(codec, x[order], pos[order].long())
        for g, (cg, cw, y) in enumerate(zip(got.codes, want.codes, ys)):
            bad = cg != cw
            frac = bad.float().mean().item()
            assert frac <= 1e-3, f"group {g}: {frac:.2%} of codes differ"
            if bad.any():
                cb = codec.codebooks[g].cuda()
                bounds = (cb[1:] + cb[:-1]) / 2
                dist = (y[bad].unsqueeze(-1) - bounds).abs().min(dim=-1).values
                assert (dist < BOUNDARY_EPS).all(), f"group {g}: a code differs away from a boundary"
                assert ((cg[bad].int() - cw[bad].int()).abs() == 1).all()


@pytest.mark.parametrize("width", [2, 3, 3.5, 4, 4.5, 5])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_dequantize_matches_reference(width, head_dim, gen):
    heads, T = 2, 16
    lengths = [45, 7]
    cache, table, kc = make_cache(head_dim, width, width, heads, T, lengths, gen, tables=True)
    seq, pos = positions(lengths, gen)
    x = torch.randn(2, seq.numel(), heads, head_dim, generator=gen).half().cuda()
    quantize_append(kc, x[0], x[1], seq, pos)
    for s, n in enumerate(lengths):
        k, v = dequantize(kc, s, 0, n, torch.float16)
        kr, vr = cache.gather(table, s, 0, n)
        for got, want in ((k, kr), (v, vr)):
            assert torch.isfinite(got).all()
            err = (got.float() - want).abs().max().item()
            assert err <= 2e-3 * max(1.0, want.abs().max().item()), err
