"""Engine directories: manifest.json plus the calibration tables, written atomically.

An engine names its model (family and checkpoint; no checkpoint means the embedded default), the
backend, the bit widths and the table file. `open_engine` loads the model and refuses tables that
do not match it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .calibration.calibrate import REFERENCE_CONTEXT
from .calibration.table import KVTable
from .calibration.tables_io import load_table, save_table
from .core.errors import TQError
from .core.spec import FORMAT_VERSION, check_format_version
from .models.checkpoint import LoadedModel, load_model
from .models.fingerprint import fingerprint

ENGINE_VERSION = 1
MANIFEST = "manifest.json"
TABLES = "tables.safetensors"


@dataclass
class Engine:
    path: Path
    manifest: dict
    table: KVTable
    loaded: LoadedModel


def write_engine(output: Path, family: str, checkpoint: str | None, backend: str,
                 table: KVTable) -> dict:
    """Write the engine into a temporary sibling directory, then rename it to `output`."""
    output = Path(output)
    if output.exists():
        raise TQError(f"output {output} already exists; remove it or choose another --output")
    output.parent.mkdir(parents=True, exist_ok=True)
    key_avg, value_avg = table.average_widths()
    manifest = {
        "engine_version": ENGINE_VERSION,
        "format_version": FORMAT_VERSION,
        "tq_trtllm_version": __version__,
        "model": family,
        "checkpoint": str(Path(checkpoint).resolve()) if checkpoint else None,
        "backend": backend,
        "kv_bits": table.kv_bits,
        "key_widths": [t.key_width for t in table.layers],
        "value_widths": [t.value_width for t in table.layers],
        "average_widths": {"key": key_avg, "value": value_avg, "all": (key_avg + value_avg) / 2},
        "effective_bits": {"context": REFERENCE_CONTEXT,
                           "bits": table.effective_bits(REFERENCE_CONTEXT)},
        "sink_tokens": table.sink_tokens,
        "recent_tokens": table.recent_tokens,
        "tables": TABLES,
        "fingerprint": table.fingerprint,
        "calibration": {k: v for k, v in table.calibration.items() if k != "fisher_costs"},
    }
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        save_table(table, tmp / TABLES)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.rename(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def read_manifest(path: Path) -> dict:
    file = Path(path) / MANIFEST
    if not file.is_file():
        raise TQError(f"{path} is not an engine directory: {MANIFEST} is missing (build one with tq-build)")
    try:
        manifest = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TQError(f"{file} is not valid JSON: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("engine_version") != ENGINE_VERSION:
        raise TQError(f"{file}: engine version {manifest.get('engine_version') if isinstance(manifest, dict) else None} "
                      f"is not readable; this tq_trtllm reads version {ENGINE_VERSION}")
    check_format_version(manifest.get("format_version"))
    if manifest.get("backend") != "hf":
        raise TQError(f"{file}: backend {manifest.get('backend')!r} cannot run here; tq-run runs 'hf' engines")
    return manifest


def tables_path(path: str | Path, manifest: dict) -> Path:
    """The engine directory `path`'s tables file, as its manifest names it."""
    return Path(path) / manifest.get("tables", TABLES)


def open_engine(path: str | Path) -> Engine:
    path = Path(path)
    manifest = read_manifest(path)
    loaded = load_model(manifest["model"], manifest.get("checkpoint"))
    table = load_table(tables_path(path, manifest), fingerprint(loaded.family.name, loaded.config))
    return Engine(path, manifest, table, loaded)
