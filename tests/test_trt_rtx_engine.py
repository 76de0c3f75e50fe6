"""The QuantizedAttention plugin inside a real TensorRT builder: an engine built by TensorRT-RTX 1.7
on CPU.

TensorRT-RTX (pip install tensorrt-rtx-cu13; Python 3.12 bindings) builds engines ahead of time on a
machine without a GPU, for a compute capability given in the builder config (SM89 here: it has no
SM90 target, and nothing here can run the engine). This is not a TensorRT 10.13 or a TensorRT-LLM
check: it shows that a real builder loads libtq_attention_plugin.so through its plugin registry
(getCreators, setLoggerFinder), imports the plugin from a `tq::QuantizedAttention` ONNX node through
the parser's plugin fallback (tq_trtllm/trt/onnx_node.py, fields from plugin_fields.py), runs the
plugin's build-time methods, and serializes every field into the engine; and that a bad field
fails the build with the plugin's own message, delivered through TensorRT's logger.

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

def layer_fields(layer_idx: int = LAYER) -> dict:
    """One layer's fields as the TensorRT-LLM builder makes them: calibrated 3.5-bit keys with a
    rotary mean and 3-bit values, a page shift, llama3 RoPE."""
    import torch

    from gpu.cases import make_codec
    from tq_trtllm.trt.plugin_fields import plugin_fields

    gen = torch.Generator().manual_seed(60)
    hq, hkv, d = 8, 2, 128
    key = make_codec(d, 3.5, hkv, gen, seed=77, tables=True, rotary=True)
    value = make_codec(d, 3.0, hkv, gen, seed=77, tables=True)
    return plugin_fields(key, value, num_q_heads=hq, kv_heads=hkv, layer_idx=layer_idx, tokens_per_block=32,
                         fingerprint=FINGERPRINT, page_lse_shift=torch.rand(hq, generator=gen) + 0.5,
                         rope_base=500000.0, rope_scaling="llama3", rope_factor=8.0,
                         rope_original_max_positions=8192)


def export(fields: dict, path: Path, fingerprint_text: str | None = None) -> dict:
    """Writes the layer's ONNX graph to `path` (optionally with the fingerprint as hexadecimal text,
    as another exporter may write it); returns the optimization profile for its inputs."""
    from onnx import helper

    from tq_trtllm.trt.onnx_node import plugin_inputs, quantized_attention_model, save_model

    model = quantized_attention_model(fields)
    if fingerprint_text is not None:
        (node,) = model.graph.node
        (old,) = [a for a in node.attribute if a.name == "model_fingerprint"]
        node.attribute.remove(old)
        node.attribute.append(helper.make_attribute("model_fingerprint", fingerprint_text))
    save_model(model, path)
    hq, hkv, d = (int(fields[k][0]) for k in ("num_q_heads", "num_kv_heads", "head_dim"))
    return {name: [[DIM_RANGES[x][i] if isinstance(x, str) else x for x in shape] for i in range(3)]
            for name, _, shape in plugin_inputs(hq, hkv, d)}


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
    # The plugin's serialized fields: every name, the calibration table byte for byte (written by
    # plugin_fields.py, carried through the ONNX node as int8), and the fingerprint that came as
    # two int32 attribute values, as one little-endian 64-bit value.
    for name in fields:
        assert name.encode() + b"\0" in engine, f"field {name} is not in the engine"
    assert fields["calibration_table"].tobytes() in engine
    assert struct.pack("<Q", FINGERPRINT) in engine
    assert b"QuantizedAttention" in engine and not plugin_messages(report)


def test_fingerprint_as_hex_text_is_serialized_as_its_64_bit_value(tmp_path):
    """The text form (an ONNX string attribute, a kCHAR field) is converted, not copied."""
    text = f"0x{FINGERPRINT:016x}"
    report = build(tmp_path, layer_fields(), fingerprint_text=text)
    assert report["built"], report["parser_errors"] or report["log"][-5:]
    engine = Path(report["engine"]).read_bytes()
    assert struct.pack("<Q", FINGERPRINT) in engine and text.encode() not in engine


@pytest.mark.parametrize("bad, expected", [
    ("table of another layer",
     "createPlugin('layers.4.attention', build phase): field 'calibration_table' was made for layer 3, "
     "but field 'layer_idx' is 4"),
    ("fingerprint text that is not hexadecimal",
     "field 'model_fingerprint' is 'feedc0de1234567g', not a 64-bit hexadecimal number"),
])
def test_bad_field_fails_the_build_with_the_plugins_message(tmp_path, bad, expected):
    fields = layer_fields()
    text = None
    if bad == "table of another layer":
        fields["layer_idx"] = fields["layer_idx"] + 1  # the table says layer 3
    else:
        text = "feedc0de1234567g"
    report = build(tmp_path, fields, fingerprint_text=text)
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
