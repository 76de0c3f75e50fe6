"""The ONNX node of one QuantizedAttention layer (tq_trtllm/trt/onnx_node.py), read back with onnx
alone: what TensorRT's parser needs to find the plugin, the graph sized by the layer table, and
every field recoverable from its attribute exactly. The build by a real TensorRT parser and
builder: tests/test_trt_rtx_engine.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", reason="onnx is not installed (the `test` extra)")
from onnx import helper, numpy_helper  # noqa: E402

from gpu.cases import make_table  # noqa: E402
from tq_trtllm.core.errors import TQError  # noqa: E402
from tq_trtllm.trt.onnx_node import field_attribute, quantized_attention_model, save_model  # noqa: E402
from tq_trtllm.trt.plugin_fields import layer_table_bytes, plugin_fields  # noqa: E402


def fields(layer_idx=2):
    gen = torch.Generator().manual_seed(57)
    table = make_table(64, 3.5, 3.0, 2, 6, gen, layer=layer_idx, seed=2**32 - 5, tables=True)
    blob = layer_table_bytes(table, layer_idx, num_q_heads=6, num_kv_heads=2, fingerprint=0x8000_0000_FFFF_0001)
    return plugin_fields(blob, tokens_per_block=16, rope_base=10000.0)


def test_node_carries_every_field_recoverably(tmp_path):
    want = fields()
    path = save_model(quantized_attention_model(want, dtype="bf16"), tmp_path / "layer.onnx")
    model = onnx.load(path)
    (node,) = model.graph.node
    # named after the layer the table says, the plugin and version of the fields' declaration
    assert (node.op_type, node.domain, node.name) == ("QuantizedAttention", "tq", "layers.2.attention")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs.pop("plugin_namespace") == b"tq" and attrs.pop("plugin_version") == b"2"
    assert list(attrs) == list(want)
    table = numpy_helper.to_array(attrs.pop("layer_table"))
    assert table.dtype == np.int8 and table.tobytes() == want["layer_table"].tobytes()
    for name, value in attrs.items():
        assert np.array([value], want[name].dtype)[0] == want[name][0], name
    assert [i.name for i in model.graph.input] == [
        "qkv", "host_past_key_value_lengths", "host_context_lengths", "host_request_types",
        "kv_cache_block_offsets", "host_kv_cache_pool_pointers", "host_kv_cache_pool_mapping"]
    # sized by the table's heads and head_dim
    qkv = model.graph.input[0].type.tensor_type
    assert qkv.elem_type == onnx.TensorProto.BFLOAT16 and qkv.shape.dim[1].dim_value == (6 + 2 * 2) * 64
    assert model.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 6 * 64
    assert [p.name for p in tmp_path.iterdir()] == ["layer.onnx"]  # no temporary left behind


def test_field_without_an_attribute_form_is_refused():
    with pytest.raises(TQError, match="layer_table.*importable_fields"):
        field_attribute("layer_table", fields()["layer_table"])
    with pytest.raises(TQError, match="fp32"):
        quantized_attention_model(fields(), dtype="fp32")
