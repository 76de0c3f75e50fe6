"""tq_trtllm.kernels on any machine: importing needs no GPU, and where the library is built its
page sizes agree with the reference's PageLayout (tq_page_bytes needs no GPU either)."""

import pytest

from tq_trtllm.core.errors import TQError
from tq_trtllm.core.packing import PageLayout
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.spec import SUPPORTED_WIDTHS, CodecSpec
from tq_trtllm import kernels


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
