"""Loading libtq_kernels.so and the ctypes mirrors of plugin_cpp/include/tq/tq_kernels.h.

The library is loaded on first use, so importing tq_trtllm.kernels works on machines without a GPU
or without the built library. Search order: $TQ_KERNELS_LIB, tq_trtllm/lib/ inside the installed
package, then <repo>/build/plugin_cpp/kernels/ of a source checkout (build_scripts/build_kernels.sh).
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache
from pathlib import Path

from ..core.errors import TQError
from ..core.spec import FORMAT_VERSION, PLANES

LIB_NAME = "libtq_kernels.so"
MAX_GROUPS = 2
MAX_BITS = max(PLANES)  # TQ_MAX_BITS: the widest code, whose 2**MAX_BITS centroids tq_codec holds
MAX_DECODE_Q_LEN = 8  # TQ_MAX_DECODE_Q_LEN: query tokens per sequence of a call with the fused append
ABI_VERSION = 3  # TQ_ABI_VERSION: the C ABI these mirrors and signatures declare
FP16, BF16 = 0, 1

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


class TqCodec(ctypes.Structure):
    _fields_ = [
        ("head_dim", ctypes.c_int32),
        ("num_groups", ctypes.c_int32),
        ("group_dim", ctypes.c_int32 * MAX_GROUPS),
        ("group_bits", ctypes.c_int32 * MAX_GROUPS),
        ("codebook", (ctypes.c_float * 2**MAX_BITS) * MAX_GROUPS),
        ("seed", ctypes.c_uint32),
        ("perm", ctypes.c_void_p),
        ("mean", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("rotary_pairs", ctypes.c_int32),
        ("rotary_channel", ctypes.c_void_p),
        ("rotary_freq", ctypes.c_void_p),
        ("rotary_mean", ctypes.c_void_p),
    ]


class TqPagedCache(ctypes.Structure):
    _fields_ = [
        ("k_pool", ctypes.c_void_p),
        ("v_pool", ctypes.c_void_p),
        ("k_chunk_bytes", ctypes.c_int64),
        ("v_chunk_bytes", ctypes.c_int64),
        ("block_table", ctypes.c_void_p),
        ("max_blocks", ctypes.c_int32),
        ("tokens_per_block", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("num_chunks", ctypes.c_int32),
        ("key", TqCodec),
        ("value", TqCodec),
        ("page_lse_shift", ctypes.c_void_p),
    ]


class TqAttentionParams(ctypes.Structure):
    _fields_ = [
        ("cache", ctypes.POINTER(TqPagedCache)),
        ("q", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("k_new", ctypes.c_void_p),
        ("v_new", ctypes.c_void_p),
        ("new_stride", ctypes.c_int64),
        ("kv_lens", ctypes.c_void_p),
        ("max_kv_len", ctypes.c_int32),
        ("batch", ctypes.c_int32),
        ("q_len", ctypes.c_int32),
        ("num_q_heads", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("dtype", ctypes.c_int),
        ("append", ctypes.c_int32),
    ]


class TqAttentionPlanInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in (
        "batch", "q_len", "num_q_heads", "num_kv_heads", "head_dim", "max_kv_len", "num_sms", "prefill",
        "num_splits", "split_tokens", "wide_num_splits", "wide_split_tokens")] + [
        ("workspace_bytes", ctypes.c_size_t)]


def candidate_paths() -> list[Path]:
    paths = []
    if os.environ.get("TQ_KERNELS_LIB"):
        paths.append(Path(os.environ["TQ_KERNELS_LIB"]))
    # Every directory of the package: an editable install keeps the built library in site-packages
    # while the Python files stay in the checkout.
    import tq_trtllm

    paths.extend(Path(d) / "lib" / LIB_NAME for d in tq_trtllm.__path__)
    paths.append(_PACKAGE_DIR.parent / "build" / "plugin_cpp" / "kernels" / LIB_NAME)
    return paths


def find_library() -> Path | None:
    """The first existing candidate, or None."""
    return next((p for p in candidate_paths() if p.is_file()), None)


_P = ctypes.c_void_p
_I32 = ctypes.c_int32
_SIGNATURES = {
    "tq_last_error": (ctypes.c_char_p, []),
    "tq_check_format_version": (ctypes.c_int, [_I32]),
    # (codec, head_dim, width_x2, seed, codebooks, num_codebook_entries)
    "tq_codec_init": (ctypes.c_int, [ctypes.POINTER(TqCodec), _I32, _I32, ctypes.c_uint32,
                                     ctypes.POINTER(ctypes.c_float), _I32]),
    "tq_codec_codebook_entries": (_I32, [_I32, _I32]),
    "tq_codec_token_bytes": (ctypes.c_int64, [ctypes.POINTER(TqCodec)]),
    "tq_page_bytes": (ctypes.c_int64, [ctypes.POINTER(TqCodec), _I32]),
    "tq_codebook_levels": (ctypes.c_int, [ctypes.POINTER(TqCodec), _I32, ctypes.POINTER(ctypes.c_float)]),
    "tq_quantize_append": (ctypes.c_int, [ctypes.POINTER(TqPagedCache), _P, _P, ctypes.c_int64,
                                          ctypes.c_int, _P, _P, _I32, _I32, _P]),
    "tq_abi_version": (_I32, []),
    # (batch, q_len, num_q_heads, num_kv_heads, head_dim, max_kv_len, num_sms, plan)
    "tq_attention_plan": (ctypes.c_int, [_I32] * 7 + [ctypes.POINTER(TqAttentionPlanInfo)]),
    # (plan, params, workspace, workspace_bytes, stream)
    "tq_attention_run": (ctypes.c_int, [ctypes.POINTER(TqAttentionPlanInfo),
                                        ctypes.POINTER(TqAttentionParams), _P, ctypes.c_size_t, _P]),
    "tq_dequantize": (ctypes.c_int, [ctypes.POINTER(TqPagedCache), _I32, _I32, _I32, _P, _P,
                                     ctypes.c_int, _P]),
}


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded library with its signatures declared; TQError naming the searched paths if absent."""
    path = find_library()
    if path is None:
        searched = ", ".join(str(p) for p in candidate_paths())
        raise TQError(f"{LIB_NAME} not found (searched {searched}); build it with "
                      "build_scripts/build_kernels.sh or set TQ_KERNELS_LIB")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise TQError(f"cannot load {path}: {exc}") from None
    abi = getattr(lib, "tq_abi_version", None)
    found = abi() if abi is not None else 1
    if found != ABI_VERSION:
        raise TQError(f"{path} has C ABI version {found}, this package needs {ABI_VERSION}; rebuild it "
                      "with build_scripts/build_kernels.sh (or point TQ_KERNELS_LIB at a current build)")
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    _check(lib, lib.tq_check_format_version(FORMAT_VERSION), "tq_check_format_version")
    return lib


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        message = lib.tq_last_error().decode(errors="replace")
        raise TQError(f"{what} failed (status {status}): {message}")


def check(status: int, what: str) -> None:
    """Raise TQError with the library's message when a call did not return TQ_OK."""
    _check(library(), status, what)
