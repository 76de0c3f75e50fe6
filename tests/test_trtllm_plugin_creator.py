"""The TensorRT side of the TensorRT-LLM builder against a real TensorRT plugin registry: TensorRT
for RTX 1.7 (pip tensorrt-rtx-cu13, CPU) loads libtq_attention_plugin.so, and
attention_patch.create_plugin turns a tensor-parallel rank's fields into a plugin through the
creator (the Python field collection with the layer table as kUNKNOWN bytes, which the ONNX
route cannot carry), or fails with the plugin's message naming the field. TensorRT-RTX's Python
network has no add_plugin_v3, so the layer itself is built in TensorRT-RTX through the ONNX node
(the plugin's own test) and in TensorRT-LLM by tq-eval trtllm-check."""

import numpy as np
import pytest

from required import REQUIRE_PLUGIN, needs
from test_trtllm_rank_tables import HKV, HQ, full_table
from tq_trtllm.core.errors import TQError
from tq_trtllm.trt.plugin_fields import HEADER, layer_table_header
from tq_trtllm.trtllm.attention_patch import create_plugin, layer_fields
from tq_trtllm.trtllm.plugin_libraries import DYNAMIC, PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION, find_library
from tq_trtllm.trtllm.rank_tables import rank_table

try:
    import tensorrt_rtx as trt
    LIBRARY = find_library(DYNAMIC)
    MISSING = None
except (ImportError, TQError) as err:
    trt, LIBRARY, MISSING = None, None, f"TensorRT-RTX or the plugin library is missing: {err}"

pytestmark = needs(MISSING, REQUIRE_PLUGIN)
T = 32


class Log(trt.ILogger if trt else object):
    def __init__(self):
        super().__init__()
        self.messages = []

    def log(self, severity, message):
        self.messages.append(message)


@pytest.fixture(scope="module")
def registry():
    log = Log()
    builder = trt.Builder(log)  # sets TensorRT's logger, which the plugin's messages go to
    registry = builder.get_plugin_registry()
    assert registry.load_library(str(LIBRARY)) is not None
    assert registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE) is not None
    return registry, log, builder


def rank_fields(gen, rank: int) -> dict:
    return layer_fields(rank_table(full_table(gen, width=3.0), 2, rank), 1, T, {"rope_base": 10000.0})


def test_each_ranks_fields_make_a_plugin(gen, registry):
    reg, log, _ = registry
    for rank in range(2):
        fields = rank_fields(gen, rank)
        header = layer_table_header(fields["layer_table"])
        assert (header.num_kv_heads, header.num_q_heads) == (HKV // 2, HQ // 2)
        assert create_plugin(f"tq_quantized_attention_1_rank{rank}", fields, trt, reg) is not None


def _damaged(table: np.ndarray) -> np.ndarray:
    """The layer table with one payload byte changed (its checksum no longer matches)."""
    table = table.copy()
    table[HEADER.size] ^= 0x40
    return table


@pytest.mark.parametrize("field, change, named", [
    ("tokens_per_block", lambda _: np.array([40], np.int32), "'tokens_per_block' is 40"),
    ("rope_scaling_type", lambda _: np.array([7], np.int32), "'rope_scaling_type' is 7"),
    ("layer_table", _damaged, "field 'layer_table' fails its checksum"),
    # a field of plugin version 1, now in the layer table's header: named, with what to do
    ("head_dim", lambda _: np.array([128], np.int32),
     "field 'head_dim' is not a field of QuantizedAttention version 2: its value comes from the layer table"),
])
def test_fields_the_plugin_refuses_fail_with_its_message(gen, registry, field, change, named):
    reg, log, _ = registry
    fields = dict(rank_fields(gen, 0))
    fields[field] = change(fields.get(field))
    log.messages.clear()
    with pytest.raises(TQError, match="refused the fields"):
        create_plugin("tq_quantized_attention_1", fields, trt, reg)
    assert any(named in m for m in log.messages), log.messages[-5:]
