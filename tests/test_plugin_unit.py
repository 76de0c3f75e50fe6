"""The QuantizedAttention plugin's CPU tests, built and run against each TensorRT header tree: the
OSS headers of TensorRT 10.13 and 11.1 in ../shared/third_party/tensorrt-oss (or
$TENSORRT_INCLUDE_DIR, or third_party_headers/ from build_scripts/fetch_trt_headers.sh). They cover
the build-time methods and fields (plugin_cpp/tests/test_plugin_build.cpp), the LD_PRELOAD variant's
load-time registration (test_preload_registration.cpp, against a stand-in libnvinfer), and a check
that every value of a table the Python writer makes reads back in C++ as written. Needs CMake, a C++
compiler and the CUDA toolkit's headers and runtime library; no GPU, no nvcc run, no libnvinfer.
Skipped with the reason where something is missing; failed instead where TQ_REQUIRE_PLUGIN=1."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from required import REQUIRE_PLUGIN, is_required, needs
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.rotary_mean import select_pairs
from tq_trtllm.core.spec import CodecSpec
from tq_trtllm.trt.plugin_fields import calibration_table_bytes

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


def test_python_table_reads_back_in_cpp(unit_tests, tmp_path, gen):
    """Every element, in its place: the expected arrays come from the codecs' own tensors and
    FORMAT.md's rules (the permutation rebuilt from the outlier sets), not from the writer."""
    head_dim, kv_heads, q_heads = 128, 4, 16
    outliers = torch.stack([torch.randperm(head_dim, generator=gen)[:head_dim // 2] for _ in range(kv_heads)])
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    rotary = select_pairs(torch.randn(kv_heads, head_dim, generator=gen, dtype=torch.float64), inv_freq, 16)
    mean = torch.randn(kv_heads, head_dim, generator=gen)
    scale = torch.rand(kv_heads, head_dim, generator=gen) + 0.5
    key = VectorCodec(CodecSpec(head_dim, 3.5), seed=11, mean=mean, scale=scale, outliers=outliers, rotary=rotary)
    value = VectorCodec(CodecSpec(head_dim, 3), seed=11)
    shift = torch.rand(q_heads, generator=gen)
    fingerprint = 2**63 + 12345
    path = tmp_path / "table.bin"
    path.write_bytes(calibration_table_bytes(key, value, layer_idx=5, kv_heads=kv_heads, num_q_heads=q_heads,
                                             fingerprint=fingerprint, page_lse_shift=shift))

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
        assert header == (f"fingerprint={fingerprint} layer=5 kv_heads={kv_heads} q_heads={q_heads} "
                          f"head_dim={head_dim} key_x2=7 value_x2=6 rotary_pairs=16"), include
        assert sorted(got) == sorted(expected), include
        for name, want in expected.items():
            want = np.asarray(want, dtype=np.float32)  # small integers too are exact in fp32
            assert got[name].shape == want.shape, f"{name}: {got[name].shape} values, expected {want.shape}"
            wrong = np.flatnonzero(got[name] != want)
            assert wrong.size == 0, (f"against {include}: {name} differs at {wrong.size} of {want.size} elements, "
                                     f"first at {wrong[0]}: {got[name][wrong[0]]} != {want[wrong[0]]}")


def test_corrupt_python_table_is_refused(unit_tests, tmp_path):
    key = value = VectorCodec(CodecSpec(64, 2), seed=0)
    table = bytearray(calibration_table_bytes(key, value, layer_idx=0, kv_heads=1, num_q_heads=1, fingerprint=1))
    table[-1] ^= 0xFF
    path = tmp_path / "table.bin"
    path.write_bytes(bytes(table))
    done = subprocess.run([str(next(iter(unit_tests.values()))), "--table", str(path)], capture_output=True, text=True)
    assert done.returncode == 1 and "checksum" in done.stdout
