"""tq-bench's argument parsing (the benchmarks themselves need a GPU: docs/BENCHMARKS.md)."""

import pytest

from tq_trtllm.cli.bench import _parse_pairs, _parse_widths
from tq_trtllm.core.errors import TQError


def test_widths_take_uniform_widths_and_key_value_pairs():
    assert _parse_widths("3, 4.5,k5v3") == [(3.0, 3.0), (4.5, 4.5), (5.0, 3.0)]
    with pytest.raises(TQError, match="--bits k6v3 is not a width this command takes: use 1, 1.5, "):
        _parse_widths("3,k6v3")


def test_sizes_are_batch_by_context():
    assert _parse_pairs("1x4096, 32X32768") == [(1, 4096), (32, 32768)]


def test_engine_step_adds_each_layer_at_its_own_widths(monkeypatch):
    from tq_trtllm.eval import kernel_speed

    def fake_row(timer, case):
        # a made-up time per width pair; SDPA the same for every layer
        k, v = case.k, case.v
        return kernel_speed.Row("decode", 1, 4096, 1, 9, 3, 64, k, v, tq_us=10 * k + v,
                                sdpa_us=50.0, speedup=0.0, packed_mb=0.0, tq_read_tbps=0.0,
                                fused_us=10 * k + v + 1)

    launched = []  # the back-to-back regions' calls, in launch order

    class FakeCase:  # a layer's decode inputs: its calls record themselves
        def __init__(self, k, v):
            self.k, self.v = k, v

        def call(self, append=False):
            return lambda: launched.append(("fused" if append else "attention", self.k, self.v))

    class FakeTimer:  # "times" a step as the number of calls it launched
        def graph_us(self, calls):
            before = len(launched)
            for call in calls:
                call()
            return float(len(launched) - before)

    monkeypatch.setattr(kernel_speed, "case_row", fake_row)
    made = []  # every case prepared (each fills a cache): one per layer, none more for the rows
    monkeypatch.setattr(kernel_speed, "decode_case",
                        lambda b, c, hq, hkv, d, k, v, q_len, rp: made.append((k, v)) or FakeCase(k, v))
    monkeypatch.setattr(kernel_speed, "sdpa_decode_call", lambda *shape: lambda: launched.append(("sdpa",)))
    widths = [(3.0, 2.0), (5.0, 4.0), (3.0, 2.0), (2.0, 2.0)]
    rows, step = kernel_speed.engine_step(FakeTimer(), 1, 4096, 9, 3, 64, widths, 16)
    assert sorted((n, r.k_bits, r.v_bits) for n, r in rows) == [(1, 2.0, 2.0), (1, 5.0, 4.0), (2, 3.0, 2.0)]
    assert step.layers == 4 and made == widths
    assert step.tq_us == 2 * 32 + 54 + 22
    assert step.fused_us == step.tq_us + 4
    assert step.sdpa_us == 4 * 50.0 and step.speedup == 200.0 / 140.0
    # back to back: every layer once, in layer order, at its own widths, one graph per kind of call
    assert launched == ([("attention", k, v) for k, v in widths] +
                        [("fused", k, v) for k, v in widths] + [("sdpa",)] * 4)
    assert step.tq_graph_us == step.fused_graph_us == step.sdpa_graph_us == 4.0 and step.graph_speedup == 1.0


def test_engine_bench_refuses_a_folder_without_an_engine(tmp_path):
    from click.testing import CliRunner

    from tq_trtllm.cli.bench import main

    result = CliRunner().invoke(main, ["engine", "--engine", str(tmp_path)])
    assert result.exit_code != 0 and "is not an engine directory" in result.output
