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
from tq_trtllm.kernels._lib import TqAttentionParams, TqAttentionPlanInfo, TqPagedCache
from tq_trtllm.kernels.ops import DeviceCodec

from required import REQUIRE_CUDA_BUILD, needs
from gpu.test_attention import FUSED_CASES, WIDE_FUSED_LENGTHS, fused_lengths


def test_import_needs_no_gpu_and_says_why_it_cannot_run():
    reason = kernels.unavailable_reason()
    assert reason is None or isinstance(reason, str) and reason


needs_library = needs(None if kernels.find_library() else "libtq_kernels.so is not built",
                      REQUIRE_CUDA_BUILD)


@needs_library
def test_device_codecs_carry_the_tables_scales(gen):
    """Each side's per-head scale reaches its tq_codec (the value scale is multiplied back in by the
    attention merge and by dequantize); building the structs needs the library (tq_codec_init), no
    GPU."""
    key_scale, value_scale = (torch.rand(2, 64, generator=gen, dtype=torch.float64) + 0.5 for _ in range(2))
    table = LayerTable(3.0, 2.5, 5, key_scale=key_scale, value_scale=value_scale,
                       value_outliers=torch.arange(32).repeat(2, 1))
    for codec, scale in zip(table.codecs(64), (key_scale, value_scale)):
        dc = DeviceCodec(codec, 2, "cpu")
        assert dc.struct.scale == dc.scale.data_ptr() and torch.equal(dc.scale, scale.float())
    assert DeviceCodec(LayerTable(3.0, 3.0, 5).codecs(64)[1], 2, "cpu").struct.scale is None


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


def fake_cache(hkv=1, d=128, tokens=16, max_blocks=1, chunk_bytes=50 * 16, v_chunk_bytes=None):
    """A 3-bit cache description at fake, host-side device addresses (never read: every call below
    is refused, or stops at the workspace check, before anything is launched)."""
    codec = DeviceCodec(VectorCodec(CodecSpec(d, 3)), hkv, "cpu").struct
    return TqPagedCache(k_pool=1 << 20, v_pool=1 << 21, k_chunk_bytes=chunk_bytes,
                        v_chunk_bytes=chunk_bytes if v_chunk_bytes is None else v_chunk_bytes,
                        block_table=1 << 22, max_blocks=max_blocks, tokens_per_block=tokens,
                        num_kv_heads=hkv, num_chunks=1, key=codec, value=codec)


def plan_of(batch, q_len, hq, hkv, d, max_kv_len, num_sms=132):
    plan = TqAttentionPlanInfo()
    lib = kernels.library()
    assert lib.tq_attention_plan(batch, q_len, hq, hkv, d, max_kv_len, num_sms, ctypes.byref(plan)) == 0, \
        lib.tq_last_error()
    return plan


def run_status(cache, batch=1, q_len=1, hq=1, max_kv_len=16, plan=None, workspace=None, workspace_bytes=0,
               **fields):
    """tq_attention_run's status for a call over `cache` at fake device addresses (q, out, kv_lens),
    planned for its own shape unless `plan` is given; fields set the other params (k_new, v_new,
    new_stride, lse, append, dtype, softmax_scale, ...)."""
    lib = kernels.library()
    if plan is None:
        plan = plan_of(batch, q_len, hq, cache.num_kv_heads, cache.key.head_dim, max_kv_len)
    args = dict(q=1 << 23, out=1 << 24, kv_lens=1 << 26, softmax_scale=0.1, dtype=0) | fields
    params = TqAttentionParams(cache=ctypes.pointer(cache), max_kv_len=max_kv_len, batch=batch, q_len=q_len,
                               num_q_heads=hq, **args)
    return lib.tq_attention_run(ctypes.byref(plan), ctypes.byref(params), workspace, workspace_bytes, None)


def planned_splits(batch, context, hq, hkv, d, q_len):
    """The library's splits per sequence for a decode call of 3-bit codecs on 132 SMs. The split
    count shows in the workspace the call needs (16 rows of d floats and one float2 per split and
    row tile), which tq_attention_run reports before it touches any device pointer: it also pins
    the run's choice between the plan's 4- and 8-warp CTAs by the codecs' shared memory."""
    chunk = kernels.page_bytes(VectorCodec(CodecSpec(d, 3)), 64) * hkv
    cache = fake_cache(hkv, d, 64, -(-context // 64), chunk)
    lib = kernels.library()
    status = run_status(cache, batch, q_len, hq, context)
    assert status == 7, lib.tq_last_error()  # TQ_ERR_WORKSPACE
    need = int(re.search(rb"needs (\d+) bytes", lib.tq_last_error()).group(1))
    row_tiles = -(-q_len * hq // hkv // 16)
    slots = (need - 16) // (4 * d + 8)
    assert slots % (batch * hkv * row_tiles * 16) == 0
    plan = plan_of(batch, q_len, hq, hkv, d, context)
    assert need <= plan.workspace_bytes
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
    lib = kernels.library()
    assert run_status(fake_cache(v_chunk_bytes=(1 << 32) + 16)) == 6, lib.tq_last_error()  # INVALID_ARGUMENT
    assert b"v_chunk_bytes 4294967312 must be below 4 GiB" in lib.tq_last_error()


@needs_library
def test_library_checks_lse_and_the_new_rows_in_their_fields():
    """A misaligned lse, or only one of k_new and v_new, is refused before anything touches the
    (fake, host-side) device pointers: this pins where they sit in tq_attention_params and in its
    ctypes mirror."""
    lib = kernels.library()
    cache = fake_cache()
    assert run_status(cache, lse=(1 << 25) + 2) == 5  # TQ_ERR_MISALIGNED
    assert b"lse must be 4-byte aligned" in lib.tq_last_error()
    # the new tokens' rows are optional, but only together
    assert run_status(cache, k_new=1 << 27, new_stride=128) == 1
    assert b"k_new and v_new must be given together" in lib.tq_last_error()


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
    """The fused append (append=1) refuses missing or misaligned new rows, a short stride and a
    call longer than a decode step before touching the (fake, host-side) device pointers, and
    checks lse with it: this pins the fields of tq_attention_params and their ctypes mirror."""
    cache = fake_cache()
    lib = kernels.library()
    cases = [(dict(v_new=1 << 27), 1, b"given together"),
             (dict(), 1, b"append needs k_new and v_new"),
             (dict(k_new=1 << 27, v_new=(1 << 28) + 2), 5, b"k_new and v_new must be 4-byte aligned"),
             (dict(k_new=1 << 27, v_new=1 << 28, new_stride=129), 5, b"new_stride 129 must be even"),
             (dict(k_new=1 << 27, v_new=1 << 28, new_stride=64), 6,
              b"new_stride 64 is smaller than num_kv_heads x head_dim"),
             (dict(k_new=1 << 27, v_new=1 << 28, lse=(1 << 25) + 2), 5, b"lse must be 4-byte aligned"),
             (dict(k_new=1 << 27, v_new=1 << 28, q_len=9), 4, b"append takes q_len 1..8"),
             (dict(k_new=1 << 27, v_new=1 << 28, append=2), 6, b"append 2 must be 0 or 1")]
    for fields, status, message in cases:
        rows = {"new_stride": 128, "append": 1} | fields
        q_len = rows.pop("q_len", 1)
        assert run_status(cache, q_len=q_len, max_kv_len=16, **rows) == status, (fields, lib.tq_last_error())
        assert message in lib.tq_last_error(), fields


@needs_library
@pytest.mark.parametrize("args, status, message", [
    ((0, 1, 8, 8, 128, 10, 0), 4, b"batch 0 must be >= 1"),
    ((1, 0, 8, 8, 128, 10, 0), 4, b"q_len 0 in 1..1048576"),
    ((1, 1 << 21, 8, 8, 128, 10, 0), 4, b"q_len 2097152 in 1..1048576"),
    ((1, 1, 8, 8, 128, -1, 0), 4, b"max_kv_len -1 must be >= 0"),
    ((65536, 1, 8, 8, 128, 10, 0), 4, b"exceeds the grid limit"),
    ((1, 1, 12, 8, 128, 10, 0), 6, b"num_q_heads 12 must be 1 to 8 times num_kv_heads 8"),
    ((1, 1, 72, 8, 128, 10, 0), 6, b"num_q_heads 72"),
    ((1, 1, 8, 0, 128, 10, 0), 6, b"num_kv_heads 0"),
    ((1, 1, 8, 8, 96, 10, 0), 2, b"head_dim 96 is not supported"),
    ((1, 1, 8, 8, 128, 10, -1), 6, b"num_sms -1 must be >= 0"),
])
def test_the_plan_refuses_each_bad_shape(args, status, message):
    lib = kernels.library()
    plan = TqAttentionPlanInfo()
    assert lib.tq_attention_plan(*args, ctypes.byref(plan)) == status
    assert message in lib.tq_last_error()
    assert lib.tq_attention_plan(*args, None) == 1  # TQ_ERR_NULL_POINTER: no plan to fill


@needs_library
def test_a_plan_is_deterministic_and_says_what_it_planned():
    """The same shape gives the same plan; its fields are the shape, the SM count, the pass and
    the splits of both CTA shapes (1 x 131,072 on 132 SMs: 49 splits of 4-warp CTAs, 32 of 8)."""
    first, second = plan_of(1, 1, 32, 8, 128, 131072), plan_of(1, 1, 32, 8, 128, 131072)
    assert bytes(first) == bytes(second)
    assert (first.batch, first.q_len, first.num_q_heads, first.num_kv_heads, first.head_dim,
            first.max_kv_len, first.num_sms) == (1, 1, 32, 8, 128, 131072, 132)
    assert (first.prefill, first.num_splits, first.wide_num_splits) == (0, 49, 32)
    assert plan_of(1, 100, 32, 8, 128, 4096).prefill == 1
    # the Python front end plans a shape once and reuses the plan (every layer of a step)
    shape = (1, 1, 32, 8, 128, 131072, 132)
    assert kernels.attention_plan(*shape) is kernels.attention_plan(*shape)


@needs_library
@pytest.mark.parametrize("fields, status, message", [
    (dict(batch=2), 6, b"is not the shape its plan was made for"),
    (dict(q_len=2), 6, b"is not the shape its plan was made for"),
    (dict(hq=2), 6, b"is not the shape its plan was made for"),
    (dict(max_kv_len=15), 6, b"is not the shape its plan was made for"),
    (dict(q=None), 1, b"q, out and kv_lens must not be NULL"),
    (dict(out=None), 1, b"q, out and kv_lens must not be NULL"),
    (dict(kv_lens=None), 1, b"q, out and kv_lens must not be NULL"),
    (dict(dtype=2), 6, b"dtype 2 is neither TQ_FP16 nor TQ_BF16"),
    (dict(softmax_scale=0.0), 6, b"softmax_scale must be positive and finite"),
    (dict(softmax_scale=float("inf")), 6, b"softmax_scale must be positive and finite"),
    (dict(workspace=1 << 29, workspace_bytes=16), 7, b"the workspace needs"),
    (dict(workspace=(1 << 29) + 8, workspace_bytes=1 << 20), 5, b"the workspace must be 16-byte aligned"),
])
def test_the_run_refuses_each_bad_argument(fields, status, message):
    """Every check of tq_attention_run against a plan of batch 1, q_len 1, one query head and 16
    positions answers with its status and message before anything is launched."""
    lib = kernels.library()
    call = {"batch": 1, "q_len": 1, "hq": 1, "max_kv_len": 16} | fields
    assert run_status(fake_cache(), plan=plan_of(1, 1, 1, 1, 128, 16), **call) == status, lib.tq_last_error()
    assert message in lib.tq_last_error()


@needs_library
def test_the_run_refuses_a_length_beyond_the_block_table_and_a_missing_plan():
    lib = kernels.library()
    assert run_status(fake_cache(), max_kv_len=17) == 4 and b"beyond the block table" in lib.tq_last_error()
    params = TqAttentionParams()
    assert lib.tq_attention_run(None, ctypes.byref(params), None, 0, None) == 1
    assert b"plan and params must not be NULL" in lib.tq_last_error()


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
