"""What the TensorRT-LLM path needs, said in one line before any work starts."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from ..core.errors import TQError

SUPPORTED_SERIES = "1.2"
WHERE = ("pip install 'tensorrt_llm==1.2.*' --extra-index-url https://pypi.nvidia.com, or run in "
         "NVIDIA's NGC container nvcr.io/nvidia/tensorrt-llm/release:1.2.x (docs/TRTLLM.md)")


def installed_version() -> str | None:
    """TensorRT-LLM's version as pip records it, without importing it (the import loads CUDA)."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def unavailable_reason() -> str | None:
    """None where a TensorRT-LLM of the supported series is installed, else why not."""
    version = installed_version()
    if version is None:
        return "TensorRT-LLM is not installed"
    if not version.startswith(SUPPORTED_SERIES + "."):
        return f"TensorRT-LLM {version} is installed, but this path is written against {SUPPORTED_SERIES}.x"
    return None


def require_tensorrt_llm(what: str) -> None:
    """TQError naming what is missing and where to get it, unless TensorRT-LLM 1.2.x is installed."""
    why = unavailable_reason()
    if why is not None:
        raise TQError(f"{what} needs TensorRT-LLM {SUPPORTED_SERIES}.x on a Hopper (SM90) GPU ({why} here): {WHERE}")
