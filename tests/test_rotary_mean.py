"""The rotary key mean (FORMAT.md section 1.1): it turns like RoPE, the codec restores it exactly,
and it removes the turning mean that a constant mean cannot."""

import pytest
import torch

from tq_trtllm.core.errors import TQError
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.rotary_mean import RotaryMean, pre_rope, select_pairs
from tq_trtllm.core.spec import CodecSpec

D, HEADS = 64, 2
INV_FREQ = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """transformers' rotate-half RoPE of x [..., T, d] at positions [T], written out directly."""
    angle = positions.double()[:, None] * INV_FREQ
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    rotated = torch.cat([-x[..., D // 2:], x[..., : D // 2]], dim=-1)
    return x * cos + rotated * sin


def test_the_rotary_mean_turns_like_rope_and_pre_rope_undoes_it(gen):
    pre = torch.randn(HEADS, D, generator=gen, dtype=torch.float64)
    pre[:, 8:32] = pre[:, 40:] = 0.0  # a mean on 16 pairs: R(t) m is RoPE of the whole mean
    rotary = select_pairs(pre, INV_FREQ, 16)
    positions = torch.arange(0, 5000, 37)
    turned = rotary.vectors(positions, D)  # [T, H, d]
    want = rope(pre[:, None, :].expand(-1, len(positions), -1), positions).transpose(0, 1)
    torch.testing.assert_close(turned, want, rtol=0, atol=1e-10)
    back = pre_rope(turned.transpose(0, 1), positions, INV_FREQ)
    torch.testing.assert_close(back, pre[:, None].expand_as(back), rtol=0, atol=1e-10)


def test_select_pairs_takes_the_largest_and_states_them_at_the_offset(gen):
    pre = 0.01 * torch.randn(HEADS, D, generator=gen, dtype=torch.float64)
    pre[0, [3, 3 + 32, 20]] = torch.tensor([5.0, 1.0, 4.0], dtype=torch.float64)
    pre[1, 7 + 32] = -3.0
    rotary = select_pairs(pre, INV_FREQ, 2)
    assert rotary.channels[0].tolist() == [3, 20]
    assert rotary.channels[1].tolist().count(7) == 1
    assert torch.equal(rotary.freq[0], INV_FREQ[[3, 20]])
    shifted = select_pairs(pre, INV_FREQ, 2, offset=9)
    positions = torch.arange(40)
    torch.testing.assert_close(shifted.vectors(positions, D), rotary.vectors(positions + 9, D),
                               rtol=0, atol=1e-12)


def test_the_codec_restores_the_rotary_mean_exactly(gen):
    rotary = select_pairs(torch.randn(HEADS, D, generator=gen, dtype=torch.float64), INV_FREQ, 8)
    mean = torch.randn(HEADS, D, generator=gen, dtype=torch.float64)
    codec = VectorCodec(CodecSpec(D, 3), seed=5, mean=mean, rotary=rotary)
    positions = torch.arange(0, 9000, 500)
    x = rotary.vectors(positions, D) + mean  # nothing left to quantize: decoding is exact
    torch.testing.assert_close(codec.roundtrip(x, positions), x, rtol=0, atol=1e-12)
    with pytest.raises(TQError, match="packed position"):
        codec.roundtrip(x)


def test_the_rotary_mean_removes_what_a_constant_mean_cannot(gen):
    """Keys whose pre-RoPE mean is large: the constant (post-RoPE) mean measured at positions
    0-511 leaves most of it, at least 4x the error of the rotary mean at positions 4,000+."""
    pre_mean = 3.0 * torch.randn(HEADS, D, generator=gen, dtype=torch.float64)
    def keys(positions):
        noise = torch.randn(HEADS, len(positions), D, generator=gen, dtype=torch.float64)
        return rope(pre_mean[:, None] + noise, positions).transpose(0, 1)  # [T, H, d]
    early, late = torch.arange(512), torch.arange(4000, 4512)
    constant = VectorCodec(CodecSpec(D, 3), seed=1, mean=keys(early).mean(dim=0))
    pre = pre_rope(keys(early).transpose(0, 1), early, INV_FREQ).mean(dim=1)
    turning = VectorCodec(CodecSpec(D, 3), seed=1, rotary=select_pairs(pre, INV_FREQ, 16))
    x = keys(late)
    err_constant = (constant.roundtrip(x) - x).pow(2).sum()
    err_turning = (turning.roundtrip(x, late) - x).pow(2).sum()
    assert err_turning * 4 < err_constant


def test_mismatched_shapes_and_too_many_pairs_are_refused():
    with pytest.raises(TQError, match="shape"):
        RotaryMean(torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 3), torch.zeros(2, 4, 2))
    with pytest.raises(TQError, match="shape"):  # both channels of each pair: a is enough
        RotaryMean(torch.zeros(2, 3, 2, dtype=torch.int64), torch.ones(2, 3), torch.zeros(2, 3, 2))
    with pytest.raises(TQError, match="at most 16"):
        RotaryMean(torch.arange(17)[None], torch.ones(1, 17), torch.zeros(1, 17, 2))
