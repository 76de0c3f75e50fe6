"""Host-only checks of the kernel library, compiled with nvcc and run on the CPU (no GPU): the
register look-up tables of tile_decode.cuh (plugin_cpp/kernels/tests/tile_decode_test.cu), the
float division of attention_common.cuh (small_divisor_test.cu), and the attention plan with a
call's checks against it (attention_plan_test.cu). CI has nvcc: it compiles the kernel library
with it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from required import REQUIRE_CUDA_BUILD, needs

ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc")


# each test's source, and the library's sources it runs (host code only)
SOURCES = {"tile_decode_test.cu": [], "small_divisor_test.cu": [],
           "attention_plan_test.cu": ["attention_plan.cpp", "cache.cpp", "layout.cpp", "errors.cpp",
                                      "codec.cpp", "last_error.cpp"]}


@needs(None if NVCC else "nvcc not found: the CUDA toolkit is not installed", REQUIRE_CUDA_BUILD)
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_host_check_passes(tmp_path, source):
    exe = tmp_path / source.removesuffix(".cu")
    kernels = ROOT / "plugin_cpp" / "kernels"
    built = subprocess.run([NVCC, "-std=c++17", "--expt-relaxed-constexpr", "-O2",
                            "-I", str(ROOT / "plugin_cpp" / "include"), "-x", "cu",
                            str(kernels / "tests" / source), *(str(kernels / s) for s in SOURCES[source]),
                            "-o", str(exe)],
                           capture_output=True, text=True)
    assert built.returncode == 0, f"nvcc could not compile {source}:\n{built.stderr}"
    done = subprocess.run([str(exe)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith(": ok")
