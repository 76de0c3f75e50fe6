"""The QuantizedAttention plugin's CPU tests, built and run against each TensorRT header tree: the
OSS headers of TensorRT 10.13 and 11.1 in ../shared/third_party/tensorrt-oss (or
$TENSORRT_INCLUDE_DIR, or third_party_headers/ from build_scripts/fetch_trt_headers.sh). They cover
the build-time methods and fields (plugin_cpp/tests/test_plugin_build.cpp), the LD_PRELOAD variant's
load-time registration (test_preload_registration.cpp, against a stand-in libnvinfer), that the
creator's identity and fields are those quantized_attention_fields.json declares, that every value
of a layer table the Python writer makes reads back in C++ as written, and that the C++ reader
refuses what the Python writer would never write, each with its message. Needs CMake, a C++
compiler and the CUDA toolkit's headers and runtime library; no GPU, no nvcc run, no libnvinfer.
Skipped with the reason where something is missing; failed instead where TQ_REQUIRE_PLUGIN=1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from required import REQUIRE_PLUGIN, is_required, needs
from tq_trtllm.calibration.table import KVTable, LayerTable, oblivious_table
from tq_trtllm.core.rotary_mean import select_pairs
from tq_trtllm.trt.plugin_fields import HEADER, layer_table_bytes

ROOT = Path(__file__).resolve().parents[1]
OSS_HEADERS = ROOT.parent / "shared" / "third_party" / "tensorrt-oss"
OSS_VERSIONS = ("10.13", "11.1")  # what TensorRT-LLM 1.2 pins, and the current major line


def header_trees() -> list[Path]:
    if os.environ.get("TENSORRT_INCLUDE_DIR"):
        return [Path(os.environ["TENSORRT_INCLUDE_DIR"])]
    found = [OSS_HEADERS / v / "include" for v in OSS_VERSIONS]
    found += sorted((ROOT / "third_party_headers").glob("*/include"))
    return [p for p in found if (p / "NvInferRuntime.h").exists()]


def missing_tools() -> str | None:
    trees = header_trees()
    if not trees:
        return ("TensorRT headers not found (../shared/third_party/tensorrt-oss/<version>/include, "
                "$TENSORRT_INCLUDE_DIR, or build_scripts/fetch_trt_headers.md)")
    if is_required(REQUIRE_PLUGIN) and not os.environ.get("TENSORRT_INCLUDE_DIR"):
        absent = [v for v in OSS_VERSIONS if OSS_HEADERS / v / "include" not in trees]
        if absent:
            return f"TensorRT OSS headers {', '.join(absent)} not found in {OSS_HEADERS}"
    if not shutil.which("cmake") or not (shutil.which("c++") or shutil.which("g++")):
        return "cmake or a C++ compiler is missing"
    nvcc = shutil.which("nvcc")
    if not nvcc and not Path("/usr/local/cuda/include/cuda_runtime_api.h").exists():
        return "the CUDA toolkit (its headers and cudart) is not installed"
    return None


pytestmark = [pytest.mark.slow, needs(missing_tools(), REQUIRE_PLUGIN)]


def build_unit_tests(include: Path) -> Path:
    """Configure plugin_cpp/plugin on its own (CPU tests only) against `include`; returns the build dir."""
    build = ROOT / "build" / f"plugin-unit-{include.parent.name}"
    cmake = ["cmake", "-S", str(ROOT / "plugin_cpp" / "plugin"), "-B", str(build),
             f"-DTENSORRT_INCLUDE_DIR={include}", "-DCMAKE_BUILD_TYPE=Release"]
    for cmd in (cmake, ["cmake", "--build", str(build), "-j2"]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return build


@pytest.fixture(scope="module")
def builds() -> dict[str, Path]:
    return {str(include): build_unit_tests(include) for include in header_trees()}


@pytest.fixture(scope="module")
def unit_tests(builds) -> dict[str, Path]:
    return {include: build / "tq_plugin_unit_test" for include, build in builds.items()}


def test_build_time_methods_and_fields(unit_tests):
    for include, binary in unit_tests.items():
        done = subprocess.run([str(binary)], capture_output=True, text=True)
        assert done.returncode == 0 and "PASSED" in done.stdout, f"against {include}:\n{done.stdout}{done.stderr}"


def test_preload_variant_registers_when_loaded(builds):
    for include, build in builds.items():
        library = build / "preload_test" / "libtq_preload_under_test.so"
        done = subprocess.run([str(build / "tq_plugin_preload_test"), str(library)], capture_output=True, text=True)
        assert done.returncode == 0 and "PASSED" in done.stdout, f"against {include}:\n{done.stdout}{done.stderr}"
        needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
        assert "libnvinfer" not in needed, "the preload library must not link libnvinfer"


def read_back(binary: Path, table: Path) -> tuple[str, dict[str, np.ndarray]]:
    """The C++ reader's header line and every array it read ("name count v0 v1 ..." per line), as fp32."""
    done = subprocess.run([str(binary), "--table", str(table)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
    header, *lines = done.stdout.splitlines()
    arrays = {}
    for line in lines:
        name, count, *values = line.split()
        arrays[name] = np.array([float(v) for v in values], dtype=np.float32)  # 9 digits: fp32 exactly
        assert len(values) == int(count), line[:200]
    return header, arrays


def test_creator_declares_the_json_fields(unit_tests):
    """Name, namespace, version and every field's name and type, in order, as the one declaration
    (tq_trtllm/trt/quantized_attention_fields.json) says: the C++ side is generated from it."""
    declared = json.loads((ROOT / "tq_trtllm" / "trt" / "quantized_attention_fields.json").read_text())
    plugin = declared["plugin"]
    expected = [f"plugin {plugin['name']} {plugin['namespace']} {plugin['version']}"]
    expected += [f"field {f['name']} {f['type']}" for f in declared["fields"]]
    for include, binary in unit_tests.items():
        done = subprocess.run([str(binary), "--fields"], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines() == expected, f"against {include}"


FINGERPRINT = {"family": "llama", "layers": 6, "heads": 16, "kv_heads": 4, "head_dim": 128,
               "config_hash": "8000000000003039"}


def test_python_table_reads_back_in_cpp(unit_tests, tmp_path, gen):
    """Every element, in its place: the expected arrays come from the layer's own tensors and
    FORMAT.md's rules (the permutation rebuilt from the outlier sets), not from the writer."""
    head_dim, kv_heads, q_heads, layer, seed = 128, 4, 16, 5, 0xC0FFEE11
    outliers = torch.stack([torch.randperm(head_dim, generator=gen)[:head_dim // 2] for _ in range(kv_heads)])
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    rotary = select_pairs(torch.randn(kv_heads, head_dim, generator=gen, dtype=torch.float64), inv_freq, 16)
    mean = torch.randn(kv_heads, head_dim, generator=gen)
    scale = torch.rand(kv_heads, head_dim, generator=gen) + 0.5
    shift = torch.rand(q_heads, generator=gen)
    table = oblivious_table(FINGERPRINT, 3.0, 3.0)
    table.layers[layer] = entry = LayerTable(3.5, 3.0, seed, key_mean=mean, key_scale=scale, key_outliers=outliers,
                                             page_lse_shift=shift)
    entry.key_rotary = rotary
    key, value = table.codecs(layer)
    fingerprint = int(FINGERPRINT["config_hash"], 16)
    path = tmp_path / "table.bin"
    path.write_bytes(layer_table_bytes(table, layer, num_q_heads=q_heads, num_kv_heads=kv_heads,
                                       fingerprint=fingerprint))

    f32 = lambda t: np.asarray(torch.as_tensor(t).detach().cpu().numpy(), dtype=np.float32).ravel()  # noqa: E731
    perm = [sorted(int(c) for c in row) + sorted(set(range(head_dim)) - {int(c) for c in row}) for row in outliers]
    expected = {
        "key_codebooks": np.concatenate([f32(c) for c in key.codebooks]),
        "key_mean": f32(mean), "key_scale": f32(scale), "key_perm": np.array(perm).ravel(),
        "value_codebooks": np.concatenate([f32(c) for c in value.codebooks]),
        "value_mean": [], "value_scale": [], "value_perm": [],
        "page_shift": f32(shift),
        "rotary_channel": rotary.channels.numpy().ravel(), "rotary_freq": f32(rotary.freq),
        "rotary_mean": f32(rotary.mean),  # [H][P][2]
    }
    assert len(expected["key_codebooks"]) == 16 + 8  # 3.5 bits: a 4-bit and a 3-bit group
    for include, binary in unit_tests.items():
        header, got = read_back(binary, path)
        assert header == (f"fingerprint={fingerprint} layer={layer} kv_heads={kv_heads} q_heads={q_heads} "
                          f"head_dim={head_dim} key_x2=7 value_x2=6 seed={seed} rotary_pairs=16"), include
        assert sorted(got) == sorted(expected), include
        for name, want in expected.items():
            want = np.asarray(want, dtype=np.float32)  # small integers too are exact in fp32
            assert got[name].shape == want.shape, f"{name}: {got[name].shape} values, expected {want.shape}"
            wrong = np.flatnonzero(got[name] != want)
            assert wrong.size == 0, (f"against {include}: {name} differs at {wrong.size} of {want.size} elements, "
                                     f"first at {wrong[0]}: {got[name][wrong[0]]} != {want[wrong[0]]}")


def small_table(key_width: float = 2.0, head_dim: int = 64) -> KVTable:
    return oblivious_table({**FINGERPRINT, "layers": 1, "kv_heads": 1, "head_dim": head_dim}, key_width, 2.0)


def patched(blob: bytes, **fields) -> bytes:
    """`blob` with header fields (LayerTableHeader's names) replaced; the checksum kept as written."""
    names = ("magic", "version", "format_version", "header_bytes", "model_fingerprint", "layer_idx", "num_kv_heads",
             "head_dim", "key_width_x2", "value_width_x2", "flags", "payload_bytes", "checksum", "num_q_heads",
             "rotation_seed", "reserved")
    values = dict(zip(names, HEADER.unpack(blob[:HEADER.size])))
    values.update(fields)
    return HEADER.pack(*(values[n] for n in names)) + blob[HEADER.size:]


def table_error(binary: Path, path: Path, blob: bytes) -> str:
    path.write_bytes(blob)
    done = subprocess.run([str(binary), "--table", str(path)], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout.startswith("error: "), done.stdout + done.stderr
    return done.stdout[len("error: "):].strip()


def test_cpp_reader_refuses_bad_tables_with_their_messages(unit_tests, tmp_path):
    """Tables the Python writer never makes, each refused by the C++ reader with its reason. Every
    refusal is also checked inside the plugin's own messages by test_plugin_build.cpp."""
    good = layer_table_bytes(small_table(), 0, num_q_heads=2, num_kv_heads=1, fingerprint=1)
    binary, path = next(iter(unit_tests.values())), tmp_path / "table.bin"
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    cases = {
        "version 3": (patched(good, version=3),
                      "has layer table version 3; this plugin reads version 4: rebuild the engine (or ONNX graph) "
                      "with this tq_trtllm"),
        "reserved word": (patched(good, reserved=5), "has a non-zero reserved header word"),
        "checksum": (bytes(corrupt), "fails its checksum"),
        # head_dim and widths in the kernel library's words (tq_codec_codebook_entries)
        "width 5.5 in the header": (patched(good, key_width_x2=11), "has keys the kernel library cannot encode: ",
                                    "width_x2 11", "supported widths are 1, 1.5, "),
        "head_dim 96": (patched(good, head_dim=96), "has keys the kernel library cannot encode: ", "head_dim 96",
                        "64 and 128"),
        "GQA ratio 9": (patched(good, num_q_heads=9),
                        "has 9 query heads; the kernels need 1 to 8 times its 1 KV heads"),
        "query heads not a multiple": (patched(good, num_q_heads=3, num_kv_heads=2),
                                       "has 3 query heads; the kernels need 1 to 8 times its 2 KV heads"),
        "negative layer": (patched(good, layer_idx=-2), "has layer index -2; it must not be negative"),
        "header size": (patched(good, header_bytes=64), "has a malformed header (header size 64, not 72)"),
    }
    for name, (blob, *message) in cases.items():
        got = table_error(binary, path, blob)
        assert all(m in got for m in message), f"{name}: {got}"
    assert "is 40 bytes, shorter than its 72-byte header" in table_error(binary, path, good[:40])
