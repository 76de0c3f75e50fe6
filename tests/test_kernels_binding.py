"""tq_trtllm.kernels on any machine: importing needs no GPU, and where the library is built its
page sizes agree with the reference's PageLayout (tq_page_bytes needs no GPU either) and its
host-side argument checks answer through the ctypes signatures."""

import ctypes
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tq_trtllm.calibration.table import LayerTable
from tq_trtllm.core.codebook import lloyd_max, on_grid
from tq_trtllm.core.errors import TQError
from tq_trtllm.core.packing import PageLayout
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.spec import SUPPORTED_WIDTHS, CodecSpec
from tq_trtllm import kernels
from tq_trtllm.kernels._lib import TqPagedCache
from tq_trtllm.kernels.ops import DeviceCodec

from required import REQUIRE_CUDA_BUILD, needs
from gpu.test_attention import FUSED_CASES, WIDE_FUSED_LENGTHS, fused_lengths


def test_import_needs_no_gpu_and_says_why_it_cannot_run():
    reason = kernels.unavailable_reason()
    assert reason is None or isinstance(reason, str) and reason


def test_device_codecs_carry_the_tables_scales(gen):
    """Each side's per-head scale reaches its tq_codec (the value scale is multiplied back in by the
    attention merge and by dequantize); no library or GPU is needed to build the structs."""
    key_scale, value_scale = (torch.rand(2, 64, generator=gen, dtype=torch.float64) + 0.5 for _ in range(2))
    table = LayerTable(3.0, 2.5, 5, key_scale=key_scale, value_scale=value_scale,
                       value_outliers=torch.arange(32).repeat(2, 1))
    for codec, scale in zip(table.codecs(64), (key_scale, value_scale)):
        dc = DeviceCodec(codec, 2, "cpu")
        assert dc.struct.scale == dc.scale.data_ptr() and torch.equal(dc.scale, scale.float())
    assert DeviceCodec(LayerTable(3.0, 3.0, 5).codecs(64)[1], 2, "cpu").struct.scale is None


needs_library = needs(None if kernels.find_library() else "libtq_kernels.so is not built",
                      REQUIRE_CUDA_BUILD)


@needs_library
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("width", SUPPORTED_WIDTHS)
def test_library_page_bytes_equal_the_reference(width, head_dim):
    codec = VectorCodec(CodecSpec(head_dim, width))
    for tokens in (16, 64):
        assert kernels.page_bytes(codec, tokens) == PageLayout(codec.spec, tokens).page_bytes


@needs_library
def test_library_refuses_unsupported_head_dim():
    with pytest.raises(TQError, match="head_dim 256"):
        kernels.page_bytes(VectorCodec(CodecSpec(256, 3)), 64)


@needs_library
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("width", SUPPORTED_WIDTHS)
def test_library_levels_are_the_references_to_the_bit(width, head_dim, gen):
    """FORMAT.md section 1's 8-bit grid, computed by the library (tq_codebook_levels) and by the
    reference (on_grid) from the same unrounded codebooks: the analytic ones and random ascending
    ones such as refined codebooks could be, off-centre."""
    lib = kernels.ops.library()
    codec = VectorCodec(CodecSpec(head_dim, width))
    groups = codec.spec.groups
    analytic = [lloyd_max(g.dim, g.bits) for g in groups]
    steps = [torch.rand(2**g.bits, generator=gen, dtype=torch.float64) + 0.5 for g in groups]
    # off-centre: about 30% of the levels negative, an even number of them from 4 bits on (the
    # library's 4- and 5-bit look-ups pair neighbouring levels of one sign)
    ups = [(s.cumsum(0) / s.sum()).numpy() for s in steps]
    cuts = [round(0.3 * len(u)) if len(u) < 16 else 2 * round(0.15 * len(u)) for u in ups]
    random = [(u - (u[k - 1] + u[k]) / 2) * 0.4 for u, k in zip(ups, cuts)]
    for books in (analytic, random):
        codec.codebooks = [torch.tensor(b) for b in books]  # unrounded: the library rounds them
        struct = DeviceCodec(codec, 1, "cpu").struct
        for i, book in enumerate(books):
            out = (ctypes.c_float * len(book))()
            assert lib.tq_codebook_levels(ctypes.byref(struct), i, out) == 0, lib.tq_last_error()
            assert np.array_equal(np.array(out, dtype=np.float64), on_grid(book))
    out = (ctypes.c_float * 32)()
    assert lib.tq_codebook_levels(ctypes.byref(struct), len(groups), out) != 0
    assert f"group {len(groups)} of a codec" in lib.tq_last_error().decode()


@needs_library
def test_library_refuses_a_codebook_whose_levels_share_a_grid_step():
    """The library puts the codebooks it is given on their 8-bit grid itself (FORMAT.md section 1),
    so a codebook that the reference would refuse is refused there too, with the reason."""
    codec = VectorCodec(CodecSpec(64, 2))
    codec.codebooks = [torch.tensor([-1.0, 0.001, 0.002, 1.0], dtype=torch.float64)]
    lib = kernels.ops.library()
    assert lib.tq_page_bytes(ctypes.byref(DeviceCodec(codec, 1, "cpu").struct), 64) == -1
    assert "same step of its 8-bit grid" in lib.tq_last_error().decode()


@needs_library
@pytest.mark.parametrize("bits", [4, 5])
def test_library_refuses_a_wide_codebook_with_an_odd_number_of_negative_levels(bits):
    """The attention kernels look up 4- and 5-bit levels in neighbouring pairs of one sign
    (tile_decode.cuh): a codebook that cannot pair so is refused with the reason, not misread."""
    n = 2**bits
    codec = VectorCodec(CodecSpec(64, bits))
    lib = kernels.ops.library()
    for negative in (3 * n // 8, 3 * n // 8 + 1):  # 6 or 12 levels below zero, then 7 or 13
        codec.codebooks = [torch.tensor((np.arange(n) - negative + 0.5) / n, dtype=torch.float64)]
        assert int((on_grid(codec.codebooks[0].numpy()) < 0).sum()) == negative
        page = lib.tq_page_bytes(ctypes.byref(DeviceCodec(codec, 1, "cpu").struct), 64)
        assert (page > 0) == (negative % 2 == 0), lib.tq_last_error()
    assert "even number of negative levels" in lib.tq_last_error().decode()


@needs_library
def test_the_workspace_of_the_largest_call_serves_every_smaller_one():
    """The TensorRT plugin sizes the attention workspace once, for its profile's largest batch,
    chunk and length; a smaller call may split its keys more finely and must still fit. (The split
    plan needs the SM count: without a GPU the library plans for an H200's 132.)"""
    hq, hkv, d = 32, 8, 128
    shapes = [(b, q, n) for b in (1, 2, 8, 32) for q in (1, 4, 8, 100)
              for n in (1, 300, 4096, 32768, 131072)]
    size = {s: kernels.workspace_bytes(*s[:2], hq, hkv, d, s[2]) for s in shapes}
    for (b, q, n), need in size.items():
        larger = min(v for (B, Q, N), v in size.items() if B >= b and Q >= q and N >= n)
        assert larger >= need, (f"batch {b}, q_len {q}, {n} tokens need {need} bytes, a larger "
                                f"call's size is {larger}")


# (batch, context, q heads, KV heads, head_dim, q_len) -> splits per sequence: the split plans
# that a sweep of split lengths on the H200 measured fastest, or within 1.3% of the fastest
# (docs/BENCHMARKS.md#the-split-length-a-cost-model), on 132 SMs; from 1 x 16,384 tokens at
# q_len 1 the plans of 8-warp CTAs, measured 1.5-5% faster than those (1 x 32,768: 16 splits
# instead of 32; 1 x 131,072: 32 instead of 49; 8, 16 and 32 x 32,768: 4, 2, 1 instead of 8, 4, 2).
MEASURED_SPLITS = {
    (1, 1024, 32, 8, 128, 1): 8, (1, 2048, 32, 8, 128, 1): 16, (1, 4096, 32, 8, 128, 1): 16,
    (1, 8192, 32, 8, 128, 1): 16, (1, 16384, 32, 8, 128, 1): 16, (1, 32768, 32, 8, 128, 1): 16,
    (1, 65536, 32, 8, 128, 1): 32, (1, 131072, 32, 8, 128, 1): 32, (4, 32768, 32, 8, 128, 1): 8,
    (8, 32768, 32, 8, 128, 1): 4, (16, 32768, 32, 8, 128, 1): 2, (32, 32768, 32, 8, 128, 1): 1,
    (1, 4096, 9, 3, 64, 1): 32, (1, 131072, 9, 3, 64, 1): 86, (32, 32768, 9, 3, 64, 1): 4,
    (1, 16384, 32, 8, 128, 4): 16, (8, 32768, 32, 8, 128, 4): 6,
}


def planned_splits(batch, context, hq, hkv, d, q_len):
    """The library's splits per sequence for a decode call. The split count shows in the workspace
    the call needs (16 rows of d floats and one float2 per split and row tile), which the library
    reports before it touches any device pointer."""
    codec = DeviceCodec(VectorCodec(CodecSpec(d, 3)), hkv, "cpu").struct
    chunk = kernels.page_bytes(VectorCodec(CodecSpec(d, 3)), 64) * hkv
    cache = TqPagedCache(k_pool=1 << 20, v_pool=1 << 21, k_chunk_bytes=chunk, v_chunk_bytes=chunk,
                         block_table=1 << 22, max_blocks=-(-context // 64), tokens_per_block=64,
                         num_kv_heads=hkv, num_chunks=1, key=codec, value=codec)
    lib = kernels.library()
    status = lib.tq_decode_attention(ctypes.byref(cache), None, None, 0, 1 << 23, 1 << 24, None, 0,
                                     1 << 26, context, batch, q_len, hq, 0.1, None, 0, None)
    assert status == 7, lib.tq_last_error()  # TQ_ERR_WORKSPACE
    need = int(re.search(rb"needs (\d+) bytes", lib.tq_last_error()).group(1))
    row_tiles = -(-q_len * hq // hkv // 16)
    slots = (need - 16) // (4 * d + 8)
    assert slots % (batch * hkv * row_tiles * 16) == 0
    return slots // (batch * hkv * row_tiles * 16)


@needs_library
@pytest.mark.parametrize("shape", sorted(MEASURED_SPLITS))
def test_the_split_plan_is_the_measured_fastest(shape):
    assert planned_splits(*shape) == MEASURED_SPLITS[shape]


# The GPU tests of 8-warp CTAs (tests/gpu/test_attention.py: WIDE_CASES, the fused append beside
# them) -> the splits of their 8-warp plans (256-token steps); 4-warp CTAs would make 32, 32, 43
# and 8, so the count shows which plan a shape takes.
WIDE_TEST_SPLITS = {(1, 40000, 32, 8, 128, 1): 16, (1, 40000, 32, 8, 128, 2): 16,
                    (1, 70000, 9, 3, 64, 1): 40, (8, 32768, 32, 8, 128, 1): 4}


@needs_library
@pytest.mark.parametrize("shape", sorted(WIDE_TEST_SPLITS))
def test_the_gpu_tests_long_cases_run_on_eight_warp_ctas(shape):
    assert planned_splits(*shape) == WIDE_TEST_SPLITS[shape]


@needs_library
def test_the_fused_append_tests_take_both_append_paths():
    """A one-token fused step encodes its new keys and values in CTAs of the split pass where they
    fit beside the splits (4-warp CTAs: 3 of an SM's 4 slots; 8-warp CTAs: one wave of 2 per SM;
    attention.cu, on 132 SMs), else in CTAs of the merge pass. The GPU tests of the fused append
    must run both."""
    one_token = [(len(fused_lengths(1)), max(fused_lengths(1)), d, hq, hkv)
                 for d, hq, hkv, _, _, q_len, _, _ in FUSED_CASES if q_len == 1]
    one_token += [(len(n), max(n), 128, 32, 8) for n in WIDE_FUSED_LENGTHS]
    in_split_pass = set()
    for batch, context, d, hq, hkv in one_token:
        splits = planned_splits(batch, context, hq, hkv, d, 1)
        slots = 132 * 2 if (batch, context, hq, hkv, d, 1) in WIDE_TEST_SPLITS else 132 * 3
        in_split_pass.add(splits * batch * hkv + batch * hkv <= slots)
    assert in_split_pass == {True, False}


@needs_library
def test_library_refuses_a_chunk_stride_of_4_gib():
    """The kernels address a chunk with one 32 x 32-bit product: a stride of 4 GiB or more is
    refused with a reason before any device pointer is touched, never wrapped."""
    codec = DeviceCodec(VectorCodec(CodecSpec(128, 3)), 1, "cpu").struct
    cache = TqPagedCache(k_pool=1 << 20, v_pool=1 << 21, k_chunk_bytes=50 * 16,
                         v_chunk_bytes=(1 << 32) + 16, block_table=1 << 22, max_blocks=1,
                         tokens_per_block=16, num_kv_heads=1, num_chunks=1, key=codec, value=codec)
    lib = kernels.library()
    status = lib.tq_decode_attention(ctypes.byref(cache), None, None, 0, 1 << 23, 1 << 24, None, 0,
                                     1 << 26, 16, 1, 1, 1, 0.1, None, 0, None)
    assert status == 6, lib.tq_last_error()  # TQ_ERR_INVALID_ARGUMENT
    assert b"v_chunk_bytes 4294967312 must be below 4 GiB" in lib.tq_last_error()


@needs_library
@pytest.mark.parametrize("fn_name", ["tq_decode_attention", "tq_prefill_attention"])
def test_library_checks_lse_in_its_argument_position(fn_name):
    """A misaligned lse, or only one of k_new and v_new, is refused before anything touches the
    (fake, host-side) device pointers: this pins where they sit in the C signature and in the
    ctypes argtypes."""
    codec = DeviceCodec(VectorCodec(CodecSpec(128, 3)), 1, "cpu").struct
    cache = TqPagedCache(k_pool=1 << 20, v_pool=1 << 21, k_chunk_bytes=50 * 16,
                         v_chunk_bytes=50 * 16, block_table=1 << 22, max_blocks=1, tokens_per_block=16,
                         num_kv_heads=1, num_chunks=1, key=codec, value=codec)
    lib = kernels.library()
    def call(k_new, v_new, lse):
        return getattr(lib, fn_name)(ctypes.byref(cache), k_new, v_new, 128, 1 << 23, 1 << 24, lse,
                                     0, 1 << 26, 16, 1, 1, 1, 0.1, None, 0, None)

    assert call(None, None, (1 << 25) + 2) == 5  # TQ_ERR_MISALIGNED
    assert b"lse must be 4-byte aligned" in lib.tq_last_error()
    # the new tokens' rows are optional, but only together
    assert call(1 << 27, None, None) == 1 and b"k_new and v_new must be given together" in lib.tq_last_error()


@pytest.mark.parametrize("lse", [torch.zeros(1, 2, 4, dtype=torch.float16), torch.zeros(1, 2, 3),
                                 torch.zeros(1, 4, 2).transpose(1, 2)])
def test_attention_refuses_a_bad_lse(lse):
    """dtype, shape and layout of lse are checked before the library is called (no GPU needed)."""
    kc = SimpleNamespace(head_dim=64, batch=1)  # what is read before the check
    q = torch.zeros(1, 2, 4, 64, dtype=torch.float16)
    with pytest.raises(TQError, match=r"lse must be a contiguous float32 \[1, 2, 4\]"):
        kernels.decode_attention(kc, q, torch.tensor([2]), 2, lse=lse)


def test_attention_refuses_a_page_shift_of_another_head_count():
    kc = SimpleNamespace(head_dim=64, batch=1, page_lse_shift=torch.zeros(3))
    q = torch.zeros(1, 2, 4, 64, dtype=torch.float16)
    with pytest.raises(TQError, match=r"page_lse_shift must hold one value per query head \(4\)"):
        kernels.decode_attention(kc, q, torch.tensor([2]), 2)


@needs_library
def test_library_checks_the_fused_appends_arguments():
    """tq_decode_attention_append refuses missing or misaligned new rows and a short stride before
    touching the (fake, host-side) device pointers, and checks lse in its own position: this pins
    its C signature and ctypes argtypes."""
    codec = DeviceCodec(VectorCodec(CodecSpec(128, 3)), 1, "cpu").struct
    cache = TqPagedCache(k_pool=1 << 20, v_pool=1 << 21, k_chunk_bytes=50 * 16,
                         v_chunk_bytes=50 * 16, block_table=1 << 22, max_blocks=1, tokens_per_block=16,
                         num_kv_heads=1, num_chunks=1, key=codec, value=codec)
    lib = kernels.library()

    def call(k_new, v_new, stride, lse=None):
        return lib.tq_decode_attention_append(ctypes.byref(cache), k_new, v_new, stride, 1 << 23,
                                              1 << 24, lse, 0, 1 << 26, 16, 1, 1, 1, 0.1, None, 0,
                                              None)

    cases = [((None, 1 << 27, 128), 1, b"k_new and v_new must not be NULL"),
             ((1 << 27, (1 << 28) + 2, 128), 5, b"k_new and v_new must be 4-byte aligned"),
             ((1 << 27, 1 << 28, 129), 5, b"new_stride 129 must be even"),
             ((1 << 27, 1 << 28, 64), 6, b"new_stride 64 is smaller than num_kv_heads x head_dim"),
             ((1 << 27, 1 << 28, 128, (1 << 25) + 2), 5, b"lse must be 4-byte aligned")]
    for args, status, message in cases:
        assert call(*args) == status and message in lib.tq_last_error()


def test_own_rows_are_checked_before_the_library_is_called():
    """The new tokens' k and v (own=, the fused append's rows too) are checked against [batch, q_len,
    kv heads, head_dim] and q's dtype before the library is called (no GPU needed)."""
    codecs = SimpleNamespace(gain="unbiased")
    kc = SimpleNamespace(head_dim=64, batch=1, page_lse_shift=None,
                         cache=SimpleNamespace(num_kv_heads=2, key=codecs, value=codecs))
    q = torch.zeros(1, 2, 4, 64, dtype=torch.float16)
    good = torch.zeros(1, 2, 2, 64, dtype=torch.float16)
    with pytest.raises(TQError, match=r"own's v must be \[1, 2, 2, 64\], got \[1, 1, 2, 64\]"):
        kernels.decode_attention(kc, q, torch.tensor([2]), 2, own=(good, good[:, :1]), append=True)
    with pytest.raises(TQError, match="own's k and v must have q's dtype"):
        kernels.prefill_attention(kc, q, torch.tensor([2]), 2, own=(good.float(), good.float()))
    with pytest.raises(TQError, match=r"append=True\) needs own=\(k, v\)"):
        kernels.decode_attention(kc, q, torch.tensor([2]), 2, append=True)
