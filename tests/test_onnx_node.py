"""The ONNX node of one QuantizedAttention layer (tq_trtllm/trt/onnx_node.py), read back with onnx
alone: what TensorRT's parser needs to find the plugin, and every field recoverable from its
attribute exactly. The build by a real TensorRT parser and builder: tests/test_trt_rtx_engine.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", reason="onnx is not installed (the `test` extra)")
from onnx import helper, numpy_helper  # noqa: E402

from tq_trtllm.core.errors import TQError  # noqa: E402
from tq_trtllm.core.quantizer import VectorCodec  # noqa: E402
from tq_trtllm.core.spec import CodecSpec  # noqa: E402
from tq_trtllm.trt.onnx_node import field_attribute, quantized_attention_model, save_model  # noqa: E402
from tq_trtllm.trt.plugin_fields import plugin_fields  # noqa: E402


def fields(layer_idx=2):
    key = VectorCodec(CodecSpec(64, 3.5), seed=2**32 - 5, outliers=torch.arange(32))
    value = VectorCodec(CodecSpec(64, 3), seed=2**32 - 5)
    return plugin_fields(key, value, num_q_heads=6, kv_heads=2, layer_idx=layer_idx, tokens_per_block=16,
                         fingerprint=0x8000_0000_FFFF_0001, rope_base=10000.0)


def test_node_carries_every_field_recoverably(tmp_path):
    want = fields()
    path = save_model(quantized_attention_model(want, dtype="bf16"), tmp_path / "layer.onnx")
    model = onnx.load(path)
    (node,) = model.graph.node
    assert (node.op_type, node.domain, node.name) == ("QuantizedAttention", "tq", "layers.2.attention")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs.pop("plugin_namespace") == b"tq" and attrs.pop("plugin_version") == b"1"
    assert set(attrs) == set(want)
    low, high = attrs.pop("model_fingerprint")  # INTS: int32 low, high
    assert (low & 0xFFFFFFFF) | (high & 0xFFFFFFFF) << 32 == 0x8000_0000_FFFF_0001
    table = numpy_helper.to_array(attrs.pop("calibration_table"))
    assert table.dtype == np.int8 and table.tobytes() == want["calibration_table"].tobytes()
    assert attrs.pop("rotation_seed") == np.int32(np.uint32(2**32 - 5).view(np.int32))  # bit for bit
    for name, value in attrs.items():
        assert np.array([value], want[name].dtype)[0] == want[name][0], name
    assert [i.name for i in model.graph.input] == [
        "qkv", "host_past_key_value_lengths", "host_context_lengths", "host_request_types",
        "kv_cache_block_offsets", "host_kv_cache_pool_pointers", "host_kv_cache_pool_mapping"]
    qkv = model.graph.input[0].type.tensor_type
    assert qkv.elem_type == onnx.TensorProto.BFLOAT16 and qkv.shape.dim[1].dim_value == (6 + 2 * 2) * 64
    assert [p.name for p in tmp_path.iterdir()] == ["layer.onnx"]  # no temporary left behind


def test_field_without_an_attribute_form_is_refused():
    with pytest.raises(TQError, match="model_fingerprint.*importable_fields"):
        field_attribute("model_fingerprint", fields()["model_fingerprint"])
    with pytest.raises(TQError, match="fp32"):
        quantized_attention_model(fields(), dtype="fp32")
