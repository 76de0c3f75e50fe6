"""The QuantizedAttention plugin libraries: where they are found, copied into an engine directory,
and loaded into the process before TensorRT builds or deserializes an engine (docs/PLUGIN.md
section 6)."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

from ..core.errors import TQError
from ..trt.plugin_fields import PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION

DYNAMIC = "libtq_attention_plugin.so"     # getCreators(): IPluginRegistry::loadLibrary, trtexec
PRELOAD = "libtq_attention_plugin_preload.so"  # registers at load time: LD_PRELOAD, Triton
KERNELS = "libtq_kernels.so"               # what both link, found through RPATH $ORIGIN
LIBRARIES = (DYNAMIC, PRELOAD, KERNELS)
ENGINE_LIB_DIR = "lib"

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_REPO = _PACKAGE_DIR.parent


def search_dirs() -> list[Path]:
    """$TQ_PLUGIN_DIR (or the tests' $TQ_PLUGIN_BUILD_DIR), the installed package's lib/, then a
    source checkout's build folders."""
    dirs = [Path(os.environ[v]) for v in ("TQ_PLUGIN_DIR", "TQ_PLUGIN_BUILD_DIR") if os.environ.get(v)]
    return dirs + [_PACKAGE_DIR / "lib", _REPO / "build" / "plugin_cpp" / "plugin",
                   _REPO / "build" / "plugin_cpp" / "kernels"]


def find_library(name: str, dirs: list[Path] | None = None) -> Path:
    for d in dirs or search_dirs():
        if (d / name).is_file():
            return d / name
    where = ", ".join(str(d) for d in (dirs or search_dirs()))
    raise TQError(f"{name} was not found in {where}; build it with build_scripts/build_kernels.sh "
                  "(needs TensorRT headers: build_scripts/fetch_trt_headers.sh) or set TQ_PLUGIN_DIR")


def copy_libraries(dest: Path) -> list[str]:
    """Copy the three libraries into `dest` (an engine's lib/); their RPATH $ORIGIN keeps them together."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in LIBRARIES:
        shutil.copy2(find_library(name), dest / name)
    return list(LIBRARIES)


def register_with_tensorrt(library: Path) -> None:
    """Load the dynamic library into TensorRT's plugin registry (the builder's, and the same
    libnvinfer's registry that TensorRT-LLM's C++ runtime deserializes with)."""
    import tensorrt as trt

    registry = trt.get_plugin_registry()
    if registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE) is not None:
        return
    handle = registry.load_library(str(library))
    if handle is None or registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE) is None:
        raise TQError(f"TensorRT could not load the QuantizedAttention plugin version {PLUGIN_VERSION} from "
                      f"{library} (built against another TensorRT major version, libtq_kernels.so missing beside "
                      "it, or an older plugin version: rebuild the engine with this tq_trtllm)")


def preload_into_process(library: Path) -> ctypes.CDLL:
    """dlopen the preload variant with RTLD_GLOBAL: its constructor registers the creator in the
    registry of the libnvinfer already in the process."""
    return ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
