"""tq_trtllm.kernels on any machine: importing needs no GPU, and where the library is built its
page sizes agree with the reference's PageLayout (tq_page_bytes needs no GPU either) and its
host-side argument checks answer through the ctypes signatures."""

import ctypes
from types import SimpleNamespace

import pytest
import torch

from tq_trtllm.core.errors import TQError
from tq_trtllm.core.packing import PageLayout
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.spec import SUPPORTED_WIDTHS, CodecSpec
from tq_trtllm import kernels
from tq_trtllm.kernels._lib import TqPagedCache
from tq_trtllm.kernels.ops import DeviceCodec


def test_import_needs_no_gpu_and_says_why_it_cannot_run():
    reason = kernels.unavailable_reason()
    assert reason is None or isinstance(reason, str) and reason


needs_library = pytest.mark.skipif(kernels.find_library() is None,
                                   reason="libtq_kernels.so is not built")


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
@pytest.mark.parametrize("fn_name", ["tq_decode_attention", "tq_prefill_attention"])
def test_library_checks_lse_in_its_argument_position(fn_name):
    """A misaligned lse is refused before anything touches the (fake, host-side) device pointers:
    this pins where lse sits in the C signature and in the ctypes argtypes."""
    codec = DeviceCodec(VectorCodec(CodecSpec(128, 3)), 1, "cpu").struct
    cache = TqPagedCache(k_pool=1 << 20, v_pool=1 << 21, k_chunk_bytes=50 * 16,
                         v_chunk_bytes=50 * 16, block_table=1 << 22, max_blocks=1, tokens_per_block=16,
                         num_kv_heads=1, num_chunks=1, key=codec, value=codec)
    lib = kernels.library()
    status = getattr(lib, fn_name)(ctypes.byref(cache), 1 << 23, 1 << 24, (1 << 25) + 2, 0, 1 << 26,
                                   16, 1, 1, 1, 0.1, None, 0, None)
    assert status == 5 and b"lse must be 4-byte aligned" in lib.tq_last_error()  # TQ_ERR_MISALIGNED


@pytest.mark.parametrize("lse", [torch.zeros(1, 2, 4, dtype=torch.float16), torch.zeros(1, 2, 3),
                                 torch.zeros(1, 4, 2).transpose(1, 2)])
def test_attention_refuses_a_bad_lse(lse):
    """dtype, shape and layout of lse are checked before the library is called (no GPU needed)."""
    kc = SimpleNamespace(head_dim=64, batch=1)  # what is read before the check
    q = torch.zeros(1, 2, 4, 64, dtype=torch.float16)
    with pytest.raises(TQError, match=r"lse must be a contiguous float32 \[1, 2, 4\]"):
        kernels.decode_attention(kc, q, torch.tensor([2]), 2, lse=lse)
