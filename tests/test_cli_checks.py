"""Checks before work: every argument that can be refused without a model is refused before one
loads, with a one-line error and a non-zero status (no traceback). Each test here would load a
model if its check were missing; the `no_model` fixture makes that load fail the test instead."""

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from tq_trtllm.calibration.table import oblivious_table
from tq_trtllm.cli.build import main as build
from tq_trtllm.cli.eval import main as tq_eval
from tq_trtllm.cli.run import main as run
from tq_trtllm.engine import MANIFEST, TABLES, write_engine

FINGERPRINT = {"family": "llama", "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 64,
               "config_hash": "0000"}


class ModelLoaded(Exception):
    pass


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    """Any model load fails the test: the checks must come first."""
    def refuse(*args, **kwargs):
        raise ModelLoaded("a model was loaded before the arguments were checked")

    import tq_trtllm.engine
    import tq_trtllm.models.checkpoint

    monkeypatch.setattr(tq_trtllm.models.checkpoint, "load_model", refuse)
    monkeypatch.setattr(tq_trtllm.engine, "load_model", refuse)


def invoke(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args])


def assert_clean_error(result, *fragments):
    """A non-zero status, one line naming the problem, no traceback, no model loaded."""
    assert not isinstance(result.exception, ModelLoaded), "a model loaded before the check"
    assert result.exit_code in (1, 2), result.output
    assert type(result.exception) is SystemExit and "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 or result.exit_code == 2, result.output  # usage errors add a usage line
    for fragment in fragments:
        assert fragment in result.output, result.output


@pytest.fixture
def calib_text(tmp_path):
    path = tmp_path / "calib.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 50)
    return path


@pytest.fixture
def gguf(tmp_path):
    """A file that passes the GGUF magic check (nothing past it is read before the load)."""
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00")
    return path


def build_args(calib_text, gguf, *args):
    return ("--checkpoint", gguf, "--calib-text", calib_text, *args)


def test_the_checks_pass_and_the_model_load_comes_next(tmp_path, calib_text, gguf):
    # the control: with good arguments the command goes on to load the model (here refused)
    result = invoke(build, *build_args(calib_text, gguf, "--output", tmp_path / "e"))
    assert isinstance(result.exception, ModelLoaded)


def test_build_output_that_exists(tmp_path, calib_text, gguf):
    (tmp_path / "e").mkdir()
    assert_clean_error(invoke(build, *build_args(calib_text, gguf, "--output", tmp_path / "e")),
                       "already exists")


def test_build_output_under_a_file(tmp_path, calib_text, gguf):
    (tmp_path / "file").write_text("x")
    for output in (tmp_path / "file" / "e", tmp_path / "file" / "sub" / "e"):
        assert_clean_error(invoke(build, *build_args(calib_text, gguf, "--output", output)),
                           "is a file, not a directory")


def _unwritable_dir(tmp_path) -> Path:
    """A directory this process cannot create entries in: mode 0555, or for root (whom modes do
    not stop) /sys, which refuses new entries to everyone."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    for candidate in (ro, Path("/sys")):
        try:
            os.rmdir(tempfile.mkdtemp(dir=candidate))
        except OSError:
            return candidate
    pytest.skip("no directory here refuses writes to this user")


def test_build_output_in_a_directory_it_cannot_write(tmp_path, calib_text, gguf):
    parent = _unwritable_dir(tmp_path)
    try:
        assert_clean_error(invoke(build, *build_args(calib_text, gguf, "--output", parent / "e")),
                           f"cannot write in {parent}")
    finally:
        (tmp_path / "ro").chmod(0o755)


def test_build_output_whose_parents_are_missing_is_fine(tmp_path, calib_text, gguf):
    # tq-build creates missing parents: this passes the checks and goes on to the model
    result = invoke(build, *build_args(calib_text, gguf, "--output", tmp_path / "a" / "b" / "e"))
    assert isinstance(result.exception, ModelLoaded)
    assert not (tmp_path / "a").exists()  # the check creates nothing


@pytest.mark.parametrize("make, fragment", [
    (lambda d: d / "missing.gguf", "does not exist"),
    (lambda d: (d / "weights.bin").write_bytes(b"x") and d / "weights.bin", "not a .gguf file"),
    (lambda d: (d / "fake.gguf").write_bytes(b"PK\x03\x04") and d / "fake.gguf", "not a valid GGUF file"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "has no config.json"),
])
def test_build_checkpoint_that_cannot_be_a_model(tmp_path, calib_text, make, fragment):
    result = invoke(build, "--checkpoint", make(tmp_path), "--calib-text", calib_text,
                    "--output", tmp_path / "e")
    assert_clean_error(result, fragment)


@pytest.mark.parametrize("args, fragment", [
    (("--calib-text", "/nonexistent/text.txt"), "does not exist"),
    (("--key-scale-lengths", "16"), "at least 64 tokens"),
    (("--kv-bits", "6"), "--kv-bits 6 is not a width"),
])
def test_build_other_arguments(tmp_path, gguf, args, fragment):
    assert_clean_error(invoke(build, "--checkpoint", gguf, "--output", tmp_path / "e", *args), fragment)


@pytest.fixture
def engine(tmp_path, gguf):
    """A valid engine directory made without a model: a plain TurboQuant table for a made-up
    two-layer model whose checkpoint is `gguf`."""
    out = tmp_path / "engine"
    write_engine(out, "llama", str(gguf), "hf", oblivious_table(FINGERPRINT, 3.0, 3.0))
    return out


def engine_commands(engine):
    return [(run, "--engine", engine, "--prompt", "hello"),
            (tq_eval, "ppl", "--engine", engine, "--corpus", Path(__file__)),
            (tq_eval, "needle", "--engine", engine, "--lengths", "64")]


def test_a_valid_engine_passes_the_checks(engine):
    for command, *args in engine_commands(engine):
        assert isinstance(invoke(command, *args).exception, ModelLoaded), args


def test_engine_directory_missing_or_a_file(tmp_path, engine):
    (tmp_path / "file").write_text("x")
    for path, fragment in ((tmp_path / "none", "does not exist"), (tmp_path / "file", "is a file")):
        for command, *args in engine_commands(path):
            assert_clean_error(invoke(command, *args), fragment)


def test_engine_manifest_missing_or_damaged(engine):
    manifest = engine / MANIFEST
    good = manifest.read_text()
    for text, fragment in (("{not json", "not valid JSON"),
                           (json.dumps({**json.loads(good), "engine_version": 99}), "engine version 99")):
        manifest.write_text(text)
        for command, *args in engine_commands(engine):
            assert_clean_error(invoke(command, *args), fragment)
    manifest.unlink()
    for command, *args in engine_commands(engine):
        assert_clean_error(invoke(command, *args), "manifest.json is missing")


def test_engine_tables_missing_or_damaged(engine):
    tables = engine / TABLES
    data = tables.read_bytes()
    tables.write_bytes(data[: len(data) // 2])
    for command, *args in engine_commands(engine):
        assert_clean_error(invoke(command, *args), "is corrupt or not a safetensors file")
    tables.unlink()
    for command, *args in engine_commands(engine):
        assert_clean_error(invoke(command, *args), "does not exist")


def test_engine_whose_checkpoint_is_gone(engine, gguf):
    gguf.unlink()
    for command, *args in engine_commands(engine):
        assert_clean_error(invoke(command, *args), "which no longer exists")


def test_eval_corpus_and_filler_checked_before_the_model(engine):
    assert_clean_error(invoke(tq_eval, "ppl", "--engine", engine, "--corpus", "/nonexistent.txt"),
                       "does not exist")
    assert_clean_error(invoke(tq_eval, "needle", "--engine", engine, "--lengths", "64", "--filler",
                              "/nonexistent.txt"), "does not exist")


def test_second_engine_checked_before_the_model(engine, tmp_path):
    other = tmp_path / "other"
    assert_clean_error(invoke(tq_eval, "ppl", "--engine", engine, "--engine", other, "--corpus",
                              Path(__file__)), "does not exist")


@pytest.mark.parametrize("mask, dir_mode, file_mode", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_engine_directories_follow_the_umask(tmp_path, mask, dir_mode, file_mode):
    """Readable by others as the umask allows (a server may run as another user), never the
    private 0700 of a temporary directory."""
    before = os.umask(mask)
    try:
        out = tmp_path / "e"
        write_engine(out, "llama", None, "hf", oblivious_table(FINGERPRINT, 3.0, 3.0))
    finally:
        os.umask(before)
    assert stat.S_IMODE(out.stat().st_mode) == dir_mode
    for f in out.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == file_mode, f
