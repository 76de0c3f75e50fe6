"""The QuantizedAttention plugin inside a real TensorRT builder: an engine built by TensorRT-RTX 1.7
on CPU.

TensorRT-RTX (pip install tensorrt-rtx-cu13; Python 3.12 bindings) builds engines ahead of time on a
machine without a GPU, for a compute capability given in the builder config (SM89 here: it has no
SM90 target, and nothing here can run the engine). This is not a TensorRT 10.13 or a TensorRT-LLM
check: it shows that a real builder loads libtq_attention_plugin.so through its plugin registry
(getCreators, setLoggerFinder), imports the plugin from a `tq::QuantizedAttention` ONNX node through
the parser's plugin fallback (tq_trtllm/trt/onnx_node.py, fields from plugin_fields.py), runs the
plugin's build-time methods, and serializes every field (the layer table byte for byte) into the
engine; and that a bad field fails the build with the plugin's own message, delivered through
TensorRT's logger.

Each build runs in a child process (this file run as a script): TensorRT-RTX's ONNX parser opens
`libtensorrt_rtx.so`, which the wheel ships only as `.so.1`, so the child gets a symlink in the
test's temporary folder on LD_LIBRARY_PATH (read by the loader at process start).

Skipped with the reason where TensorRT-RTX, onnx or the plugin library is missing; failed instead
where TQ_REQUIRE_PLUGIN=1 (on Python 3.12 / x86_64, where the `test` extra installs TensorRT-RTX).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from required import REQUIRE_PLUGIN, needs

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("TQ_PLUGIN_BUILD_DIR", ROOT / "build" / "plugin_cpp" / "plugin"))
PLUGIN = BUILD / "libtq_attention_plugin.so"
FINGERPRINT = 0xFEEDC0DE12345678
LAYER = 3
# Profile ranges of the ONNX graph's named dimensions (onnx_node.plugin_inputs).
DIM_RANGES = {"num_tokens": (1, 64, 256), "batch": (1, 4, 8), "num_pools": (1, 1, 1), "max_blocks": (1, 8, 16),
              "num_layers": (LAYER + 1, LAYER + 1, 32)}


def _missing() -> tuple[str | None, bool]:
    """(what is missing, whether TQ_REQUIRE_PLUGIN may turn it into a failure)."""
    where_installed = sys.version_info[:2] == (3, 12) and platform.machine() == "x86_64"
    for module, package in (("tensorrt_rtx", "tensorrt-rtx-cu13"), ("onnx", "onnx")):
        if importlib.util.find_spec(module) is None:
            return (f"{module} is not installed (pip install {package}; TensorRT-RTX's bindings need "
                    "Python 3.12 on x86_64)", where_installed)
    if not PLUGIN.exists():
        return f"the plugin library is not built: {PLUGIN} (build_scripts/build_kernels.sh)", True
    return None, False


_reason, _requirable = _missing()
pytestmark = [pytest.mark.slow,
              needs(_reason, REQUIRE_PLUGIN) if _requirable else pytest.mark.skipif(_reason is not None,
                                                                                    reason=str(_reason))]


# ----------------------------------------------------------------------------------------------
# The parent side: fields, ONNX graph, one child process per build.

def layer_fields(tokens_per_block: int = 32) -> dict:
    """One layer's fields as the TensorRT-LLM builder makes them: a calibration table's layer with
    calibrated 3.5-bit keys with a rotary mean, 3-bit values and a page shift as its layer table,
    llama3 RoPE."""
    import torch

    from gpu.cases import make_table
    from tq_trtllm.trt.plugin_fields import layer_table_bytes, plugin_fields

    gen = torch.Generator().manual_seed(60)
    hq, hkv, d = 8, 2, 128
    table = make_table(d, 3.5, 3.0, hkv, hq, gen, layer=LAYER, seed=77, tables=True, page_shift=True)
    blob = layer_table_bytes(table, LAYER, num_q_heads=hq, num_kv_heads=hkv, fingerprint=FINGERPRINT)
    return plugin_fields(blob, tokens_per_block=tokens_per_block, rope_base=500000.0, rope_scaling="llama3",
                         rope_factor=8.0, rope_original_max_positions=8192)


def export(fields: dict, path: Path, table_version: int | None = None) -> dict:
    """Writes the layer's ONNX graph to `path` (optionally with another version in the layer
    table's header, as an older tq_trtllm wrote it); returns the optimization profile for its inputs."""
    from onnx import numpy_helper

    from tq_trtllm.trt.onnx_node import plugin_inputs, quantized_attention_model, save_model
    from tq_trtllm.trt.plugin_fields import layer_table_header

    model = quantized_attention_model(fields)
    if table_version is not None:
        (node,) = model.graph.node
        (attribute,) = [a for a in node.attribute if a.name == "layer_table"]
        table = numpy_helper.to_array(attribute.t).copy()
        table[4:8] = np.frombuffer(struct.pack("<I", table_version), np.int8)
        attribute.t.CopyFrom(numpy_helper.from_array(table, "layer_table"))
    save_model(model, path)
    header = layer_table_header(fields["layer_table"])
    return {name: [[DIM_RANGES[x][i] if isinstance(x, str) else x for x in shape] for i in range(3)]
            for name, _, shape in plugin_inputs(header.num_q_heads, header.num_kv_heads, header.head_dim)}


def build(tmp_path: Path, fields: dict, **export_args) -> dict:
    """Exports the graph, builds it in a child process; returns the child's report."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    profile = export(fields, tmp_path / "layer.onnx", **export_args)
    libs = Path(importlib.util.find_spec("tensorrt_rtx_libs").submodule_search_locations[0])
    link_dir = tmp_path / "lib"
    link_dir.mkdir(exist_ok=True)
    (link_dir / "libtensorrt_rtx.so").symlink_to(libs / "libtensorrt_rtx.so.1")
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(link_dir),
                                                                        os.environ.get("LD_LIBRARY_PATH")])))
    request = {"onnx": str(tmp_path / "layer.onnx"), "plugin": str(PLUGIN), "engine": str(tmp_path / "layer.engine"),
               "profile": profile, "report": str(tmp_path / "report.json")}
    (tmp_path / "request.json").write_text(json.dumps(request))
    done = subprocess.run([sys.executable, __file__, str(tmp_path / "request.json")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"the build process failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(Path(request["report"]).read_text())
    report["stderr"] = done.stderr
    return report


def plugin_messages(report: dict) -> list[str]:
    return [message for _, message in report["log"] if "QuantizedAttention (tq)" in message]


def test_engine_built_by_tensorrt_rtx_on_cpu_carries_the_fields(tmp_path):
    fields = layer_fields()
    report = build(tmp_path, fields)
    assert report["loaded"], report["log"][-5:]
    assert report["parsed"], report["parser_errors"]
    assert report["built"], [m for s, m in report["log"] if s in ("ERROR", "INTERNAL_ERROR")]
    engine = Path(report["engine"]).read_bytes()
    # The plugin's serialized fields: every declared name, and the layer table byte for byte (written
    # by plugin_fields.py, carried through the ONNX node as int8): the layer's identity, heads,
    # widths, rotation seed and fingerprint are in it and nowhere else.
    for name in fields:
        assert name.encode() + b"\0" in engine, f"field {name} is not in the engine"
    assert fields["layer_table"].tobytes() in engine
    assert b"QuantizedAttention" in engine and not plugin_messages(report)


@pytest.mark.parametrize("bad, expected", [
    ("layer table of version 3",
     "createPlugin('layers.3.attention', build phase): field 'layer_table' has layer table version 3; "
     "this plugin reads version 4: rebuild the engine (or ONNX graph) with this tq_trtllm"),
    ("tokens per block not a multiple of 16",
     "field 'tokens_per_block' is 40; it must be a positive multiple of 16"),
])
def test_bad_field_fails_the_build_with_the_plugins_message(tmp_path, bad, expected):
    if "version" in bad:
        report = build(tmp_path, layer_fields(), table_version=3)
    else:
        report = build(tmp_path, layer_fields(tokens_per_block=40))
    assert not report["parsed"] and not report["built"]
    assert any("Could not create the plugin" in e for e in report["parser_errors"]), report["parser_errors"]
    # through the logger TensorRT gave the plugin (setLoggerFinder), at error severity; not stderr
    assert [s for s, m in report["log"] if expected in m] == ["ERROR"], plugin_messages(report)
    assert "QuantizedAttention (tq)" not in report["stderr"]


# ----------------------------------------------------------------------------------------------
# The child side: python tests/test_trt_rtx_engine.py REQUEST.json

def build_in_this_process(request: dict) -> dict:
    import tensorrt_rtx as trt

    class Captured(trt.ILogger):
        def __init__(self):
            super().__init__()
            self.messages = []

        def log(self, severity, message):
            self.messages.append((severity.name, message))

    logger = Captured()
    report = {"loaded": False, "parsed": False, "parser_errors": [], "built": False, "engine": None}
    builder = trt.Builder(logger)
    report["loaded"] = builder.get_plugin_registry().load_library(request["plugin"]) is not None
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if report["loaded"]:
        report["parsed"] = bool(parser.parse_from_file(request["onnx"]))
        report["parser_errors"] = [str(parser.get_error(i)) for i in range(parser.num_errors)]
    if report["parsed"]:
        config = builder.create_builder_config()
        config.num_compute_capabilities = 1
        config.set_compute_capability(trt.ComputeCapability.SM89, 0)
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in request["profile"].items():
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
        engine = builder.build_serialized_network(network, config)
        if engine is not None:
            Path(request["engine"]).write_bytes(bytes(engine))
            report.update(built=True, engine=request["engine"])
    report["log"] = logger.messages
    return report


if __name__ == "__main__":
    request = json.loads(Path(sys.argv[1]).read_text())
    Path(request["report"]).write_text(json.dumps(build_in_this_process(request)))
