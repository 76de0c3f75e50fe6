"""Skips that a switch turns into failures: where the environment says a part is required, a test
that needs it must not pass by skipping.

TQ_REQUIRE_GPU=1 (the device scripts set it): GPU tests fail where there is no CUDA device or no
built kernel library. TQ_REQUIRE_CUDA_BUILD=1 (the test command sets it where nvcc exists): CPU
tests that need nvcc or the built libtq_kernels.so fail where they are missing.
TQ_REQUIRE_PLUGIN=1: tests of the TensorRT plugin fail where it is not built.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_GPU = "TQ_REQUIRE_GPU"
REQUIRE_CUDA_BUILD = "TQ_REQUIRE_CUDA_BUILD"
REQUIRE_PLUGIN = "TQ_REQUIRE_PLUGIN"
MISSING = "required_missing"  # the mark tests/conftest.py fails at setup


def is_required(switch: str) -> bool:
    return os.environ.get(switch) == "1"


def needs(reason: str | None, switch: str):
    """The mark of a test that needs what `reason` says is missing (None: nothing is missing): a
    skip with the reason, or, where `switch`=1, a failure that names the switch."""
    if reason is None:
        return pytest.mark.skipif(False, reason="")
    if is_required(switch):
        return getattr(pytest.mark, MISSING)(reason=f"{switch}=1, but {reason}")
    return pytest.mark.skip(reason=reason)
