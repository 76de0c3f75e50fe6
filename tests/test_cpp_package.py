"""The kernel library as an installed C++ package: `cmake --install` of the project's build, then
examples/cpp configured and built as a separate CMake project with find_package(tq_kernels), the
way a C++ engine embeds the library. Compiles here (nvcc, sm_90a); running needs a Hopper GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
LIBRARY = BUILD / "plugin_cpp" / "kernels" / "libtq_kernels.so"


def _missing() -> str | None:
    if not shutil.which("nvcc"):
        return "nvcc not found: the CUDA toolkit is not installed"
    if not LIBRARY.exists():
        return f"{LIBRARY} not built (bash build_scripts/build_kernels.sh)"
    return None


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture
def installed(tmp_path):
    reason = _missing()
    if reason:
        if os.environ.get("TQ_REQUIRE_CUDA_BUILD") == "1":
            pytest.fail(f"TQ_REQUIRE_CUDA_BUILD=1: {reason}")
        pytest.skip(reason)
    prefix = tmp_path / "prefix"
    _run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)])
    return prefix


def test_install_holds_library_header_and_package(installed):
    lib = installed / "lib"
    assert (lib / "libtq_kernels.so").exists()
    assert (installed / "include" / "tq" / "tq_kernels.h").exists()
    config = lib / "cmake" / "tq_kernels"
    for name in ("tq_kernelsConfig.cmake", "tq_kernelsConfigVersion.cmake", "tq_kernelsTargets.cmake"):
        assert (config / name).exists(), name


def test_example_builds_against_the_installed_package(installed, tmp_path):
    out = tmp_path / "examples"
    _run(["cmake", "-S", str(ROOT / "examples" / "cpp"), "-B", str(out), "-G", "Ninja",
          f"-DCMAKE_PREFIX_PATH={installed}", "-DCMAKE_BUILD_TYPE=Release"])
    _run(["cmake", "--build", str(out)])
    exe = out / "tq_decode_step"
    assert exe.exists()
    linked = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout
    # The program links the installed library, not the build tree's copy.
    line = next(line for line in linked.splitlines() if "libtq_kernels.so" in line)
    assert str(installed / "lib") in line, line
