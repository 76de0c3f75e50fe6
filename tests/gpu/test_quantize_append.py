"""tq_quantize_append writes the reference's bytes (codes and gains); tq_dequantize reads
them like the reference."""

import pytest
import torch

from tq_trtllm.core.spec import SUPPORTED_WIDTHS as WIDTHS
from tq_trtllm.kernels import dequantize, quantize_append

from .cases import make_cache, positions, twin
from .written import check_written


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
    # every token, in (seq, pos) order
    seq_all = torch.cat([torch.full((n,), s) for s, n in enumerate(lengths)]).cuda()
    pos_all = torch.cat([torch.arange(n) for n in lengths]).cuda()
    order = torch.argsort(seq.long() * 10**6 + pos.long())
    for kv, (x, codec) in enumerate(((k, ref.key), (v, ref.value))):
        check_written(mine.read(table, kv, seq_all, pos_all), ref.read(table, kv, seq_all, pos_all),
                      codec, x[order], pos[order].long(), search=True)


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
