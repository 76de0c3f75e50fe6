"""docs/results/quality.jsonl: every quality run docs/QUALITY.md cites is a row that says where and
how it was measured (docs/QUALITY.md#run-records)."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "quality.jsonl"
DAY = r"20\d\d-\d\d-\d\d"


def rows():
    return [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]


def test_every_row_names_its_run():
    assert rows()
    for r in rows():
        assert {"command", "gpu", "driver", "date", "revision"} <= set(r), r
        assert r["command"] and re.match(DAY, r["date"]), r
        assert re.match(r"[0-9a-f]{7}", r["revision"]), r
        # transcribed rows hold their figures under "figures"; tq-eval --json rows at the top level
        assert "figures" in r or {"mse", "delta_pct", "accuracy"} & set(r), r
        transcribed = r.get("source", "transcribed from docs/QUALITY.md at ")
        assert transcribed.startswith("transcribed from docs/QUALITY.md at "), r


def test_every_date_and_revision_the_quality_doc_cites_has_a_row():
    doc = (ROOT / "docs" / "QUALITY.md").read_text().replace("\n", " ")
    # "(H200, 2026-12-03, `785797e`)": a date, then within the same parenthesis a revision
    pairs = re.findall(r"(" + DAY + r")[^`()]{0,40}?`([0-9a-f]{7})`", doc)
    cited = {(rev, day) for day, rev in pairs}
    assert cited, "the doc cites no run"
    have = {(r["revision"][:7], r["date"][:10]) for r in rows()}
    assert cited <= have, f"cited without a row in {RESULTS.name}: {sorted(cited - have)}"
