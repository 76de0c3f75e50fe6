"""tq_codec_init, the kernel library's one copy of the rule width -> groups (FORMAT.md section 2),
pinned to the Python reference's (tq_trtllm.core.spec, the oracle): for every supported width at
head_dim 64 and 128 the groups, bits, codebook entries and bytes per token are the reference's and
the codebooks arrive exactly, and every bad input gets its status and a message naming the value
and what is supported. Through the built library (ctypes, no GPU) and through the C++ unit test of
the host-only target tq_codec_host (plugin_cpp/kernels/tests/codec_init_test.cpp, compiled here
with the system C++ compiler: no CUDA)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from required import REQUIRE_CUDA_BUILD, needs
from tq_trtllm import kernels
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.spec import SUPPORTED_HEAD_DIMS, SUPPORTED_WIDTHS, CodecSpec
from tq_trtllm.kernels._lib import TqCodec

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "plugin_cpp" / "kernels"
CXX = shutil.which("c++") or shutil.which("g++")
KERNEL_HEAD_DIMS = (64, 128)
TQ_OK, TQ_ERR_NULL_POINTER, TQ_ERR_UNSUPPORTED_HEAD_DIM, TQ_ERR_UNSUPPORTED_BITS = 0, 1, 2, 3
TQ_ERR_INVALID_ARGUMENT = 6

needs_library = needs(None if kernels.find_library() else "libtq_kernels.so is not built",
                      REQUIRE_CUDA_BUILD)


@needs(None if CXX else "no C++ compiler (c++ or g++) found", REQUIRE_CUDA_BUILD)
def test_cpp_unit_test_of_the_host_target_passes(tmp_path):
    """codec_init_test.cpp against FORMAT.md section 2's table, built from the sources of
    tq_codec_host alone: the rule needs neither CUDA nor a GPU."""
    exe = tmp_path / "codec_init_test"
    built = subprocess.run([CXX, "-std=c++17", "-Wall", "-Werror", "-O1", "-I", str(ROOT / "plugin_cpp" / "include"),
                            str(KERNELS / "tests" / "codec_init_test.cpp"), str(KERNELS / "codec.cpp"),
                            str(KERNELS / "last_error.cpp"), "-o", str(exe)], capture_output=True, text=True)
    assert built.returncode == 0, f"could not compile codec_init_test.cpp:\n{built.stderr}"
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip().endswith("codec_init_test: ok"), done.stdout + done.stderr


def _levels(spec: CodecSpec, rng: np.random.Generator) -> list[np.ndarray]:
    """Random strictly ascending float32 codebooks, one per group, some not exactly representable
    in fewer bits (the library must copy them as given)."""
    return [np.sort(rng.standard_normal(2**g.bits)).astype(np.float32) for g in spec.groups]


def _init(head_dim: int, width_x2: int, codebooks, entries: int | None = None, seed: int = 0):
    lib = kernels.library()
    s = TqCodec()
    flat = None if codebooks is None else np.ascontiguousarray(np.concatenate(codebooks), dtype=np.float32)
    pointer = None if flat is None else flat.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    n = (0 if flat is None else flat.size) if entries is None else entries
    status = lib.tq_codec_init(ctypes.byref(s), head_dim, width_x2, seed, pointer, n)
    return status, s, lib.tq_last_error().decode()


@needs_library
@pytest.mark.parametrize("head_dim", KERNEL_HEAD_DIMS)
@pytest.mark.parametrize("width", SUPPORTED_WIDTHS)
def test_groups_bits_entries_and_bytes_are_the_references(width, head_dim):
    lib = kernels.library()
    spec = CodecSpec(head_dim, width)
    width_x2 = round(2 * width)
    books = _levels(spec, np.random.default_rng(width_x2 * 1000 + head_dim))
    assert lib.tq_codec_codebook_entries(head_dim, width_x2) == sum(2**g.bits for g in spec.groups)
    status, s, message = _init(head_dim, width_x2, books, seed=0xDEADBEEF)
    assert status == TQ_OK, message
    assert (s.head_dim, s.num_groups, s.seed) == (head_dim, len(spec.groups), 0xDEADBEEF)
    for i, g in enumerate(spec.groups):
        assert (s.group_dim[i], s.group_bits[i]) == (g.dim, g.bits), (i, g)
        got = np.array(s.codebook[i][:2**g.bits], dtype=np.float32)
        assert got.tobytes() == books[i].tobytes(), f"group {i}'s codebook is not copied exactly"
    assert sum(s.group_dim[i] for i in range(s.num_groups)) == head_dim
    assert not any((s.perm, s.mean, s.scale, s.rotary_channel, s.rotary_freq, s.rotary_mean, s.rotary_pairs))
    assert lib.tq_codec_token_bytes(ctypes.byref(s)) == spec.bytes_per_token
    # pages of the analytic codebooks (random ones may break the kernels' grid constraints)
    status, s, message = _init(head_dim, width_x2, [c.numpy() for c in VectorCodec(spec).codebooks])
    assert status == TQ_OK, message
    for tokens in (16, 64):
        assert lib.tq_page_bytes(ctypes.byref(s), tokens) == spec.page_bytes(tokens), lib.tq_last_error()
    status, zeros, message = _init(head_dim, width_x2, None)
    assert status == TQ_OK and lib.tq_codec_token_bytes(ctypes.byref(zeros)) == spec.bytes_per_token, message


@needs_library
def test_the_library_takes_exactly_the_references_widths_and_the_kernels_head_dims():
    """width_x2 -1..12: accepted exactly where width_x2 / 2 is one of SUPPORTED_WIDTHS; head dims:
    the kernels' 64 and 128, a subset of the format's."""
    lib = kernels.library()
    for width_x2 in range(-1, 13):
        assert (lib.tq_codec_codebook_entries(128, width_x2) > 0) == (width_x2 / 2 in SUPPORTED_WIDTHS), width_x2
    assert set(KERNEL_HEAD_DIMS) <= set(SUPPORTED_HEAD_DIMS)
    for head_dim in (0, 16, 32, 63, 64, 96, 128, 256, 512):
        assert (lib.tq_codec_codebook_entries(head_dim, 6) > 0) == (head_dim in KERNEL_HEAD_DIMS), head_dim


WIDTHS_TEXT = "supported widths are 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5 and 5 (width_x2 2 to 10)"
BAD_INPUTS = {
    # name: (head_dim, width_x2, codebooks, entries, status, message)
    "head_dim 96": (96, 6, [np.arange(8)], None, TQ_ERR_UNSUPPORTED_HEAD_DIM,
                    "tq_codec_init: head_dim 96 is not supported by the CUDA kernels; supported head dims are 64 and 128"),
    "head_dim 256": (256, 6, [np.arange(8)], None, TQ_ERR_UNSUPPORTED_HEAD_DIM, "head_dim 256 is not supported"),
    "width_x2 11": (128, 11, [np.arange(48)], None, TQ_ERR_UNSUPPORTED_BITS,
                    f"tq_codec_init: width_x2 11 (a width of 5.5 bits) is not supported; {WIDTHS_TEXT}"),
    "width_x2 1": (128, 1, [np.arange(2)], None, TQ_ERR_UNSUPPORTED_BITS, "width_x2 1 (a width of 0.5 bits)"),
    "width_x2 0": (64, 0, None, None, TQ_ERR_UNSUPPORTED_BITS, WIDTHS_TEXT),
    "too few entries": (128, 6, [np.arange(7)], None, TQ_ERR_INVALID_ARGUMENT,
                        "tq_codec_init: num_codebook_entries 7, but width 3 at head_dim 128 takes 8 (2^b levels of "
                        "each group, back to back: 128 x 3 bits)"),
    "one group's entries of a fractional width": (64, 7, [np.arange(16)], None, TQ_ERR_INVALID_ARGUMENT,
                                                  "takes 24 (2^b levels of each group, back to back: 32 x 4 bits, "
                                                  "32 x 3 bits)"),
    "NULL codebooks with entries": (128, 6, None, 8, TQ_ERR_NULL_POINTER,
                                    "tq_codec_init: codebooks is NULL but num_codebook_entries is 8; pass the 8 "
                                    "levels of width 3"),
    "a repeated level": (128, 4, [[-1, 0, 0, 1]], None, TQ_ERR_INVALID_ARGUMENT,
                         "codebook entry 2 (group 0, level 2) is 0, not above the level before it (0); each "
                         "group's levels must be strictly ascending"),
    "descending second group": (128, 5, [np.arange(8), [3, 2, 1, 0]], None, TQ_ERR_INVALID_ARGUMENT,
                                "codebook entry 9 (group 1, level 1) is 2, not above"),
    "NaN": (64, 2, [[-1, np.nan]], None, TQ_ERR_INVALID_ARGUMENT,
            "codebook entry 1 (group 0, level 1) is nan; every level must be finite"),
    "infinity": (64, 2, [[-np.inf, 1]], None, TQ_ERR_INVALID_ARGUMENT, "entry 0 (group 0, level 0) is -inf"),
}


@needs_library
@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_gets_its_status_and_a_message_naming_it(name):
    head_dim, width_x2, books, entries, status, message = BAD_INPUTS[name]
    books = None if books is None else [np.asarray(b, dtype=np.float32) for b in books]
    got, _, text = _init(head_dim, width_x2, books, entries)
    assert got == status and message in text, (got, text)


@needs_library
def test_null_codec_and_bad_codecs_are_refused():
    lib = kernels.library()
    assert lib.tq_codec_init(None, 128, 6, 0, None, 0) == TQ_ERR_NULL_POINTER
    assert lib.tq_last_error() == b"tq_codec_init: codec is NULL"
    assert lib.tq_codec_token_bytes(None) == -1 and b"codec is NULL" in lib.tq_last_error()
    status, s, _ = _init(128, 5, None)
    assert status == TQ_OK
    s.group_bits[0], s.group_bits[1] = 2, 3  # the outlier half must come first
    assert lib.tq_codec_token_bytes(ctypes.byref(s)) == -1
    assert b"groups (64 x 2 bits, 64 x 3 bits) are not those of a width" in lib.tq_last_error()
    assert b"width 2.5 has 64 x 3 bits, 64 x 2 bits" in lib.tq_last_error()
    assert lib.tq_codec_codebook_entries(128, 12) == -1
    assert lib.tq_last_error().startswith(b"tq_codec_codebook_entries: width_x2 12 (a width of 6 bits)")


@needs_library
def test_a_refused_call_leaves_the_codec_as_it_was():
    status, s, _ = _init(128, 6, [np.arange(8)], seed=5)
    before = bytes(s)
    lib = kernels.library()
    bad = np.array([0, 1, 2, 3, 4, 5, 7, 6], dtype=np.float32)
    assert lib.tq_codec_init(ctypes.byref(s), 64, 4, 9, bad.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 8) \
        == TQ_ERR_INVALID_ARGUMENT
    assert bytes(s) == before
