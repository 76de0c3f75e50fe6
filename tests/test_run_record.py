"""run_metadata: the command, GPU, driver, date and revision each JSON row of tq-bench / tq-eval carries."""

import json
import re
import subprocess
import sys
import types
from dataclasses import dataclass, asdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import torch

from tq_trtllm.eval import run_record
from tq_trtllm.eval.run_record import run_metadata

REPO = Path(__file__).resolve().parents[1]
KEYS = {"command", "gpu", "driver", "date", "revision", "dirty", "torch", "tq_trtllm"}


def _git(*args):
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_fields_describe_this_run():
    meta = run_metadata(["/opt/venv/bin/tq-bench", "decode", "--json"])
    assert set(meta) == KEYS
    json.dumps(meta)  # a row must stay serialisable
    assert meta["command"] == "tq-bench decode --json"
    assert meta["torch"] == torch.__version__
    if not torch.cuda.is_available():
        assert meta["gpu"] is None and meta["driver"] is None
    else:
        assert meta["gpu"] == torch.cuda.get_device_name()
    taken = datetime.strptime(meta["date"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert abs(datetime.now(timezone.utc) - taken) < timedelta(minutes=1)


def test_revision_and_dirty_flag_match_git():
    meta = run_metadata([])
    assert meta["revision"] == _git("rev-parse", "--short=12", "HEAD")
    assert meta["dirty"] == bool(_git("status", "--porcelain", "--untracked-files=no"))


def test_no_revision_outside_a_checkout(monkeypatch, tmp_path):
    # An installed copy must not report the revision of whatever repository happens to contain it.
    monkeypatch.setattr(run_record, "_PACKAGE_DIR", tmp_path / "tq_trtllm")
    meta = run_metadata([])
    assert meta["revision"] is None and meta["dirty"] is None


def test_command_quotes_arguments_and_names_a_module_run(monkeypatch):
    meta = run_metadata(["tq-bench", "decode", "--sizes", "1x4096, 8x32768"])
    assert meta["command"] == "tq-bench decode --sizes '1x4096, 8x32768'"
    fake_main = types.ModuleType("__main__")
    fake_main.__spec__ = types.SimpleNamespace(name="tq_trtllm.cli.bench")
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    meta = run_metadata(["/work/tq_trtllm/cli/bench.py", "prefill", "--json"])
    assert meta["command"] == "python3 -m tq_trtllm.cli.bench prefill --json"


def test_driver_read_from_nvidia_smi(monkeypatch):
    def fake_run(cmd, **kw):
        assert cmd[0] == "nvidia-smi"
        return subprocess.CompletedProcess(cmd, 0, stdout="570.124.06\n570.124.06\n", stderr="")

    monkeypatch.setattr(run_record.subprocess, "run", fake_run)
    assert run_record._driver_version() == "570.124.06"


def test_bench_json_rows_carry_the_metadata(monkeypatch, capsys):
    from tq_trtllm.cli import bench

    @dataclass
    class Row:
        bench: str
        tq_us: float

        def as_dict(self):
            return asdict(self)

    monkeypatch.setattr(sys, "argv", ["tq-bench", "decode", "--json"])
    bench._echo_rows([Row("decode", 12.5), Row("decode", 40.0)], True)
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["tq_us"] for r in rows] == [12.5, 40.0]
    assert all(set(r) >= KEYS and r["command"] == "tq-bench decode --json" for r in rows)


RESULTS = REPO / "docs" / "results" / "benchmarks.jsonl"
DAY = r"20\d\d-\d\d-\d\d"


def test_benchmark_records_carry_their_run():
    # Every row names where and how it was measured; hand-transcribed rows say so.
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    assert rows
    for r in rows:
        assert {"command", "gpu", "driver", "date", "revision"} <= set(r), r
        assert re.match(DAY, r["date"]), r["date"]
        assert "figures" in r or "tq_us" in r or "tokens_per_s" in r, r
        assert "source" not in r or r["source"].startswith("transcribed from docs/BENCHMARKS.md"), r


def test_every_revision_and_date_the_benchmarks_doc_cites_has_a_row():
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    have = {(r["revision"][:7], r["date"][:10]) for r in rows}
    doc = (REPO / "docs" / "BENCHMARKS.md").read_text()
    cited = set(re.findall(r"`([0-9a-f]{7})`[^`]{0,14}?(" + DAY + ")", doc.replace("\n", " ")))
    cited |= {(rev, day) for day, rev in re.findall(r"\| (" + DAY + r") \| `([0-9a-f]{7})`", doc)}
    assert cited, "the doc cites no run"
    assert cited <= have, f"cited without a row in {RESULTS.name}: {sorted(cited - have)}"
