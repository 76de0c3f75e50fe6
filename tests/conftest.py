"""Shared fixtures: seeded generators so every test draws fresh but reproducible data; and the
failure of tests whose required part is missing (required.py)."""

import pytest
import torch

from required import MISSING


def pytest_configure(config):
    config.addinivalue_line("markers", f"{MISSING}(reason): a required part is missing; the test fails")


def pytest_runtest_setup(item):
    mark = item.get_closest_marker(MISSING)
    if mark is not None:
        pytest.fail(mark.kwargs["reason"], pytrace=False)


@pytest.fixture
def gen(request):
    """A generator seeded from the test's name: different data per test, the same on every run."""
    seed = sum(map(ord, request.node.name)) * 7919
    return torch.Generator().manual_seed(seed)
