"""The QuantizedAttention plugin's fields for one layer, and its binary calibration table.

The table layout is specified in docs/PLUGIN.md ("Calibration table field") and read by
plugin_cpp/plugin/calib_table.cpp; this module is its one writer. No TensorRT import: values come
back as plain Python/numpy so a builder wraps them in trt.PluginField itself
(`trt.PluginFieldType.<FIELD_TYPES[array.dtype]>`), or an ONNX node in attributes (onnx_node.py,
after `importable_fields`).
"""

from __future__ import annotations

import struct

import numpy as np
import torch

from ..core.errors import TQError
from ..core.quantizer import VectorCodec
from ..core.spec import FORMAT_VERSION

TABLE_MAGIC = b"TQCT"
TABLE_VERSION = 3
HEADER = struct.Struct("<4sIII Q iiiii I Q II")  # 64 bytes, field order as in docs/PLUGIN.md
ROPE_SCALING = {"none": 0, "linear": 1, "llama3": 2}

# Flag bits: which optional arrays follow the codebooks, in this order.
OPTIONAL_ARRAYS = (("key", "mean", 1 << 0), ("key", "scale", 1 << 1), ("key", "perm", 1 << 2),
                   ("value", "mean", 1 << 3), ("value", "scale", 1 << 4), ("value", "perm", 1 << 5))
PAGE_SHIFT_FLAG = 1 << 6  # the table's page_lse_shift, fp32 [num_q_heads], after the arrays above
# the keys' rotary mean, last: int32 P, int32 channel a [kv_heads][P], fp32 frequency [kv_heads][P],
# fp32 mean [kv_heads][P][2]
ROTARY_FLAG = 1 << 7


# The TensorRT PluginFieldType (a member name of trt.PluginFieldType) of each numpy dtype that
# plugin_fields() and importable_fields() return.
FIELD_TYPES = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FLOAT32", np.dtype(np.int64): "INT64",
               np.dtype(np.uint8): "UNKNOWN", np.dtype(np.int8): "INT8"}


def _fnv1a(data: bytes) -> int:
    h = 2166136261
    for byte in data:
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h


def calibration_table_bytes(key: VectorCodec, value: VectorCodec, *, layer_idx: int, kv_heads: int,
                            num_q_heads: int, fingerprint: int,
                            page_lse_shift: torch.Tensor | None = None) -> bytes:
    """One layer's table from its two codecs (their codebooks, means, scales, permutations, the
    keys' rotary mean) and the table's page shift ([num_q_heads], or None)."""
    head_dim = key.spec.head_dim
    if value.spec.head_dim != head_dim:
        raise TQError("keys and values must share head_dim")
    arrays: dict[tuple[str, str], np.ndarray | None] = {}
    for side, codec in (("key", key), ("value", value)):
        for name in ("mean", "scale", "perm"):
            t = codec.per_head(name, kv_heads)
            arrays[side, name] = None if t is None else t.cpu().numpy()
    payload = b"".join(np.asarray(c, dtype="<f4").tobytes() for codec in (key, value) for c in codec.codebooks)
    flags = 0
    for side, name, bit in OPTIONAL_ARRAYS:
        a = arrays[side, name]
        if a is None:
            continue
        flags |= bit
        payload += np.ascontiguousarray(a, dtype="<i4" if name == "perm" else "<f4").tobytes()
    if page_lse_shift is not None:
        if tuple(page_lse_shift.shape) != (num_q_heads,):
            raise TQError(f"page_lse_shift must hold {num_q_heads} values, one per query head")
        flags |= PAGE_SHIFT_FLAG
        payload += page_lse_shift.detach().cpu().numpy().astype("<f4").tobytes()
    rotary = key.rotary
    if rotary is not None:
        flags |= ROTARY_FLAG
        payload += struct.pack("<i", rotary.freq.shape[-1])
        payload += rotary.channels.cpu().numpy().astype("<i4").tobytes()
        payload += rotary.freq.cpu().numpy().astype("<f4").tobytes()
        payload += rotary.mean.cpu().numpy().astype("<f4").tobytes()
    header = HEADER.pack(TABLE_MAGIC, TABLE_VERSION, FORMAT_VERSION, HEADER.size, fingerprint & (2**64 - 1),
                         layer_idx, kv_heads, head_dim, int(key.spec.width * 2), int(value.spec.width * 2),
                         flags, len(payload), _fnv1a(payload), num_q_heads)
    return header + payload


def plugin_fields(key: VectorCodec, value: VectorCodec, *, num_q_heads: int, kv_heads: int, layer_idx: int,
                  tokens_per_block: int, fingerprint: int, rope_base: float, rope_scaling: str = "none",
                  rope_factor: float = 1.0, rope_low_freq_factor: float = 1.0,
                  rope_high_freq_factor: float = 4.0, rope_original_max_positions: int = 8192,
                  page_lse_shift: torch.Tensor | None = None) -> dict:
    """name -> numpy array (dtype = the field's type; the table as uint8 for kUNKNOWN)."""
    if key.seed != value.seed:
        raise TQError("the plugin takes one rotation seed for keys and values of a layer")
    if rope_scaling not in ROPE_SCALING:
        raise TQError(f"rope scaling {rope_scaling!r} is not supported; use one of {', '.join(ROPE_SCALING)}")
    table = calibration_table_bytes(key, value, layer_idx=layer_idx, kv_heads=kv_heads,
                                    num_q_heads=num_q_heads, fingerprint=fingerprint,
                                    page_lse_shift=page_lse_shift)
    i32, f32 = np.int32, np.float32
    return {
        "num_q_heads": np.array([num_q_heads], i32),
        "num_kv_heads": np.array([kv_heads], i32),
        "head_dim": np.array([key.spec.head_dim], i32),
        "layer_idx": np.array([layer_idx], i32),
        "tokens_per_block": np.array([tokens_per_block], i32),
        "key_width": np.array([key.spec.width], f32),
        "value_width": np.array([value.spec.width], f32),
        "rotation_seed": np.array([key.seed & 0xFFFFFFFF], np.uint32).view(i32),
        "model_fingerprint": np.array([fingerprint & (2**64 - 1)], np.uint64).view(np.int64),
        "rope_base": np.array([rope_base], f32),
        "rope_scaling_type": np.array([ROPE_SCALING[rope_scaling]], i32),
        "rope_scaling_factor": np.array([rope_factor], f32),
        "rope_low_freq_factor": np.array([rope_low_freq_factor], f32),
        "rope_high_freq_factor": np.array([rope_high_freq_factor], f32),
        "rope_original_max_positions": np.array([rope_original_max_positions], i32),
        "calibration_table": np.frombuffer(table, dtype=np.uint8),
    }


def importable_fields(fields: dict) -> dict:
    """`fields` (from plugin_fields) in the forms an ONNX node's attributes can carry: TensorRT's ONNX
    parser makes plugin fields of type kINT32, kFLOAT32, kCHAR and kINT8 only, so the 64-bit
    fingerprint goes as two int32 values (low, high 32 bits) and the table as int8 bytes. The
    plugin accepts both forms and serializes the canonical one (docs/PLUGIN.md, "Fields")."""
    fingerprint = int(fields["model_fingerprint"].view(np.uint64)[0])
    out = dict(fields)
    out["model_fingerprint"] = np.array([fingerprint & 0xFFFFFFFF, fingerprint >> 32], np.uint32).view(np.int32)
    out["calibration_table"] = fields["calibration_table"].view(np.int8)
    return out
