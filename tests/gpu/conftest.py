"""GPU tests: skipped, with the reason, where there is no CUDA device or no built kernel library;
failed instead where TQ_REQUIRE_GPU=1 (the device scripts set it)."""

import pytest

from required import REQUIRE_GPU, needs
from tq_trtllm.kernels import unavailable_reason


def pytest_collection_modifyitems(config, items):
    reason = unavailable_reason()
    for item in items:
        if "tests/gpu/" in item.nodeid.replace("\\", "/") or item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(needs(reason, REQUIRE_GPU))
