"""tq-bench's argument parsing (the benchmarks themselves need a GPU: docs/BENCHMARKS.md)."""

import pytest

from tq_trtllm.cli.bench import _parse_pairs, _parse_widths
from tq_trtllm.core.errors import TQError


def test_widths_take_uniform_widths_and_key_value_pairs():
    assert _parse_widths("3, 4.5,k5v3") == [(3.0, 3.0), (4.5, 4.5), (5.0, 3.0)]
    with pytest.raises(TQError, match="KV width 6 is not supported"):
        _parse_widths("3,k6v3")


def test_sizes_are_batch_by_context():
    assert _parse_pairs("1x4096, 32X32768") == [(1, 4096), (32, 32768)]
