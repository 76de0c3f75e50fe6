"""Shared pieces of the command-line tools: turning TQError into a clean click error."""

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
