"""Engine directories and table files on disk: the manifest's version checks refuse what this
package cannot read, naming it, through the API and the command line; a write that fails leaves
the old output as it was and no temporary file or directory behind."""

import errno
import json
import os

import pytest
from click.testing import CliRunner

from hf_fixtures import save_tiny_checkpoint, tiny_config
from tq_trtllm.calibration.table import oblivious_table
from tq_trtllm.calibration.tables_io import load_table, save_table
from tq_trtllm.cli.run import main as run
from tq_trtllm.core.errors import TQError
from tq_trtllm.core.spec import FORMAT_VERSION, READABLE_FORMAT_VERSIONS
from tq_trtllm.engine import ENGINE_VERSION, MANIFEST, TABLES, read_manifest, write_engine
from tq_trtllm.models.fingerprint import fingerprint

pytest.importorskip("transformers")


def table(bits=3):
    return oblivious_table(fingerprint("llama", tiny_config()), bits, bits)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


def with_manifest(engine, **fields):
    """The engine's manifest with `fields` set (None: the field removed)."""
    manifest = json.loads((engine / MANIFEST).read_text())
    for name, value in fields.items():
        if value is None:
            manifest.pop(name)
        else:
            manifest[name] = value
    (engine / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("fields, message", [
    ({"engine_version": ENGINE_VERSION + 1},
     f"engine version {ENGINE_VERSION + 1} is not readable; this tq_trtllm reads version {ENGINE_VERSION}"),
    ({"engine_version": None}, "engine version None is not readable"),
    ({"format_version": FORMAT_VERSION + 1},
     f"packed cache format version {FORMAT_VERSION + 1} is not readable by this tq_trtllm, which reads "
     f"versions {', '.join(map(str, READABLE_FORMAT_VERSIONS))}"),
    ({"format_version": min(READABLE_FORMAT_VERSIONS) - 1},
     f"format version {min(READABLE_FORMAT_VERSIONS) - 1} is not readable"),
    ({"format_version": None}, "format version None is not readable"),
])
def test_a_manifest_of_another_version_is_refused(tmp_path, checkpoint, fields, message):
    """Through read_manifest (TQError) and tq-run (a one-line error, no traceback)."""
    engine = tmp_path / "e"
    write_engine(engine, "llama", str(checkpoint), "hf", table())
    assert read_manifest(engine)["format_version"] == FORMAT_VERSION
    with_manifest(engine, **fields)
    with pytest.raises(TQError, match=message):
        read_manifest(engine)
    result = CliRunner().invoke(run, ["--engine", str(engine), "--prompt", "the"])
    assert result.exit_code == 1 and type(result.exception) is SystemExit, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("version", READABLE_FORMAT_VERSIONS)
def test_manifests_of_every_readable_format_version_are_read(tmp_path, version):
    engine = tmp_path / "e"
    write_engine(engine, "llama", None, "hf", table())
    with_manifest(engine, format_version=version)
    assert read_manifest(engine)["format_version"] == version


def disk_full_after(written: int):
    """A safetensors save_file that writes `written` bytes of its file, then fails as a full disk
    does."""
    def save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * written)
        raise OSError(errno.ENOSPC, "No space left on device", filename)
    return save_file


def test_a_table_write_that_fails_keeps_the_old_table_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / TABLES
    save_table(table(3), path)
    before = path.read_bytes()
    monkeypatch.setattr("safetensors.torch.save_file", disk_full_after(100))
    with pytest.raises(OSError, match="No space left"):
        save_table(table(4), path)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == [TABLES]
    assert path.read_bytes() == before and load_table(path).kv_bits == "k3v3"
    # the rename itself failing: the same
    monkeypatch.setattr("tq_trtllm.calibration.tables_io.os.replace",
                        lambda *a: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross-device link")))
    with pytest.raises(OSError, match="cross-device"):
        save_table(table(4), path)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == [TABLES] and path.read_bytes() == before
    save_table(table(4), path)  # and a write that succeeds replaces it
    assert load_table(path).kv_bits == "k4v4" and sorted(os.listdir(tmp_path)) == [TABLES]


@pytest.mark.parametrize("failing", ["tables", "rename"])
def test_an_engine_write_that_fails_leaves_nothing(tmp_path, monkeypatch, failing):
    """No engine directory and no temporary sibling; an existing engine is never overwritten."""
    if failing == "tables":
        monkeypatch.setattr("safetensors.torch.save_file", disk_full_after(100))
    else:
        monkeypatch.setattr("tq_trtllm.engine.os.rename",
                            lambda *a: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross-device link")))
    with pytest.raises(OSError):
        write_engine(tmp_path / "e", "llama", None, "hf", table())
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
    write_engine(tmp_path / "e", "llama", None, "hf", table())
    before = {p.name: p.read_bytes() for p in (tmp_path / "e").iterdir()}
    with pytest.raises(TQError, match="already exists"):
        write_engine(tmp_path / "e", "llama", None, "hf", table(4))
    assert {p.name: p.read_bytes() for p in (tmp_path / "e").iterdir()} == before
    assert os.listdir(tmp_path) == ["e"]
