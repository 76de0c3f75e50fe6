"""Shared fixtures: seeded generators so every test draws fresh but reproducible data."""

import pytest
import torch


@pytest.fixture
def gen(request):
    """A generator seeded from the test's name: different data per test, the same on every run."""
    seed = sum(map(ord, request.node.name)) * 7919
    return torch.Generator().manual_seed(seed)
