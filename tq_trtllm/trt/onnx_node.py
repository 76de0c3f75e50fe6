"""One QuantizedAttention layer as an ONNX graph: a `tq::QuantizedAttention` node between the
plugin's seven inputs and its output (docs/PLUGIN.md, "The ONNX node").

TensorRT's ONNX parser imports a node that has no built-in importer through its plugin fallback:
the op type names the plugin, the attributes `plugin_namespace` and `plugin_version` pick the
creator from the plugin registry, and each other attribute named like a field the creator declares
becomes that field. So `trtexec --onnx=layer.onnx --dynamicPlugins=libtq_attention_plugin.so`
builds it with full TensorRT, and TensorRT-RTX's parser does the same (tests/test_trt_rtx_engine.py).
The fields are plugin_fields.py's, in the forms attributes can carry (`importable_fields`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..core.errors import TQError
from .plugin_fields import PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION, importable_fields, layer_table_header

OUTPUT = "attention_output"
OPSET = 17  # the default domain's; the graph uses no standard operator
IR_VERSION = 8  # the oldest IR that opset 17 allows: readable by every TensorRT 10 parser
ACTIVATION_TYPES = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


def plugin_inputs(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: str = "fp16"):
    """The plugin's inputs in order (plugin_cpp/plugin/io_layout.h): (name, ONNX element type,
    shape), with named dimensions where TensorRT-LLM's runtime varies them from step to step."""
    if dtype not in ACTIVATION_TYPES:
        raise TQError(f"activation dtype {dtype!r} is not supported by the plugin; use fp16 or bf16")
    i32, i64 = TensorProto.INT32, TensorProto.INT64
    return [
        ("qkv", ACTIVATION_TYPES[dtype], ["num_tokens", (num_q_heads + 2 * num_kv_heads) * head_dim]),
        ("host_past_key_value_lengths", i32, ["batch"]),
        ("host_context_lengths", i32, ["batch"]),
        ("host_request_types", i32, ["batch"]),
        ("kv_cache_block_offsets", i32, ["num_pools", "batch", 1, 2, "max_blocks"]),
        ("host_kv_cache_pool_pointers", i64, ["num_pools", 2]),
        ("host_kv_cache_pool_mapping", i32, ["num_layers", 2]),
    ]


def field_attribute(name: str, value: np.ndarray) -> onnx.AttributeProto:
    """One field as the attribute the parser turns back into it: int32 -> INT / INTS (kINT32),
    float32 -> FLOAT (kFLOAT32), int8 -> an INT8 tensor (kINT8)."""
    if value.dtype == np.int32:
        return helper.make_attribute(name, int(value[0]) if value.size == 1 else [int(v) for v in value])
    if value.dtype == np.float32 and value.size == 1:
        return helper.make_attribute(name, float(value[0]))
    if value.dtype == np.int8:
        return helper.make_attribute(name, numpy_helper.from_array(value, name))
    raise TQError(f"field {name!r} ({value.dtype}, {value.size} values) has no ONNX attribute form; "
                  "pass the fields through importable_fields() first")


def quantized_attention_model(fields: dict, *, dtype: str = "fp16", name: str | None = None) -> onnx.ModelProto:
    """A graph of one QuantizedAttention node whose attributes are `fields` (plugin_fields's output,
    converted here by importable_fields), with the plugin's inputs as graph inputs sized by the
    layer table's heads and head_dim."""
    header = layer_table_header(fields["layer_table"])
    hq, hkv, d = header.num_q_heads, header.num_kv_heads, header.head_dim
    inputs = [helper.make_tensor_value_info(n, t, shape) for n, t, shape in plugin_inputs(hq, hkv, d, dtype)]
    output = helper.make_tensor_value_info(OUTPUT, ACTIVATION_TYPES[dtype], ["num_tokens", hq * d])
    layer = header.layer_idx
    node = helper.make_node(PLUGIN_NAME, [i.name for i in inputs], [OUTPUT], name=name or f"layers.{layer}.attention",
                            domain=PLUGIN_NAMESPACE, plugin_namespace=PLUGIN_NAMESPACE, plugin_version=PLUGIN_VERSION)
    node.attribute.extend(field_attribute(k, v) for k, v in importable_fields(fields).items())
    graph = helper.make_graph([node], f"quantized_attention_layer{layer}", inputs, [output])
    model = helper.make_model(graph, producer_name="tq_trtllm",
                              opset_imports=[helper.make_opsetid("", OPSET),
                                             helper.make_opsetid(PLUGIN_NAMESPACE, int(PLUGIN_VERSION))])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Writes `model` to `path` through a temporary file in the same folder, renamed into place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
