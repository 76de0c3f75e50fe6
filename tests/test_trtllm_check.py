"""tq-eval trtllm-check's comparison (tq_trtllm/trtllm/check.py) on CPU, with engine runs stood in
by the reference runtime itself: a correct fp16 run passes every bound, a run whose cache does not
quantize, and one over another rank's heads' tables, fail. This checks that the acceptance check
can fail; the check's engine side needs TensorRT-LLM 1.2 on Hopper (docs/TRTLLM.md)."""

import copy

import pytest
import torch

from tq_trtllm.trtllm import check

SMALL = dict(check.MODEL, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             intermediate_size=512, vocab_size=256, initializer_range=0.06)
PROMPT, STEPS = 24, 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    loaded = check.random_model(tmp_path_factory.mktemp("hf"), SMALL)
    table = check.check_table(loaded)
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(2, SMALL["vocab_size"], (PROMPT,), generator=gen).tolist()
    tokens = torch.randint(2, SMALL["vocab_size"], (STEPS + 1,), generator=gen).tolist()
    return loaded, table, prompt, tokens


def stand_in_run(loaded, table, prompt, tokens, quantized=True):
    """What a correct engine returns, up to its arithmetic: the reference run in fp16."""
    half = copy.deepcopy(loaded)
    half.model = half.model.half()
    logits = check.reference_logits(half, table, prompt, tokens, quantized, device="cpu")
    return {"tokens": tokens, "logits": logits.float()}


def lines(capsys, setup, run, table=None):
    loaded, full_table, prompt, tokens = setup
    report = check.Report()
    check.compare(report, loaded, full_table, prompt, run, 1, device="cpu", steps=STEPS)
    return report.failed, capsys.readouterr().out.strip().splitlines()


def test_a_correct_fp16_run_passes(capsys, setup):
    failed, out = lines(capsys, setup, stand_in_run(*setup))
    assert failed == 0 and len(out) == 3 and all(line.startswith("PASS") for line in out), out


def test_a_run_without_quantization_fails(capsys, setup):
    failed, out = lines(capsys, setup, stand_in_run(*setup, quantized=False))
    assert any(line.startswith("FAIL") and "quantized cache in use" in line for line in out), out


def test_a_run_over_other_heads_tables_fails(capsys, setup):
    loaded, table, prompt, tokens = setup
    swapped = copy.deepcopy(table)
    for layer in swapped.layers:  # rank 1's key tables on rank 0's heads and the other way round
        layer.key_mean, layer.key_scale = layer.key_mean.flip(0), layer.key_scale.flip(0)
    failed, out = lines(capsys, setup, stand_in_run(loaded, swapped, prompt, tokens))
    assert any(line.startswith("FAIL") and "decode logits" in line for line in out), out


def test_a_short_run_is_a_failure_not_an_error(capsys, setup):
    run = stand_in_run(*setup)
    run["tokens"] = run["tokens"][:-1]
    failed, out = lines(capsys, setup, run)
    assert failed == 1 and "expected 9" in out[0]
