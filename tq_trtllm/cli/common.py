"""Shared pieces of the command-line tools: turning TQError into a clean click error, the
--device choice (where the model and its cache run), the widths a command takes, and the checks
that run before any long step.

Nothing here imports torch or transformers at module level: `--help` stays quick."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import click

from ..core.errors import TQError
from ..core.spec import SUPPORTED_WIDTHS, parse_kv_bits


def clean_errors(func):
    """Report TQError (bad input) as a one-line click error, never a traceback."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except TQError as err:
            raise click.ClickException(str(err)) from None
    return wrapper


def device_option(func):
    """--device for commands that run the model with an engine's cache (see place_model)."""
    return click.option(
        "--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
        help="cuda: the model in bfloat16 on the GPU, the cache on the kernel library; cpu: float32 "
             "on the Python reference; auto: cuda where the kernels can run.")(func)


def check_device(device: str) -> str | None:
    """Refuses --device cuda where the kernel library cannot run (before any model loads); returns
    why the kernels cannot run here, or None."""
    from .. import kernels

    why_not = kernels.unavailable_reason()
    if device == "cuda" and why_not:
        raise TQError(f"--device cuda cannot run here: {why_not}")
    return why_not


def place_model(model, device: str) -> bool:
    """Moves the model to the GPU in bfloat16 where --device asks for it; True when it did, and the
    TurboQuant cache then runs on the kernel library."""
    import torch

    why_not = check_device(device)
    on_gpu = device == "cuda" or (device == "auto" and why_not is None)
    if on_gpu:
        model.to("cuda", torch.bfloat16)
    return on_gpu


def comma_list(text: str, convert, what: str) -> list:
    """The comma-separated values of an option, each through `convert`; `what` names them in the
    error."""
    try:
        return [convert(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of {what}") from None


def token_lengths(text: str) -> list[int]:
    values = comma_list(text, int, "token counts")
    if not values or min(values) < 64:
        raise click.BadParameter("give context lengths of at least 64 tokens")
    return values


def widths_text(accepted) -> str:
    return ", ".join(f"{w:g}" for w in accepted[:-1]) + f" or {accepted[-1]:g}"


def kv_widths(text: str, option: str, accepted=SUPPORTED_WIDTHS, pairs: bool = True,
              why: str = "") -> tuple[float, float]:
    """A width ('3', '2.5') or, with `pairs`, a K/V pair ('k4v3') -> (key, value) widths, each one
    of `accepted`; the error lists those alone (`why`: the reason others are left out)."""
    try:
        key, value = parse_kv_bits(text) if pairs else (float(text),) * 2
    except (TQError, ValueError):
        key = value = None
    if key not in accepted or value not in accepted:
        pair = ", or a K/V pair of them such as k4v3" if pairs else ""
        raise TQError(f"{option} {text} is not a width this command takes: use "
                      f"{widths_text(accepted)} bits{pair}{why}")
    return key, value


def check_output_dir(output: Path) -> None:
    """An engine directory can be written at `output`: it does not exist yet, and its parent (or the
    nearest ancestor that exists, where tq-build creates the rest) is a directory it may write in."""
    if output.exists() or output.is_symlink():
        raise TQError(f"output {output} already exists; remove it or choose another --output")
    ancestor = output.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise TQError(f"output {output}: {ancestor} is a file, not a directory; choose another --output")
    try:  # what the final write does; os.access would say yes to root on a read-only mount
        os.rmdir(tempfile.mkdtemp(prefix=".tq-write-check.", dir=ancestor))
    except OSError as err:
        raise TQError(f"output {output}: cannot write in {ancestor} ({err.strerror}); choose another "
                      "--output") from None
