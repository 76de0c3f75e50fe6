"""A passkey run's rows file (tq-eval needle --rows): every finished seed's prompts appended as one
JSON line, so that a run stopped early (a deadline, a crash) resumes where it stopped, and the
files of runs on other seeds, concatenated, give one report.

A line is {"run": what produced the prompts (caches, engine tables, filler, graded, backend),
"rows": the prompts of one seed, as passkey_accuracy returns them}. Rows are only reused for the
same run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..core.errors import TQError


def read_rows(path: str | Path, run: dict) -> dict:
    """(seed, length, depth) -> row of every prompt in `path` (none when it does not exist yet).
    A last line cut short by a stopped run is dropped from the file; any other bad line, or a line
    of another run, is refused."""
    path = Path(path)
    if not path.exists():
        return {}
    text = path.read_text()
    lines = text.split("\n")
    if lines[-1]:  # written without its newline: the run stopped while writing it
        text = "\n".join(lines[:-1]) + ("\n" if len(lines) > 1 else "")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    known = {}
    for number, line in enumerate(lines[:-1], start=1):
        try:
            entry = json.loads(line)
            entry_run = entry["run"]
            rows = {(row["seed"], row["length"], row["depth"]): row for row in entry["rows"]}
        except (ValueError, KeyError, TypeError) as e:
            raise TQError(f"{path}, line {number}, is not a line of tq-eval needle --rows ({e}); "
                          "move the file away or give another --rows file") from None
        if entry_run != run:
            differs = "; ".join(f"{key}: {entry_run.get(key)!r} there, {value!r} now"
                                for key, value in run.items() if entry_run.get(key) != value)
            raise TQError(f"{path}, line {number}, holds prompts of another run ({differs}); give "
                          "the engines, --baseline, --filler, --graded and --device of the run "
                          "that wrote it, or another --rows file")
        known.update(rows)
    return known


def append_rows(path: str | Path, run: dict, rows: list[dict]) -> None:
    """One line for `rows`, on disk before this returns."""
    with open(path, "a") as f:
        f.write(json.dumps({"run": run, "rows": rows}) + "\n")
        f.flush()
        os.fsync(f.fileno())
