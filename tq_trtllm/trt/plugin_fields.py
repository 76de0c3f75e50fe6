"""The QuantizedAttention plugin's fields for one layer, and the layer table they carry.

Two different things hold calibration:
- the calibration table: the model-wide `KVTable` (tq_trtllm/calibration/table.py) and its
  safetensors file (calibration/tables_io.py, `CALIBRATION_FILE_VERSION`);
- the layer table: one layer's part of it, serialized with that layer's identity (index, heads,
  head_dim, widths, rotation seed, model fingerprint) as the binary blob (magic `TQCT`,
  `LAYER_TABLE_VERSION`) that the plugin's `layer_table` field carries. It is the plugin's only
  source of those values. docs/PLUGIN.md ("Layer table field") specifies it,
  plugin_cpp/plugin/layer_table.cpp reads it, and `layer_table_bytes` is its one writer.

The fields are declared once, in quantized_attention_fields.json (the plugin's name, namespace and
version; each field's name, TensorRT type and order); the C++ creator's field table is generated
from the same file at configure time, and `plugin_fields` builds its dict from it. No TensorRT or
torch import: values come back as numpy arrays so a builder wraps them in trt.PluginField itself
(`trt.PluginFieldType.<FIELD_TYPES[array.dtype]>`), or an ONNX node in attributes (onnx_node.py,
after `importable_fields`).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import struct
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..core.errors import TQError
from ..core.spec import FORMAT_VERSION

if TYPE_CHECKING:
    from ..calibration.table import KVTable

DECLARATION = "quantized_attention_fields.json"
LAYER_TABLE_MAGIC = b"TQCT"
LAYER_TABLE_VERSION = 4
# 72 bytes, little-endian, in the order of docs/PLUGIN.md's header table
HEADER = struct.Struct("<4sIII Q iiiii I Q II I I")
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
_DTYPES = {name: dtype for dtype, name in FIELD_TYPES.items()}


class LayerTableHeader(NamedTuple):
    """The layer table's header, in order (docs/PLUGIN.md section 3)."""

    magic: bytes
    version: int
    format_version: int
    header_bytes: int
    model_fingerprint: int
    layer_idx: int
    num_kv_heads: int
    head_dim: int
    key_width_x2: int
    value_width_x2: int
    flags: int
    payload_bytes: int
    checksum: int
    num_q_heads: int
    rotation_seed: int
    reserved: int


@functools.cache
def declaration() -> dict:
    """quantized_attention_fields.json, read once from the installed package."""
    text = importlib.resources.files(__package__).joinpath(DECLARATION).read_text(encoding="utf-8")
    return json.loads(text)


PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION = (declaration()["plugin"][k] for k in ("name", "namespace", "version"))


def _fnv1a(data: bytes) -> int:
    h = 2166136261
    for byte in data:
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h


def layer_table_bytes(table: KVTable, layer: int, *, num_q_heads: int, num_kv_heads: int,
                      fingerprint: int) -> bytes:
    """Layer `layer` of `table` as the plugin's layer table: its two codecs (codebooks, means,
    scales, permutations, the keys' rotary mean, the rotation seed they share), its page shift
    ([num_q_heads], or none), the widths and head_dim, and the identity given here (the heads of
    this tensor-parallel rank, the model's 64-bit fingerprint)."""
    if not 0 <= layer < len(table.layers):
        raise TQError(f"layer {layer} is not in the calibration table (it has {len(table.layers)} layers)")
    entry = table.layers[layer]
    if not 0 <= entry.seed < 2**32:
        raise TQError(f"layer {layer}'s rotation seed {entry.seed} is not a uint32 (FORMAT.md section 4); "
                      "recalibrate with a seed in [0, 2^32)")
    key, value = table.codecs(layer)
    arrays = {}
    for side, codec in (("key", key), ("value", value)):
        for name in ("mean", "scale", "perm"):
            try:
                t = codec.per_head(name, num_kv_heads)
            except RuntimeError:
                raise TQError(f"layer {layer}'s {side} {name} has {tuple(getattr(codec, name).shape)} values, "
                              f"not one row per KV head ({num_kv_heads})") from None
            arrays[side, name] = None if t is None else t.cpu().numpy()
    payload = b"".join(np.asarray(c, dtype="<f4").tobytes() for codec in (key, value) for c in codec.codebooks)
    flags = 0
    for side, name, bit in OPTIONAL_ARRAYS:
        a = arrays[side, name]
        if a is None:
            continue
        flags |= bit
        payload += np.ascontiguousarray(a, dtype="<i4" if name == "perm" else "<f4").tobytes()
    shift = entry.page_lse_shift
    if shift is not None:
        if tuple(shift.shape) != (num_q_heads,):
            raise TQError(f"layer {layer}'s page_lse_shift holds {tuple(shift.shape)} values, not "
                          f"{num_q_heads}, one per query head")
        flags |= PAGE_SHIFT_FLAG
        payload += shift.detach().cpu().numpy().astype("<f4").tobytes()
    rotary = key.rotary
    if rotary is not None:
        flags |= ROTARY_FLAG
        payload += struct.pack("<i", rotary.freq.shape[-1])
        payload += rotary.channels.cpu().numpy().astype("<i4").tobytes()
        payload += rotary.freq.cpu().numpy().astype("<f4").tobytes()
        payload += rotary.mean.cpu().numpy().astype("<f4").tobytes()
    header = HEADER.pack(LAYER_TABLE_MAGIC, LAYER_TABLE_VERSION, FORMAT_VERSION, HEADER.size,
                         fingerprint & (2**64 - 1), layer, num_kv_heads, table.head_dim,
                         int(key.spec.width * 2), int(value.spec.width * 2), flags, len(payload),
                         _fnv1a(payload), num_q_heads, entry.seed, 0)
    return header + payload


def layer_table_header(layer_table: bytes | np.ndarray) -> LayerTableHeader:
    """The header of a layer table written by layer_table_bytes (checked: magic and version)."""
    data = bytes(layer_table[:HEADER.size])
    if len(data) < HEADER.size or data[:4] != LAYER_TABLE_MAGIC:
        raise TQError("these bytes are not a layer table (no TQCT header)")
    header = LayerTableHeader(*HEADER.unpack(data))
    if header.version != LAYER_TABLE_VERSION:
        raise TQError(f"the layer table has version {header.version}, this tq_trtllm reads version "
                      f"{LAYER_TABLE_VERSION}; rebuild it with this tq_trtllm")
    return header


def plugin_fields(layer_table: bytes, *, tokens_per_block: int, rope_base: float, rope_scaling: str = "none",
                  rope_factor: float = 1.0, rope_low_freq_factor: float = 1.0,
                  rope_high_freq_factor: float = 4.0, rope_original_max_positions: int = 8192) -> dict:
    """The fields of one layer, in the declaration's order: name -> numpy array of the field's
    declared type (the layer table as uint8 for kUNKNOWN). Everything about the layer itself comes
    from `layer_table` (layer_table_bytes); the rest is the KV-cache block size and RoPE."""
    if rope_scaling not in ROPE_SCALING:
        raise TQError(f"rope scaling {rope_scaling!r} is not supported; use one of {', '.join(ROPE_SCALING)}")
    values = {"tokens_per_block": tokens_per_block, "rope_base": rope_base,
              "rope_scaling_type": ROPE_SCALING[rope_scaling], "rope_scaling_factor": rope_factor,
              "rope_low_freq_factor": rope_low_freq_factor, "rope_high_freq_factor": rope_high_freq_factor,
              "rope_original_max_positions": rope_original_max_positions,
              "layer_table": np.frombuffer(layer_table, dtype=np.uint8)}
    declared = [field["name"] for field in declaration()["fields"]]
    if sorted(declared) != sorted(values):
        raise TQError(f"{DECLARATION} declares the fields {declared}, plugin_fields() writes "
                      f"{list(values)}; make them agree")
    return {field["name"]: np.atleast_1d(np.asarray(values[field["name"]], dtype=_DTYPES[field["type"]]))
            for field in declaration()["fields"]}


def importable_fields(fields: dict) -> dict:
    """`fields` (from plugin_fields) in the forms an ONNX node's attributes can carry: TensorRT's ONNX
    parser makes plugin fields of type kINT32, kFLOAT32, kCHAR and kINT8 only, so the layer table
    goes as int8 bytes. The plugin accepts both forms and serializes the canonical one
    (docs/PLUGIN.md, "Fields")."""
    return {name: value.view(np.int8) if value.dtype == np.uint8 else value for name, value in fields.items()}
