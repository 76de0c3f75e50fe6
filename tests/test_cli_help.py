"""--help of every command and subcommand: answered without importing torch or transformers (they
load only when a command runs), and written as a rule or a doc heading, never as history."""

import re
import subprocess
import sys

import pytest

COMMANDS = [  # (module of the entry point, arguments before --help)
    ("build", []), ("run", []), ("eval", []), ("eval", ["distortion"]), ("eval", ["ppl"]),
    ("eval", ["needle"]), ("bench", []), ("bench", ["decode"]), ("bench", ["prefill"]),
    ("bench", ["engine"]),
]

HELP = """
import sys
from tq_trtllm.cli.{module} import main
try:
    main({args!r} + ["--help"], prog_name="tq-{module}")
except SystemExit as done:
    assert done.code == 0, done.code
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
assert not heavy, "--help imported " + ", ".join(heavy)
"""


@pytest.mark.parametrize("module, args", COMMANDS, ids=[" ".join([m, *a]) for m, a in COMMANDS])
def test_help_imports_neither_torch_nor_transformers(module, args):
    done = subprocess.run([sys.executable, "-c", HELP.format(module=module, args=args)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Usage:" in done.stdout
    # history is not help: a rule, or the doc heading that measured it
    assert not re.search(r"\bsessions?\s+\d", done.stdout, re.I), done.stdout


def test_the_listed_reference_caches_are_the_defined_ones():
    from tq_trtllm.eval.baselines import BASELINES
    from tq_trtllm.eval.choices import BASELINE_NAMES

    assert tuple(BASELINES) == BASELINE_NAMES
