"""The TensorRT-LLM engine directory:

    <engine>/manifest.json        tq_trtllm's manifest (backend "trtllm", a "trtllm" section)
    <engine>/tables.safetensors   the whole calibration table (every KV head)
    <engine>/config.json          TensorRT-LLM's engine config, head_size = the packed value
    <engine>/rank<r>.engine       one serialized engine per tensor-parallel rank
    <engine>/lib/                 libtq_attention_plugin.so, ..._preload.so, libtq_kernels.so
    <engine>/tokenizer/           the model's tokenizer (tq-run, Triton's pre/postprocessing)

Every rank engine carries its own heads' layer tables in its plugin fields; tables.safetensors is
what the reference runtime and tq-eval compare against.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.errors import TQError
from ..core.spec import check_format_version
from ..engine import ENGINE_VERSION, MANIFEST, TABLES

BACKEND = "trtllm"
CONFIG = "config.json"
TOKENIZER_DIR = "tokenizer"


def rank_engine_name(rank: int) -> str:
    """TensorRT-LLM's name for a rank's engine file (Engine.save / ModelRunnerCpp.from_dir)."""
    return f"rank{rank}.engine"


def read_trtllm_manifest(path: str | Path) -> dict:
    """The manifest of a TensorRT-LLM engine directory, refused unless it is complete."""
    path = Path(path)
    file = path / MANIFEST
    if not file.is_file():
        raise TQError(f"{path} is not an engine directory: {MANIFEST} is missing (build one with "
                      "tq-build --backend trtllm)")
    try:
        manifest = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TQError(f"{file} is not valid JSON: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("engine_version") != ENGINE_VERSION:
        raise TQError(f"{file}: engine version is not readable; this tq_trtllm reads version {ENGINE_VERSION}")
    check_format_version(manifest.get("format_version"))
    if manifest.get("backend") != BACKEND or not isinstance(manifest.get("trtllm"), dict):
        raise TQError(f"{path} is a '{manifest.get('backend')}' engine; --backend trtllm runs engines built "
                      "with tq-build --backend trtllm")
    section = manifest["trtllm"]
    missing = [n for n in [CONFIG, manifest.get("tables", TABLES)]
               + [rank_engine_name(r) for r in range(int(section.get("tp_size", 1)))]
               if not (path / n).is_file()]
    if missing:
        raise TQError(f"{path} lacks {', '.join(missing)}; rebuild it with tq-build --backend trtllm")
    return manifest


def library_dir(path: str | Path, manifest: dict) -> Path:
    return Path(path) / manifest["trtllm"].get("libraries", "lib")
