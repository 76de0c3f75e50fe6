"""Tables on disk: one safetensors file whose metadata holds the JSON header.

Header: table format version, the model fingerprint, the bit budget, the sink tokens, the recent
window, per-layer widths and seeds, and the calibration description. Loading checks all of it
against the model and refuses a table that does not match, naming each field that differs.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from ..core.errors import TQError
from ..core.spec import CodecSpec, parse_width
from ..models.fingerprint import fingerprint_differences
from .table import CALIBRATION_FILE_VERSION, MAX_PAGE_LSE_SHIFT, MAX_RECENT_TOKENS, KVTable, LayerTable

HEADER_KEY = "tq_table"


def _tensor_name(layer: int, name: str) -> str:
    return f"layers.{layer}.{name}"


def save_table(table: KVTable, path: str | Path) -> None:
    """Write to a temporary file beside `path`, then rename it into place."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {}
    for i, layer in enumerate(table.layers):
        for name in LayerTable.TENSORS:
            t = getattr(layer, name)
            if t is not None:
                tensors[_tensor_name(i, name)] = t.detach().cpu().contiguous()
    header = {
        "version": CALIBRATION_FILE_VERSION,
        "fingerprint": table.fingerprint,
        "kv_bits": table.kv_bits,
        "sink_tokens": table.sink_tokens,
        "recent_tokens": table.recent_tokens,
        "layers": [{"key_width": t.key_width, "value_width": t.value_width, "seed": t.seed}
                   for t in table.layers],
        "calibration": table.calibration,
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        save_file(tensors, str(tmp), metadata={HEADER_KEY: json.dumps(header)})
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: the old file stays, no partial one is left
        tmp.unlink(missing_ok=True)
        raise


def load_table(path: str | Path, model_fingerprint: dict | None = None) -> KVTable:
    """Read and validate a table; with model_fingerprint, refuse one made for another model."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise TQError(f"calibration table {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as fh:
            metadata = fh.metadata() or {}
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}
    except Exception as err:  # safetensors raises its own error types for damaged files
        raise TQError(f"calibration table {path} is corrupt or not a safetensors file: {err}") from None
    if HEADER_KEY not in metadata:
        raise TQError(f"calibration table {path} has no '{HEADER_KEY}' header: not a tq_trtllm table")
    try:
        header = json.loads(metadata[HEADER_KEY])
        table = _from_header(header, tensors)
    except TQError as err:
        raise TQError(f"calibration table {path}: {err}") from None
    except (KeyError, TypeError, ValueError) as err:
        raise TQError(f"calibration table {path} has a malformed header ({type(err).__name__}: {err})") \
            from None
    if model_fingerprint is not None:
        diffs = fingerprint_differences(table.fingerprint, model_fingerprint)
        if diffs:
            raise TQError(f"calibration table {path} was made for another model: " + "; ".join(diffs))
    return table


def _from_header(header: dict, tensors: dict) -> KVTable:
    if header.get("version") != CALIBRATION_FILE_VERSION:
        raise TQError(f"calibration file version {header.get('version')} is not readable; this tq_trtllm "
                      f"reads version {CALIBRATION_FILE_VERSION}")
    fp = header["fingerprint"]
    n_layers, heads = int(fp["layers"]), int(fp["heads"])
    kv_heads, head_dim = int(fp["kv_heads"]), int(fp["head_dim"])
    if len(header["layers"]) != n_layers:
        raise TQError(f"the header lists {len(header['layers'])} layers but the fingerprint says {n_layers}")
    layers = []
    for i, entry in enumerate(header["layers"]):
        layer = LayerTable(parse_width(entry["key_width"]), parse_width(entry["value_width"]),
                           int(entry["seed"]))
        for name in LayerTable.TENSORS:
            t = tensors.pop(_tensor_name(i, name), None)
            if t is not None:
                _check_tensor(layer, name, t, heads, kv_heads, head_dim, i)
            setattr(layer, name, t)
        _check_rotary(layer, head_dim, i)
        layers.append(layer)
    if tensors:
        raise TQError(f"unexpected tensors {sorted(tensors)[:4]}")
    sinks = int(header["sink_tokens"])
    if sinks < 0:
        raise TQError(f"sink_tokens {sinks} is negative")
    recent = int(header.get("recent_tokens", 1))  # a table without the field: own position alone
    if not 1 <= recent <= MAX_RECENT_TOKENS:
        raise TQError(f"recent_tokens {recent} lies outside 1..{MAX_RECENT_TOKENS}")
    return KVTable(fp, layers, sinks, str(header["kv_bits"]), dict(header.get("calibration", {})),
                   recent)


def _check_rotary(layer: LayerTable, head_dim: int, index: int) -> None:
    """The three rotary tensors come together, name distinct rotate-half pairs (a, a + head_dim / 2)
    by their a, and hold finite means and frequencies in (0, pi]."""
    present = [getattr(layer, name) is not None for name in LayerTable.ROTARY]
    if not any(present):
        return
    where = f"layer {index} key rotary mean"
    if not all(present):
        raise TQError(f"{where} is incomplete: it needs all of {', '.join(LayerTable.ROTARY)}")
    channels, freq, mean = (getattr(layer, name) for name in LayerTable.ROTARY)
    if channels.dtype != torch.int64 or freq.dtype != torch.float32 or mean.dtype != torch.float32:
        raise TQError(f"{where} must be int64 channels and float32 frequencies and means")
    try:
        layer.key_rotary  # checks the shapes against each other and the pair limit
    except TQError as err:
        raise TQError(f"{where}: {err}") from None
    half = head_dim // 2
    if (channels < 0).any() or (channels >= half).any() or \
            any(len(set(row.tolist())) != len(row) for row in channels):
        raise TQError(f"{where} names channels that are not distinct rotate-half pairs (a, a + "
                      f"{half}) with a in 0..{half - 1}")
    if not torch.isfinite(mean).all() or not ((freq > 0) & (freq <= math.pi)).all():
        raise TQError(f"{where} holds NaN/Inf means or frequencies outside (0, pi]")


def _check_tensor(layer: LayerTable, name: str, t: torch.Tensor, heads: int, kv_heads: int,
                  head_dim: int, index: int) -> None:
    where = f"layer {index} {name}"
    if name in LayerTable.ROTARY:  # shapes against kv_heads here, the rest in _check_rotary
        if t.dim() == 0 or t.shape[0] != kv_heads:
            raise TQError(f"{where} has shape {list(t.shape)}, expected {kv_heads} heads first")
        return
    if name == "page_lse_shift":
        if tuple(t.shape) != (heads,) or t.dtype != torch.float32:
            raise TQError(f"{where} must be float32 of shape [{heads}], one per query head; it is "
                          f"{t.dtype} {list(t.shape)}")
        if not (t.abs() <= MAX_PAGE_LSE_SHIFT).all():  # also refuses NaN
            raise TQError(f"{where} holds a value outside +-{MAX_PAGE_LSE_SHIFT} (or NaN): not a "
                          "measured shift; rebuild the table with tq-build")
        return
    width = layer.key_width if name.startswith("key") else layer.value_width
    if name.endswith("outliers"):
        n_hi = CodecSpec(head_dim, width).num_outliers
        if tuple(t.shape) != (kv_heads, n_hi):
            raise TQError(f"{where} has shape {list(t.shape)}, expected [{kv_heads}, {n_hi}]")
        if t.dtype != torch.int64 or (t < 0).any() or (t >= head_dim).any():
            raise TQError(f"{where} must hold int64 channel indices in 0..{head_dim - 1}")
        return
    if tuple(t.shape) != (kv_heads, head_dim):
        raise TQError(f"{where} has shape {list(t.shape)}, expected [{kv_heads}, {head_dim}]")
    if not torch.isfinite(t).all():
        raise TQError(f"{where} holds NaN or Inf")
    if name.endswith("scale") and not (t > 0).all():
        raise TQError(f"{where} holds a scale that is not positive")
