"""The Triton model repository that tq-serve writes: one model per engine directory and one FP16
cache baseline per checkpoint, each a directory with config.pbtxt and 1/model.py, the files a user
would put into NVIDIA's Triton container. model.py only imports tq_trtllm.serving.model_backend, so
the repository works wherever tq_trtllm is installed in the Python that runs the backend.

The repository is written into a temporary sibling and renamed into place; an existing directory
is replaced only when tq-serve wrote it (its MARKER file).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import TQError

MARKER = ".tq-serve-repository"
MODEL_PY = '''"""Triton Python backend model served by tq_trtllm (docs/SERVING.md)."""

from tq_trtllm.serving.model_backend import TritonPythonModel  # noqa: F401
'''

INPUTS = [  # (name, Triton type, dims, optional): the conventions of Triton's LLM backends
    ("text_input", "TYPE_STRING", "1", False),
    ("max_tokens", "TYPE_INT32", "1", False),
    ("temperature", "TYPE_FP32", "1", True),
    ("top_p", "TYPE_FP32", "1", True),
    ("seed", "TYPE_UINT64", "1", True),
    ("stop", "TYPE_STRING", "-1", True),
    ("stream", "TYPE_BOOL", "1", True),
]


@dataclass
class ModelEntry:
    name: str
    engine_dir: Path
    cache: str  # "turboquant" or "fp16"


def model_name(text: str) -> str:
    """A Triton model name from a directory or checkpoint name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "model"


def plan_models(engine_dirs: list[Path]) -> list[ModelEntry]:
    """One model per engine, then one FP16 baseline per (family, checkpoint); every engine's
    manifest and tables are checked here, so a broken one stops tq-serve before the server."""
    from ..calibration.tables_io import load_table
    from ..engine import read_manifest, tables_path

    entries, baselines = [], {}
    for engine in engine_dirs:
        engine = Path(engine).resolve()
        manifest = read_manifest(engine)
        load_table(tables_path(engine, manifest))
        entries.append(ModelEntry(model_name(engine.name), engine, "turboquant"))
        ckpt = manifest.get("checkpoint")
        key = (manifest["model"], ckpt)
        if key not in baselines:
            stem = f"{manifest['model']}-{Path(ckpt).stem}" if ckpt else manifest["model"]
            baselines[key] = ModelEntry(model_name(f"{stem}-fp16"), engine, "fp16")
    entries += baselines.values()
    names = [e.name for e in entries]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TQError(f"two models would be named {', '.join(dupes)}; give the engine directories "
                      "different names")
    return entries


def config_pbtxt(entry: ModelEntry, engine_dir: str, kv_cache_bytes: int, instance_kind: str,
                 instances: int, max_active: int, cpu_threads: int = 1) -> str:
    inputs = ",\n".join(
        f'  {{ name: "{name}" data_type: {dtype} dims: [ {dims} ]{" optional: true" if opt else ""} }}'
        for name, dtype, dims, opt in INPUTS)
    params = {"engine_dir": engine_dir, "cache": entry.cache, "kv_cache_bytes": kv_cache_bytes,
              "max_active_sequences": max_active, "cpu_threads": cpu_threads}
    parameters = "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
                           for k, v in params.items())
    return (f'name: "{entry.name}"\nbackend: "python"\nmax_batch_size: 0\n'
            "# streaming: any number of responses per request (Triton's LLM backends' convention)\n"
            "model_transaction_policy { decoupled: true }\n"
            f"input [\n{inputs}\n]\n"
            'output [\n  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }\n]\n'
            "# KIND_GPU with a count: that many instances on every visible GPU (data parallel)\n"
            f"instance_group [ {{ count: {instances} kind: {instance_kind} }} ]\n"
            f"{parameters}\n")


def default_instance_kind() -> str:
    import torch

    return "KIND_GPU" if torch.cuda.is_available() else "KIND_CPU"


def write_repository(engine_dirs: list[Path], repo: Path, kv_cache_bytes: int,
                     instance_kind: str | None = None, instances: int = 1, max_active: int = 64,
                     copy_engines: bool = False, cpu_threads: int = 1) -> list[ModelEntry]:
    """Write the repository at `repo` (replacing one tq-serve wrote); returns its models."""
    entries = plan_models(engine_dirs)
    kind = instance_kind or default_instance_kind()
    repo = Path(repo).resolve()
    if repo.exists() and not (repo / MARKER).is_file():
        raise TQError(f"{repo} exists and was not written by tq-serve; remove it or choose another --repo")
    repo.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{repo.name}.", dir=repo.parent))
    try:
        for entry in entries:
            model = tmp / entry.name
            (model / "1").mkdir(parents=True)
            engine_dir = str(entry.engine_dir)
            if copy_engines:  # a self-contained repository: engine_dir relative to the model directory
                shutil.copytree(entry.engine_dir, model / "engine")
                engine_dir = "engine"
            (model / "config.pbtxt").write_text(
                config_pbtxt(entry, engine_dir, kv_cache_bytes, kind, instances, max_active, cpu_threads))
            (model / "1" / "model.py").write_text(MODEL_PY)
        (tmp / MARKER).write_text("written by tq-serve; tq-serve may replace this directory\n")
        old = None
        if repo.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{repo.name}.old.", dir=repo.parent))
            os.rename(repo, old / "repo")
        os.rename(tmp, repo)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entries
