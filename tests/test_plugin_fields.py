"""The plugin's fields and its layer table as Python writes them (tq_trtllm/trt/plugin_fields.py):
the fields follow their one declaration (quantized_attention_fields.json), and the layer table's
header says, read back with struct from docs/PLUGIN.md section 3's layout, the layer's identity,
widths, heads and rotation seed; its payload ends with the page shift and the keys' rotary mean.
That C++ reads every value back in its place: tests/test_plugin_unit.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from gpu.cases import make_table
from tq_trtllm.calibration.table import LayerTable
from tq_trtllm.core.errors import TQError
from tq_trtllm.core.spec import FORMAT_VERSION
from tq_trtllm.trt import plugin_fields as pf

DECLARATION = Path(__file__).resolve().parents[1] / "tq_trtllm" / "trt" / "quantized_attention_fields.json"
V4_HEADER = "<4sIII Q iiiii I Q II I I"  # docs/PLUGIN.md section 3, written out here, not imported
HQ, HKV, D, LAYER, SEED, FINGERPRINT = 6, 2, 64, 2, 2**32 - 5, 0x8000_0000_FFFF_0001


def fnv1a(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) % 2**32
    return h


def table(gen, k_width=3.5, v_width=2.5):
    return make_table(D, k_width, v_width, HKV, HQ, gen, layer=LAYER, seed=SEED, tables=True, page_shift=True)


def blob(t, **kw) -> bytes:
    return pf.layer_table_bytes(t, LAYER, num_q_heads=HQ, num_kv_heads=HKV, fingerprint=FINGERPRINT, **kw)


def test_fields_are_the_declared_ones_in_order(gen):
    declared = json.loads(DECLARATION.read_text())
    fields = pf.plugin_fields(blob(table(gen)), tokens_per_block=16, rope_base=10000.0, rope_scaling="llama3",
                              rope_factor=8.0)
    assert [(name, pf.FIELD_TYPES[v.dtype]) for name, v in fields.items()] == [
        (f["name"], f["type"]) for f in declared["fields"]]
    assert (pf.PLUGIN_NAME, pf.PLUGIN_NAMESPACE, pf.PLUGIN_VERSION) == tuple(
        declared["plugin"][k] for k in ("name", "namespace", "version"))
    assert int(fields["rope_scaling_type"][0]) == 2 and float(fields["rope_scaling_factor"][0]) == 8.0
    # the ONNX forms: the table as int8, the same bytes; every other field as it was
    importable = pf.importable_fields(fields)
    assert list(importable) == list(fields) and importable["layer_table"].dtype == np.int8
    assert importable["layer_table"].tobytes() == fields["layer_table"].tobytes()
    assert all(importable[n] is fields[n] for n in fields if n != "layer_table")


def test_a_field_the_declaration_does_not_have_is_refused(monkeypatch, gen):
    declared = json.loads(DECLARATION.read_text())
    declared["fields"] = declared["fields"][1:]
    monkeypatch.setattr(pf, "declaration", lambda: declared)
    with pytest.raises(TQError, match="quantized_attention_fields.json declares the fields"):
        pf.plugin_fields(blob(table(gen)), tokens_per_block=16, rope_base=10000.0)


@pytest.mark.parametrize("k_width, v_width, flags", [(3.5, 2.5, 0xFF), (4.0, 3.0, 0b1101_1011)])
def test_layer_table_header_says_the_layer(gen, k_width, v_width, flags):
    t = table(gen, k_width, v_width)
    data = blob(t)
    header = struct.unpack(V4_HEADER, data[:72])
    payload = data[72:]
    assert header == (b"TQCT", 4, FORMAT_VERSION, 72, FINGERPRINT, LAYER, HKV, D, int(2 * k_width),
                      int(2 * v_width), flags, len(payload), fnv1a(payload), HQ, SEED, 0)
    assert tuple(pf.layer_table_header(data)) == header
    # the payload ends with the page shift, then the keys' rotary mean (P, channels, frequencies, means)
    entry = t.layers[LAYER]
    rotary = (struct.pack("<i", entry.key_rotary_freq.shape[1])
              + entry.key_rotary_channels.numpy().astype("<i4").tobytes()
              + entry.key_rotary_freq.numpy().astype("<f4").tobytes()
              + entry.key_rotary_mean.numpy().astype("<f4").tobytes())
    shift = entry.page_lse_shift.numpy().astype("<f4").tobytes()
    assert payload.endswith(shift + rotary)


def test_the_rotation_seed_is_the_layers_one(gen):
    """A layer has one seed (LayerTable.seed) for K and V, so they cannot differ; the header holds
    it, bit for bit; a seed that is no uint32 is refused, not truncated."""
    t = table(gen)
    assert "seed" in LayerTable.__dataclass_fields__ and not any("seed" in n for n in LayerTable.TENSORS)
    key, value = t.codecs(LAYER)
    assert key.seed == value.seed == SEED == pf.layer_table_header(blob(t)).rotation_seed
    for bad in (2**32, -1):
        t.layers[LAYER].seed = bad
        with pytest.raises(TQError, match=f"rotation seed {bad} is not a uint32"):
            blob(t)


def test_bad_requests_are_refused_with_the_reason(gen):
    t = table(gen)
    with pytest.raises(TQError, match="holds \\(6,\\) values, not 4, one per query head"):
        pf.layer_table_bytes(t, LAYER, num_q_heads=4, num_kv_heads=HKV, fingerprint=1)
    with pytest.raises(TQError, match="key mean has \\(2, 64\\) values, not one row per KV head \\(4\\)"):
        pf.layer_table_bytes(t, LAYER, num_q_heads=HQ, num_kv_heads=4, fingerprint=1)
    with pytest.raises(TQError, match="layer 3 is not in the calibration table \\(it has 3 layers\\)"):
        pf.layer_table_bytes(t, 3, num_q_heads=HQ, num_kv_heads=HKV, fingerprint=1)
    with pytest.raises(TQError, match="rope scaling 'yarn' is not supported"):
        pf.plugin_fields(blob(t), tokens_per_block=16, rope_base=10000.0, rope_scaling="yarn")
    old = bytearray(blob(t))
    old[4:8] = struct.pack("<I", 3)
    with pytest.raises(TQError, match="version 3, this tq_trtllm reads version 4; rebuild"):
        pf.layer_table_header(bytes(old))
    with pytest.raises(TQError, match="not a layer table"):
        pf.layer_table_header(b"TQCX" + bytes(old[4:]))
