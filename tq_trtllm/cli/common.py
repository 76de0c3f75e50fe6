"""Shared pieces of the command-line tools: turning TQError into a clean click error, and the
--device choice (where the model and its cache run)."""

from __future__ import annotations

import functools

import click

from ..core.errors import TQError


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


def place_model(model, device: str) -> bool:
    """Moves the model to the GPU in bfloat16 where --device asks for it; True when it did, and the
    TurboQuant cache then runs on the kernel library."""
    import torch

    from .. import kernels

    why_not = kernels.unavailable_reason()
    if device == "cuda" and why_not:
        raise TQError(f"--device cuda cannot run here: {why_not}")
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
