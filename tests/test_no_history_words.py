"""Help texts, docs and code comments describe the product as it is: they state a rule or cite a
doc heading or a revision, never a numbered round of its development (WORD below, then a number).
History belongs in CHANGELOG.md alone."""

from __future__ import annotations

import importlib
import re
import subprocess
import tomllib
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
# The word spelled in two pieces, so that a grep of the repository for it finds only its own uses.
WORD = "sess" + "ion"
# WORD 12, WORDs 30-32, and a number wrapped onto the next line behind a comment leader
HISTORY = re.compile(r"\b" + WORD + r"s?(?:[ \t]+|[ \t]*\n[ \t]*(?:(?://|#|\*|--)[ \t]*)?)[0-9]+",
                     re.IGNORECASE)
EXEMPT = {"CHANGELOG.md"}
CODE_SUFFIXES = {".py", ".pyi", ".cu", ".cuh", ".h", ".hpp", ".c", ".cc", ".cpp", ".sh", ".cmake",
                 ".toml", ".yml", ".yaml", ".md", ".txt", ".in"}


def history_mentions(text: str) -> list[tuple[int, str]]:
    """(line number, matched words) of every numbered WORD in text."""
    return [(text.count("\n", 0, m.start()) + 1, " ".join(m.group().split()))
            for m in HISTORY.finditer(text)]


def tracked_files() -> list[Path]:
    """The repository's own source and doc files (what a clean clone holds), CHANGELOG.md aside."""
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                                check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        pytest.skip("git is needed to list the repository's files")
    files = [ROOT / name for name in listed if name]
    return [f for f in files if f.is_file() and f.name not in EXEMPT
            and (f.suffix in CODE_SUFFIXES or f.name == "CMakeLists.txt")]


def console_commands() -> dict[str, click.Command]:
    """pyproject's [project.scripts] (tq-build, tq-run, tq-eval, tq-bench), loaded."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    commands = {}
    for name, target in scripts.items():
        module, attr = target.split(":")
        commands[name] = getattr(importlib.import_module(module), attr)
    return commands


def help_texts(command: click.Command, path: str, parent: click.Context | None = None):
    """(command line, rendered --help) for a command and every subcommand under it."""
    ctx = click.Context(command, info_name=path.split()[-1], parent=parent)
    yield path, command.get_help(ctx)
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            yield from help_texts(command.get_command(ctx, name), f"{path} {name}", ctx)


def test_the_pattern_finds_numbered_rounds_and_nothing_else():
    cap = WORD.capitalize()
    assert [w for _, w in history_mentions(f"measured in {cap} 12 and {WORD}s 30-32")] == \
        [f"{cap} 12", f"{WORD}s 30"]
    assert history_mentions(f"// (docs/BENCHMARKS.md, {WORD}\n// 43)") == [(1, f"{WORD} // 43")]
    assert history_mentions(f"a {WORD} of the server; {WORD}s of 4 users") == []
    assert history_mentions(f"TQ_{WORD.upper()}=3; pos{WORD} 2") == []


def test_no_help_text_cites_a_numbered_round():
    found = [f"{line}: {words}" for name, command in console_commands().items()
             for line, text in help_texts(command, name) for _, words in history_mentions(text)]
    assert not found, (f"--help texts that cite a numbered {WORD} (cite a doc heading instead):\n"
                       + "\n".join(found))


def test_no_doc_or_code_comment_cites_a_numbered_round():
    found = []
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{path.relative_to(ROOT)}:{line}: {words}"
                  for line, words in history_mentions(text)]
    assert not found, (f"docs and comments that cite a numbered development {WORD} (state the rule "
                       "or cite a doc heading; history goes in CHANGELOG.md):\n" + "\n".join(found))
