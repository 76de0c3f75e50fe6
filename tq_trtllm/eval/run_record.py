"""Where and how a measurement was taken, so a JSON row of tq-bench or tq-eval can be traced to
its command, GPU, driver and source revision (docs/results/*.jsonl hold such rows)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _command_line(argv: list[str]) -> str:
    """The command as a user would retype it: `tq-bench decode --json`, or
    `python3 -m tq_trtllm.cli.bench decode --json` when run as a module."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if argv and argv[0].endswith(".py") and spec is not None and spec.name.startswith("tq_trtllm."):
        head = ["python3", "-m", spec.name]
    else:
        head = [Path(argv[0]).name] if argv else []
    return shlex.join(head + list(argv[1:]))


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(_PACKAGE_DIR), *args], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _revision() -> tuple[str | None, bool | None]:
    """(short commit, whether tracked files differ from it), or (None, None) when the package does
    not run from a git checkout (an installed wheel: a parent repository would be the wrong one).
    $TQ_REVISION ("<commit>" or "<commit>-dirty") names it where the tree was copied without its
    git history (the GPU machine's copy: build_scripts/device_bench_prep.sh records it)."""
    named = os.environ.get("TQ_REVISION")
    if named:
        commit, _, flag = named.partition("-")
        return commit, flag == "dirty"
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() / "tq_trtllm" != _PACKAGE_DIR:
        return None, None
    commit = _git("rev-parse", "--short=12", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, (None if status is None else bool(status))


def _driver_version() -> str | None:
    """The NVIDIA driver version (e.g. 570.124.06): nvidia-smi, else the kernel module's banner."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, check=False)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:  # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06  Thu ..."
        words = Path("/proc/driver/nvidia/version").read_text().split()
        return words[words.index("Module") + 1]
    except (OSError, ValueError, IndexError):
        return None


def _torch_and_gpu() -> tuple[str | None, str | None]:
    try:
        import torch
    except ImportError:
        return None, None
    gpu = torch.cuda.get_device_name(torch.cuda.current_device()) if torch.cuda.is_available() else None
    return torch.__version__, gpu


def run_metadata(argv: list[str] | None = None) -> dict:
    """The run's metadata, to merge into each JSON row a tool writes: command, gpu (None on a CPU
    run), driver (None without a GPU), UTC date, git revision and dirty flag (None outside a
    checkout), torch and package versions. argv: the command line, sys.argv by default."""
    from .. import __version__

    torch_version, gpu = _torch_and_gpu()
    revision, dirty = _revision()
    return {
        "command": _command_line(sys.argv if argv is None else argv),
        "gpu": gpu,
        "driver": _driver_version() if gpu is not None else None,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "revision": revision,
        "dirty": dirty,
        "torch": torch_version,
        "tq_trtllm": __version__,
    }
