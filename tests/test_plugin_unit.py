"""The QuantizedAttention plugin's CPU tests, built and run against every TensorRT header tree found:
the build-time methods and fields (plugin_cpp/tests/test_plugin_build.cpp), the LD_PRELOAD variant's
load-time registration (test_preload_registration.cpp, against a stand-in libnvinfer), and a check
that the Python table writer and the C++ reader agree. Needs TensorRT's headers (build_scripts/fetch_trt_headers.md), CMake, a C++ compiler and the
CUDA toolkit's headers and runtime library; no GPU and no libnvinfer."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.rotary_mean import select_pairs
from tq_trtllm.core.spec import CodecSpec
from tq_trtllm.trt.plugin_fields import calibration_table_bytes

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def header_trees() -> list[Path]:
    if os.environ.get("TENSORRT_INCLUDE_DIR"):
        return [Path(os.environ["TENSORRT_INCLUDE_DIR"])]
    return sorted(p for p in (ROOT / "third_party_headers").glob("*/include") if (p / "NvInferRuntime.h").exists())


def missing_tools() -> str | None:
    if not header_trees():
        return "TensorRT headers not found (set TENSORRT_INCLUDE_DIR or see build_scripts/fetch_trt_headers.md)"
    if not shutil.which("cmake") or not (shutil.which("c++") or shutil.which("g++")):
        return "cmake or a C++ compiler is missing"
    nvcc = shutil.which("nvcc")
    if not nvcc and not Path("/usr/local/cuda/include/cuda_runtime_api.h").exists():
        return "the CUDA toolkit (its headers and cudart) is not installed"
    return None


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
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
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


def test_python_table_reads_back_in_cpp(unit_tests, tmp_path, gen):
    head_dim, kv_heads = 128, 4
    outliers = torch.stack([torch.randperm(head_dim, generator=gen)[:head_dim // 2] for _ in range(kv_heads)])
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    rotary = select_pairs(torch.randn(kv_heads, head_dim, generator=gen, dtype=torch.float64), inv_freq, 16)
    key = VectorCodec(CodecSpec(head_dim, 3.5), seed=11, mean=torch.randn(kv_heads, head_dim, generator=gen),
                      scale=torch.rand(kv_heads, head_dim, generator=gen) + 0.5, outliers=outliers,
                      rotary=rotary)
    value = VectorCodec(CodecSpec(head_dim, 3), seed=11)
    path = tmp_path / "table.bin"
    shift = torch.rand(16, generator=gen)
    path.write_bytes(calibration_table_bytes(key, value, layer_idx=5, kv_heads=kv_heads, num_q_heads=16,
                                             fingerprint=2**63 + 12345, page_lse_shift=shift))
    binary = next(iter(unit_tests.values()))
    done = subprocess.run([str(binary), "--table", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert lines[0] == f"fingerprint={2**63 + 12345} layer=5 kv_heads=4 q_heads=16 head_dim=128 key_x2=7 value_x2=6"
    key_line = {k: (int(n), float(s)) for k, n, s in re.findall(r"(\w+)=(\d+):(\S+)", lines[1])}
    value_line = {k: (int(n), float(s)) for k, n, s in re.findall(r"(\w+)=(\d+):(\S+)", lines[2])}
    assert key_line["codebooks"][0] == 16 + 8
    assert key_line["codebooks"][1] == pytest.approx(sum(float(c.sum()) for c in key.codebooks), abs=1e-5)
    assert key_line["mean"] == (kv_heads * head_dim, pytest.approx(float(key.mean.sum()), rel=1e-5, abs=1e-3))
    assert key_line["scale"] == (kv_heads * head_dim, pytest.approx(float(key.scale.sum()), rel=1e-5))
    assert key_line["perm"] == (kv_heads * head_dim, kv_heads * head_dim * (head_dim - 1) / 2)
    assert value_line["codebooks"][0] == 8 and value_line["mean"][0] == 0 and value_line["perm"][0] == 0
    n, total = lines[3].removeprefix("page_shift=").split(":")
    assert int(n) == 16 and float(total) == pytest.approx(float(shift.sum()), rel=1e-6)
    got = dict(re.findall(r"(\w+)=(\S+)", lines[4]))
    assert int(got["rotary"]) == 16 and float(got["channel"]) == float(rotary.channels.sum())
    assert float(got["freq"]) == pytest.approx(float(rotary.freq.sum()), rel=1e-6)
    assert float(got["mean"]) == pytest.approx(float(rotary.mean.sum()), rel=1e-5, abs=1e-5)


def test_corrupt_python_table_is_refused(unit_tests, tmp_path):
    key = value = VectorCodec(CodecSpec(64, 2), seed=0)
    table = bytearray(calibration_table_bytes(key, value, layer_idx=0, kv_heads=1, num_q_heads=1, fingerprint=1))
    table[-1] ^= 0xFF
    path = tmp_path / "table.bin"
    path.write_bytes(bytes(table))
    done = subprocess.run([str(next(iter(unit_tests.values()))), "--table", str(path)], capture_output=True, text=True)
    assert done.returncode == 1 and "checksum" in done.stdout
