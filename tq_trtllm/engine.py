"""Engine directories: manifest.json plus the calibration tables, written atomically.

An engine names its model (family and checkpoint; no checkpoint means the embedded default), the
backend, the bit widths and the table file. `check_engine` reads and validates the manifest and the
tables without loading the model (every command calls it before a model load); `open_engine` then
loads the model and refuses tables that do not match it.

Engine directories are readable by every user the umask allows (0755 / 0644 under the usual 022):
a server may run as another user than the one who built the engine.
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
from .models.fingerprint import fingerprint, fingerprint_differences

ENGINE_VERSION = 1
MANIFEST = "manifest.json"
TABLES = "tables.safetensors"


@dataclass
class Engine:
    path: Path
    manifest: dict
    table: KVTable
    loaded: LoadedModel


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
        # mkdtemp makes the directory private (0700) and safetensors its file 0600: open both up
        # as far as the umask allows, as a plain mkdir and open would
        mask = _umask()
        for file in tmp.iterdir():
            file.chmod(0o666 & ~mask)
        tmp.chmod(0o777 & ~mask)
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


def check_engine(path: str | Path) -> tuple[dict, KVTable]:
    """The manifest and the tables of the engine directory `path`, both validated, and its
    checkpoint present: everything that can be refused before the model loads."""
    path = Path(path)
    if not path.is_dir():
        raise TQError(f"engine directory {path} does not exist" if not path.exists() else
                      f"{path} is a file, not an engine directory (tq-build writes a directory)")
    manifest = read_manifest(path)
    table = load_table(tables_path(path, manifest))
    checkpoint = manifest.get("checkpoint")
    if checkpoint is not None and not Path(checkpoint).exists():
        raise TQError(f"engine {path} was built from checkpoint {checkpoint}, which no longer exists")
    return manifest, table


def check_model(tables: Path, table: KVTable, loaded: LoadedModel) -> None:
    """Refuses a table (read from the file `tables`) made for another model than the loaded one."""
    diffs = fingerprint_differences(table.fingerprint, fingerprint(loaded.family.name, loaded.config))
    if diffs:
        raise TQError(f"calibration table {tables} was made for another model: " + "; ".join(diffs))


def open_engine(path: str | Path) -> Engine:
    """The engine at `path`, checked (check_engine), then its model loaded."""
    path = Path(path)
    manifest, table = check_engine(path)
    loaded = load_model(manifest["model"], manifest.get("checkpoint"))
    check_model(tables_path(path, manifest), table, loaded)
    return Engine(path, manifest, table, loaded)
