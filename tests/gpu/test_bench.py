"""tq-bench runs end to end on the GPU and its rows carry every time they name (no speed asserted:
the figures live in docs/BENCHMARKS.md)."""

import json

import pytest
from click.testing import CliRunner

from tq_trtllm.cli.bench import main


def bench_rows(*args):
    result = CliRunner().invoke(main, [*args, "--iters", "2", "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("args,bench,q_len", [
    (["decode", "--shape", "smollm2", "--sizes", "2x300", "--bits", "3,k4v2"], "decode", 1),
    (["prefill", "--shape", "smollm2", "--history", "300", "--chunk", "70", "--bits", "2.5"], "prefill", 70),
])
def test_rows_time_the_attention_the_baseline_and_the_append(args, bench, q_len):
    rows = bench_rows(*args)
    assert rows and all(r["bench"] == bench and r["q_len"] == q_len for r in rows)
    for r in rows:
        for field in ("tq_us", "sdpa_us", "append_us"):
            assert r[field] > 0, (field, r)
        assert r["speedup"] == pytest.approx(r["sdpa_us"] / r["tq_us"])
        assert r["append_pct"] == pytest.approx(100 * r["append_us"] / r["tq_us"])
        # the fused call exists for decode steps only
        assert (r["fused_us"] is not None) == (bench == "decode")
