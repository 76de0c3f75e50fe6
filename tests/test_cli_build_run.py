"""tq-build, tq-run and tq-eval ppl/needle on a tiny checkpoint; bad input gives a clear error."""

import json
import math
import re
import shutil

import pytest
from click.testing import CliRunner

from hf_fixtures import save_tiny_checkpoint, tiny_text
from tq_trtllm.calibration.calibrate import CalibrationOptions
from tq_trtllm.calibration.tables_io import load_table
from tq_trtllm.cli.build import main as build
from tq_trtllm.cli.eval import main as tq_eval
from tq_trtllm.cli.run import main as run
from tq_trtllm.engine import TABLES

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "calib.txt"
    path.write_text(tiny_text(3000))
    return path


@pytest.fixture(scope="module")
def engine(tmp_path_factory, checkpoint, calib_file):
    out = tmp_path_factory.mktemp("engines") / "tiny-kv3"
    result = invoke(build, "--checkpoint", checkpoint, "--calib-text", calib_file, "--kv-bits", "3",
                    "--output", out, "--calib-windows", "2", "--json")
    assert result.exit_code == 0, result.output
    return out


def invoke(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args])


def assert_clean_error(result, *fragments):
    """Exit code 1 or 2 (click usage), a message naming the problem, and no traceback."""
    assert result.exit_code in (1, 2), result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, AssertionError)
    assert type(result.exception) is SystemExit
    for fragment in fragments:
        assert fragment in result.output, result.output


def test_build_writes_manifest_and_tables(engine):
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["model"] == "llama" and manifest["backend"] == "hf"
    assert manifest["kv_bits"] == "3" and (engine / manifest["tables"]).is_file()
    assert manifest["average_widths"]["all"] <= 3.0
    assert manifest["effective_bits"]["bits"] <= 3.3
    assert not [p for p in engine.parent.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_build_value_scale_flag(tmp_path, checkpoint, calib_file):
    result = invoke(build, "--checkpoint", checkpoint, "--calib-text", calib_file, "--kv-bits", "k3v2.5",
                    "--value-scale", "--output", tmp_path / "e", "--calib-windows", "1", "--json")
    assert result.exit_code == 0, result.output
    table = load_table(tmp_path / "e" / json.loads(result.output)["tables"])
    assert table.calibration["value_scale"] is True
    assert all(layer.value_scale.shape == (2, 64) for layer in table.layers)


def test_build_retrieval_windows_flag(tmp_path, checkpoint, calib_file):
    result = invoke(build, "--checkpoint", checkpoint, "--calib-text", calib_file, "--kv-bits", "3",
                    "--retrieval-windows", "1", "--output", tmp_path / "e", "--calib-windows", "2",
                    "--json")
    assert result.exit_code == 0, result.output
    table = load_table(tmp_path / "e" / json.loads(result.output)["tables"])
    assert table.calibration["retrieval_windows"] == 1


def test_build_key_scale_lengths_flag(tmp_path, checkpoint, calib_file):
    scales = {}
    for choice, recorded in (("context", []), ("64,128", [64, 128])):
        out = tmp_path / choice.replace(",", "-")
        result = invoke(build, "--checkpoint", checkpoint, "--calib-text", calib_file, "--kv-bits", "4",
                        "--uniform", "--key-scale-lengths", choice, "--output", out,
                        "--calib-windows", "1", "--json")
        assert result.exit_code == 0, result.output
        table = load_table(out / json.loads(result.output)["tables"])
        assert table.calibration["key_scale_lengths"] == recorded
        scales[choice] = table.layers[0].key_scale
    assert not scales["context"].allclose(scales["64,128"])


def test_run_prints_text_and_kv_bytes(engine):
    result = invoke(run, "--engine", engine, "--prompt", "the time of the new", "--max-new-tokens", "5",
                    "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["new_tokens"] == 5 and out["kv_bytes"] > 0
    # the pages, the exact sink and the recent window's kept rows, as the table counts them (the
    # window's fp16 rows dominate so short a sequence; at long context the pages do)
    table = load_table(engine / TABLES)
    assert table.recent_tokens == CalibrationOptions.recent_tokens and out["kv_bytes"] == table.cache_bytes(out["cached_tokens"])
    fp16_per_token = out["kv_bytes_fp16"] / out["cached_tokens"]
    assert table.cache_bytes(4096) * 3 < 4096 * fp16_per_token  # over 3x smaller at 4,096 tokens
    # the rows kept in fp16 beside the pages (1 sink, then the recent window's 15), and the ratio
    # that each further token of a long sequence costs
    rows = out["fp16_rows"]
    assert (rows["sink"], rows["recent"]) == (1, min(out["cached_tokens"] - 1, 15))
    assert rows["bytes"] == (rows["sink"] + rows["recent"]) * fp16_per_token <= out["kv_bytes"]
    long = 1_000_000
    assert out["steady_state_ratio"] == pytest.approx(long * fp16_per_token / table.cache_bytes(long), rel=1e-3)
    from tq_trtllm import kernels

    assert out["backend"] == ("kernels" if kernels.available() else "reference")
    if not kernels.available():
        assert_clean_error(invoke(run, "--engine", engine, "--prompt", "the", "--device", "cuda"),
                           "--device cuda cannot run here")
    text = invoke(run, "--engine", engine, "--prompt", "the new", "--max-new-tokens", "2")
    assert text.exit_code == 0 and "KV cache:" in text.output and "FP16" in text.output
    assert re.search(r"\d+ sink and \d+ recent tokens stay in FP16", text.output), text.output
    assert f"{out['steady_state_ratio']:.2f}x smaller than in FP16 (the steady-state" in text.output


def test_ppl_and_needle_commands(engine, calib_file):
    result = invoke(tq_eval, "ppl", "--engine", engine, "--corpus", calib_file, "--window", "64",
                    "--max-tokens", "256", "--baseline", "fp8", "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [r["method"] for r in rows] == ["tiny-kv3", "fp8"]
    for key in ("ppl_fp16", "ppl_kv", "delta_pct", "top1_agreement", "delta_ci95_pct", "command", "gpu",
                "driver", "date", "revision"):
        assert key in rows[0]
    # the per-window changes (nats) are what the delta is the mean of
    deltas = rows[0]["window_delta_nats"]
    assert len(deltas) == rows[0]["windows"]
    assert 100 * (math.exp(sum(deltas) / len(deltas)) - 1) == pytest.approx(rows[0]["delta_pct"])
    needle = invoke(tq_eval, "needle", "--engine", engine, "--lengths", "64,128", "--json")
    assert needle.exit_code == 0, needle.output
    report = json.loads(needle.stdout)
    assert set(report) >= {"accuracy", "changes", "equal", "answers", "command", "revision"}
    assert report["seeds"] == [0]
    # one row per prompt, every cache's answer in it; the accuracies and the paired changes are
    # counted from those answers
    assert len(report["answers"]) == 2 * len(report["depths"])
    for name in ("fp16", engine.name):
        for length in (64, 128):
            rows = [a for a in report["answers"] if a["length"] == length]
            assert all(isinstance(a["answers"][name], str) for a in rows)
            assert report["accuracy"][name][str(length)] == sum(a["key"] in a["answers"][name] for a in rows) / len(rows)
    for length in (64, 128, None):  # None: over both lengths ("all")
        rows = [a for a in report["answers"] if length in (None, a["length"])]
        hits = [(a["key"] in a["answers"]["fp16"], a["key"] in a["answers"][engine.name]) for a in rows]
        got = report["changes"][engine.name][str(length or "all")]
        assert (got["lost"], got["won"]) == (sum(f and not q for f, q in hits), sum(q and not f for f, q in hits))
        assert 0.0 < got["p"] <= 1.0
    # running text as filler: each prompt its own stretch of it, the same keys as before
    varied = invoke(tq_eval, "needle", "--engine", engine, "--lengths", "64,128", "--filler",
                    calib_file, "--json")
    assert varied.exit_code == 0, varied.output
    varied = json.loads(varied.stdout)
    assert varied["filler"] == str(calib_file) and report["filler"] == "repeated passage"
    assert [a["key"] for a in varied["answers"]] == [a["key"] for a in report["answers"]]
    starts = [a["filler_start"] for a in varied["answers"]]
    assert len(set(starts)) == len(starts)
    short = calib_file.parent / "short.txt"
    short.write_text("the sky is blue")
    assert_clean_error(invoke(tq_eval, "needle", "--engine", engine, "--lengths", "64", "--filler",
                              short), "64-token prompts need at least as many")
    from tq_trtllm import kernels

    if not kernels.available():  # --device cuda where the kernels cannot run: a clear error
        for command in (["ppl", "--corpus", calib_file, "--window", "64", "--max-tokens", "256"],
                        ["needle", "--lengths", "64"]):
            assert_clean_error(invoke(tq_eval, *command, "--engine", engine, "--device", "cuda"),
                               "--device cuda cannot run here")


def test_needle_compares_several_engines_over_several_seeds(engine, checkpoint, calib_file, tmp_path):
    other = tmp_path / "tiny-kv4"
    built = invoke(build, "--checkpoint", checkpoint, "--calib-text", calib_file, "--kv-bits", "4",
                   "--output", other, "--calib-windows", "2")
    assert built.exit_code == 0, built.output
    both = invoke(tq_eval, "needle", "--engine", engine, "--engine", other, "--lengths", "64",
                  "--seeds", "0-2", "--baseline", "fp8", "--graded", "--json")
    assert both.exit_code == 0, both.output
    both = json.loads(both.stdout)
    # --graded: every prompt scored under every cache, a reference cache's too; the summary is
    # their mean change
    for name in (engine.name, other.name, "fp8"):
        diffs = [r["key_log_prob"][name] - r["key_log_prob"]["fp16"] for r in both["answers"]]
        assert both["graded"][name]["64"]["mean"] == pytest.approx(sum(diffs) / len(diffs))
    assert both["seeds"] == [0, 1, 2] and both["prompts_per_length"] == 3 * len(both["depths"])
    caches = {"fp16", engine.name, other.name, "fp8"}
    assert set(both["accuracy"]) == caches and set(both["changes"]) == caches - {"fp16"}
    rows = both["answers"]
    assert [r["seed"] for r in rows] == [s for s in (0, 1, 2) for _ in both["depths"]]
    assert all(set(r["answers"]) == caches for r in rows)
    # seed s of a range asks what --seed s alone asks
    alone = json.loads(invoke(tq_eval, "needle", "--engine", engine, "--lengths", "64", "--seed",
                              "2", "--json").stdout)
    assert [(r["key"], r["answers"][engine.name]) for r in alone["answers"]] == \
        [(r["key"], r["answers"][engine.name]) for r in rows if r["seed"] == 2]
    assert_clean_error(invoke(tq_eval, "needle", "--engine", engine, "--seeds", "0-x"),
                       "is not a seed, a range")
    # --depths: only those prompts, each the one the default depths ask at that depth
    far = json.loads(invoke(tq_eval, "needle", "--engine", engine, "--lengths", "64", "--seeds",
                            "0-2", "--depths", "0.1", "--json").stdout)
    assert far["depths"] == [0.1] and far["prompts_per_length"] == 3
    assert [(r["seed"], r["key"], r["answers"][engine.name]) for r in far["answers"]] == \
        [(r["seed"], r["key"], r["answers"][engine.name]) for r in rows if r["depth"] == 0.1]
    assert_clean_error(invoke(tq_eval, "needle", "--engine", engine, "--depths", "0.5,1.5"),
                       "give depths between 0")
    named_fp16 = tmp_path / "fp16"
    shutil.copytree(engine, named_fp16)
    assert_clean_error(invoke(tq_eval, "needle", "--engine", named_fp16, "--lengths", "64"),
                       "named 'fp16'")
    named_fp8 = tmp_path / "fp8"
    shutil.copytree(engine, named_fp8)
    assert_clean_error(invoke(tq_eval, "needle", "--engine", named_fp8, "--baseline", "fp8"), "named 'fp8'")


def test_needle_rows_file_resumes_a_run_and_pools_runs(engine, calib_file, tmp_path):
    def needle(rows_file, seeds):
        rows = ("--rows", rows_file) if rows_file else ()
        result = invoke(tq_eval, "needle", "--engine", engine, "--lengths", "64", "--seeds", seeds,
                        "--filler", calib_file, "--graded", "--json", *rows)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def lines(path):
        return [json.loads(line) for line in path.read_text().splitlines()]

    fresh = needle(None, "0-2")
    rows_file = tmp_path / "rows.jsonl"
    first = needle(rows_file, "0-1")
    assert [[r["seed"] for r in line["rows"]] for line in lines(rows_file)] == [[0] * 3, [1] * 3]
    assert lines(rows_file)[0]["run"]["backend"] == "reference"  # CPU rows never pool with GPU ones
    assert first["answers"] == fresh["answers"][:6]
    # a prompt in the file is taken from it, not run again: a doctored answer comes back
    doctored = lines(rows_file)
    doctored[0]["rows"][0]["answers"][engine.name] = "doctored"
    rows_file.write_text("".join(json.dumps(line) + "\n" for line in doctored))
    # a last line cut short (the run was stopped while writing it) is dropped, then the run goes on
    with open(rows_file, "a") as f:
        f.write('{"run": {"caches"')
    resumed = needle(rows_file, "0-2")
    assert resumed["answers"][0]["answers"][engine.name] == "doctored"
    assert resumed["answers"][1:] == fresh["answers"][1:]
    assert [line["rows"][0]["seed"] for line in lines(rows_file)] == [0, 1, 2]
    # the files of runs on other seeds, concatenated, give the one report; nothing runs again
    other = tmp_path / "other.jsonl"
    needle(other, "3")
    pooled = tmp_path / "pooled.jsonl"
    pooled.write_text(rows_file.read_text() + other.read_text())
    report = needle(pooled, "1-3")
    assert [r["seed"] for r in report["answers"]] == [s for s in (1, 2, 3) for _ in range(3)]
    assert report["answers"][:6] == fresh["answers"][3:] and len(lines(pooled)) == 4
    # rows of another run are refused, and so is a line that is not one of these files'
    refused = invoke(tq_eval, "needle", "--engine", engine, "--lengths", "64", "--seeds", "0",
                     "--filler", calib_file, "--rows", rows_file)
    assert_clean_error(refused, "holds prompts of another run", "graded")
    moved = lines(rows_file)
    moved[1]["rows"][0]["key"] = "12345"  # a prompt this run would not ask
    rows_file.write_text("".join(json.dumps(line) + "\n" for line in moved))
    assert_clean_error(invoke(tq_eval, "needle", "--engine", engine, "--lengths", "64", "--seeds", "1",
                              "--filler", calib_file, "--graded", "--rows", rows_file),
                       "seed 1, 64 tokens, depth 0.1 is not this run's")
    bad = tmp_path / "bad.jsonl"
    for text in ("not json\n", json.dumps({"run": {}, "rows": [{"seed": 0}]}) + "\n"):
        bad.write_text(text)
        assert_clean_error(invoke(tq_eval, "needle", "--engine", engine, "--lengths", "64", "--rows", bad),
                           "line 1, is not a line of tq-eval needle --rows")


def test_engines_with_one_directory_name_are_refused(engine, calib_file, tmp_path):
    twin = tmp_path / "copy" / engine.name
    shutil.copytree(engine, twin)
    result = invoke(tq_eval, "ppl", "--engine", engine, "--engine", twin, "--corpus", calib_file,
                    "--window", "64", "--max-tokens", "256")
    assert_clean_error(result, "share a directory name")


def test_too_long_prompt_is_refused(engine):
    result = invoke(run, "--engine", engine, "--prompt", "the " * 300)
    assert_clean_error(result, "exceeds the model's context of 256 tokens")
    result = invoke(tq_eval, "needle", "--engine", engine, "--lengths", "1024")
    assert_clean_error(result, "exceeds the model's limit of 256")


@pytest.mark.parametrize("args, fragments", [
    (("--model", "gpt2"), ("'gpt2' is not supported", "llama, mistral, qwen2")),
    # the widths tq-build takes, and those alone
    (("--kv-bits", "6"), ("--kv-bits 6 is not a width", "use 2, 2.5, 3, 3.5, 4, 4.5 or 5 bits")),
    (("--kv-bits", "k3v7"), ("--kv-bits k3v7 is not a width", "a K/V pair of them such as k4v3")),
    (("--kv-bits", "three"), ("--kv-bits three is not a width",)),
    (("--kv-bits", "1.5"), ("use 2, 2.5", "below 2 bits")),
    (("--backend", "trtllm"), ("needs TensorRT-LLM 1.2.x", "pypi.nvidia.com")),
    (("--checkpoint", "/nonexistent/model.gguf"), ("does not exist",)),
    (("--calib-text", "/nonexistent/text.txt"), ("does not exist",)),
    (("--key-scale-lengths", "1024,long"), ("not a comma-separated list of token counts",)),
    (("--key-scale-lengths", "16"), ("at least 64 tokens",)),
])
def test_build_bad_input(tmp_path, args, fragments):
    assert_clean_error(invoke(build, "--output", tmp_path / "e", *args), *fragments)
    assert not (tmp_path / "e").exists()


def test_corrupt_checkpoints_are_refused(tmp_path, calib_file):
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"this is not a gguf file")
    result = invoke(build, "--checkpoint", gguf, "--calib-text", calib_file, "--output", tmp_path / "e")
    assert_clean_error(result, "not a valid GGUF file")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 10)
    result = invoke(build, "--checkpoint", truncated, "--calib-text", calib_file, "--output", tmp_path / "e")
    assert_clean_error(result, "could not be")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    result = invoke(build, "--checkpoint", empty_dir, "--calib-text", calib_file, "--output", tmp_path / "e")
    assert_clean_error(result, "has no config.json")
    assert not (tmp_path / "e").exists()


def test_corrupt_safetensors_checkpoint_is_refused(tmp_path, checkpoint, calib_file):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    result = invoke(build, "--checkpoint", broken, "--calib-text", calib_file, "--output", tmp_path / "e")
    assert_clean_error(result, "could not be loaded")


def test_existing_output_is_never_overwritten(engine, checkpoint, calib_file):
    before = (engine / "manifest.json").read_text()
    result = invoke(build, "--checkpoint", checkpoint, "--calib-text", calib_file, "--output", engine)
    assert_clean_error(result, "already exists")
    assert (engine / "manifest.json").read_text() == before


def test_wrong_family_for_checkpoint(tmp_path, checkpoint, calib_file):
    result = invoke(build, "--model", "qwen2", "--checkpoint", checkpoint, "--calib-text", calib_file,
                    "--output", tmp_path / "e")
    assert_clean_error(result, "is a 'llama' model, not the 'qwen2' family")


def test_engine_with_mismatched_table_is_refused(tmp_path, engine):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(engine, other)
    manifest = json.loads((other / "manifest.json").read_text())
    from tq_trtllm.calibration.tables_io import load_table, save_table

    table = load_table(other / "tables.safetensors")
    table.fingerprint = {**table.fingerprint, "config_hash": "0000"}
    (other / "tables.safetensors").unlink()
    save_table(table, other / "tables.safetensors")
    assert_clean_error(invoke(run, "--engine", other, "--prompt", "the"), "config_hash")
    (other / "manifest.json").write_text("{not json")
    assert_clean_error(invoke(run, "--engine", other, "--prompt", "the"), "not valid JSON")
    assert manifest["engine_version"] == 1
    assert_clean_error(invoke(run, "--engine", tmp_path / "nothing", "--prompt", "the"), "does not exist")
    (tmp_path / "empty").mkdir()
    assert_clean_error(invoke(run, "--engine", tmp_path / "empty", "--prompt", "the"), "manifest.json")
