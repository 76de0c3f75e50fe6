"""The tq-eval subcommands that run a model: ppl (perplexity and top-1 agreement) and needle
(passkey retrieval), each comparing an engine's cache with FP16 on the same inputs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..core.errors import TQError
from ..eval.corpus import EVALUATION_BOOK, read_corpus
from ..eval.choices import BASELINE_NAMES, DEPTHS
from ..eval.run_record import run_metadata
from ..integrations.attention import CHUNK_READS
from ..trtllm.cli_backend import backend_option, needle_trtllm, ppl_trtllm
from .common import (check_device, clean_errors, comma_list, device_option, place_model,
                     token_lengths)


BASELINE_HELP = "Also measure a reference cache (repeatable): eval/baselines.py."


def _check_engines(paths) -> list[tuple[str, dict, object]]:
    """(name, manifest, table) of each engine, every one validated before the model loads: one
    model for all, distinct directory names (results are keyed by them)."""
    from ..engine import check_engine

    if not paths:
        raise TQError("give at least one --engine")
    names = [Path(p).name for p in paths]
    if len(set(names)) != len(names):  # results are keyed by name: one would hide another
        raise TQError(f"engines {', '.join(paths)} share a directory name; compare engines whose "
                      "directories have distinct names")
    checked = [(name, *check_engine(path)) for name, path in zip(names, paths)]
    model = lambda manifest: (manifest["model"], manifest.get("checkpoint"))  # noqa: E731
    for path, (_, manifest, _) in zip(paths[1:], checked[1:]):
        if model(manifest) != model(checked[0][1]):
            raise TQError(f"engine {path} is for another model than {paths[0]}; compare engines of one model")
    return checked


def _load_model(paths, checked):
    """The engines' one model, loaded once; every table checked against it."""
    from ..engine import check_model, tables_path
    from ..models.checkpoint import load_model

    manifest = checked[0][1]
    loaded = load_model(manifest["model"], manifest.get("checkpoint"))
    for path, (_, manifest, table) in zip(paths, checked):
        check_model(tables_path(path, manifest), table, loaded)
    return loaded


def _table_digest(path, manifest) -> str:
    """What identifies an engine's tables in a --rows file: their bytes' hash."""
    import hashlib

    from ..engine import tables_path

    return hashlib.sha256(tables_path(path, manifest).read_bytes()).hexdigest()[:16]


@click.command(help="Perplexity and top-1 agreement: FP16 cache vs the engine's cache, same windows.")
@click.option("--engine", "engines", multiple=True, type=click.Path(), required=True,
              help="Engine directory; repeat to compare several engines of one model.")
@click.option("--baseline", "baselines", multiple=True, type=click.Choice(sorted(BASELINE_NAMES)),
              help=BASELINE_HELP)
@click.option("--corpus", default=f"austen:{EVALUATION_BOOK}", show_default=True,
              help="Text file, or austen:BOOK (held out from the calibration book).")
@click.option("--max-tokens", type=click.IntRange(min=2), default=16 * 1024, show_default=True,
              help="Tokens of the corpus to evaluate, cut into windows.")
@click.option("--window", type=click.IntRange(min=16), default=1024, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per engine or baseline, one a line.")
@device_option
@backend_option(ppl_trtllm)
@clean_errors
def ppl(engines, baselines, corpus, max_tokens, window, as_json, device):
    from ..calibration.capture import token_windows
    from ..eval.perplexity import baseline_method, compare_caches, engine_method

    text, source = read_corpus(corpus)
    check_device(device)
    opened = _check_engines(engines)
    loaded = _load_model(engines, opened)
    if window > loaded.max_context:
        raise TQError(f"--window {window} exceeds the model's context of {loaded.max_context} tokens")
    windows = token_windows(loaded.tokenizer, text, window, max_tokens // window)
    backend = "kernels" if place_model(loaded.model, device) else "reference"
    methods = {name: engine_method(table, window, backend) for name, _, table in opened}
    methods.update({name: baseline_method(name, loaded.model, window) for name in baselines})
    results = compare_caches(loaded.model, windows, methods, progress=True)  # bars go to stderr
    meta = run_metadata()  # each row traceable: docs/results/quality.jsonl
    for name, r in results.items():
        if as_json:
            click.echo(json.dumps({"method": name, "corpus": source, **r, **meta}))
        else:
            lo, hi = r["delta_ci95_pct"]
            click.echo(f"{name:>24}: ppl {r['ppl_kv']:.4f} vs fp16 {r['ppl_fp16']:.4f}  "
                       f"delta {r['delta_pct']:+.2f}% [95% CI {lo:+.2f}, {hi:+.2f}]  "
                       f"top-1 {100 * r['top1_agreement']:.2f}%  {r['effective_bits']:.3f} bits "
                       f"({r['windows']} x {r['window_tokens']} tokens)")


def _seeds(text: str) -> list[int]:
    """'3' -> [3]; '0-14' -> 0 .. 14; '1,4,9' -> those."""
    try:
        if "-" in text.strip()[1:]:
            first, last = (int(v) for v in text.split("-", 1))
            values = list(range(first, last + 1))
        else:
            values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a seed, a range such as 0-14, or a "
                                 "comma-separated list of seeds") from None
    if not values:
        raise click.BadParameter(f"{text!r} names no seed")
    return values


def _depths(text: str) -> list[float]:
    """'0.1,0.5,0.9' -> those relative depths of the key in the filler."""
    values = comma_list(text, float, "depths")
    if not values or not all(0.0 <= v <= 1.0 for v in values):
        raise click.BadParameter("give depths between 0 (the start of the filler) and 1 (its end)")
    return values


@click.command(help="Passkey retrieval accuracy, FP16 cache vs each engine's cache (and each reference "
                    "cache asked for), same prompts.")
@click.option("--engine", "engines", multiple=True, type=click.Path(), required=True,
              help="Engine directory; repeat to compare several engines of one model.")
@click.option("--lengths", default="1024,2048,4096,8000", show_default=True,
              help="Comma-separated context lengths in tokens (at most the model's context).")
@click.option("--seeds", "--seed", "seeds", default="0", show_default=True,
              help="Seeds of the keys (and filler stretches): one, a range such as 0-14, or a "
                   "comma-separated list; each gives one prompt per length and depth.")
@click.option("--depths", default=",".join(f"{d:g}" for d in DEPTHS), show_default=True,
              help="Comma-separated relative depths of the key in the filler (0: its start, "
                   "furthest from the question); one prompt per seed, length and depth.")
@click.option("--filler", default=None,
              help="Text file or austen:BOOK whose running text fills each prompt, a different "
                   "stretch per prompt (default: one short passage repeated, whose prompts of one "
                   "length answer alike).")
@click.option("--baseline", "baselines", multiple=True,
              type=click.Choice(sorted(set(BASELINE_NAMES) - {"fp16"})), help=BASELINE_HELP)
@click.option("--graded", is_flag=True,
              help="Also score each prompt by the key's teacher-forced log-probability under each "
                   "cache (one more forward pass per prompt and cache) and report its mean change "
                   "against FP16 per length and over all lengths, with a 95% interval.")
@click.option("--rows", "rows_file", type=click.Path(dir_okay=False),
              help="Append each finished seed's prompts to this file (JSON lines), and take the "
                   "prompts already in it instead of running them again: a stopped run resumes, "
                   "and the files of runs on other seeds, concatenated, give one report (rows of "
                   "other caches, tables, filler, --graded or device are refused).")
@click.option("--chunk-reads", type=click.Choice(CHUNK_READS), default="exact", show_default=True,
              help="How each cache reads a prompt's own tokens while it prefills: exact (as "
                   "computed, as a context phase over fresh K and V does, the runtime's default) "
                   "or cache (through the cache, as decode steps would: the 'old protocol' of "
                   "docs/QUALITY.md#passkey-retrieval). The answers read the prompt through the "
                   "cache either way.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (with every prompt's answers under 'answers').")
@device_option
@backend_option(needle_trtllm)
@clean_errors
def needle(engines, lengths, seeds, depths, filler, baselines, graded, rows_file, chunk_reads,
           as_json, device):
    from tqdm import tqdm

    from ..eval.baselines import RoundtripCache
    from ..eval.needle import ALL, check_length, graded_changes, paired_changes, passkey_accuracy
    from ..eval.needle_rows import append_rows, read_rows
    from ..integrations.cache import TurboQuantCache

    lengths, seeds, depths = token_lengths(lengths), _seeds(seeds), _depths(depths)
    baselines = list(dict.fromkeys(baselines))
    for e in engines:  # before the model loads
        if Path(e).name in ("fp16", *baselines):
            raise TQError(f"an engine directory is named '{Path(e).name}', the name of a reference "
                          "cache's results; rename the directory")
    check_device(device)
    opened = _check_engines(engines)
    filler_text, source = read_corpus(filler) if filler is not None else (None, "repeated passage")
    loaded = _load_model(engines, opened)
    for n in lengths:
        check_length(n, loaded.max_context, 8)
    backend = "kernels" if place_model(loaded.model, device) else "reference"
    first = opened[0][2]
    factories = {name: lambda name=name: RoundtripCache(name, len(first.layers), first.head_dim,
                                                        chunk_reads)
                 for name in ("fp16", *baselines)}
    for name, _, table in opened:
        factories[name] = lambda table=table: TurboQuantCache(table, backend=backend,
                                                              chunk_reads=chunk_reads)
    corpus_ids = None
    if filler_text is not None:
        corpus_ids = loaded.tokenizer(filler_text, add_special_tokens=False)["input_ids"]
    known, on_seed = {}, None
    if rows_file is not None:
        run = {"caches": list(factories), "filler": source, "graded": graded, "backend": backend,
               "chunk_reads": chunk_reads,
               "engines": {name: _table_digest(path, manifest)
                           for path, (name, manifest, _) in zip(engines, opened)}}
        known = read_rows(rows_file, run)
        on_seed = lambda new: append_rows(rows_file, run, new)  # noqa: E731
    bar = tqdm(total=len(seeds) * len(lengths) * len(depths) * len(factories),
               desc="passkey prompts")  # stderr
    results, rows = passkey_accuracy(loaded.model, loaded.tokenizer, lengths, factories, seeds,
                                     depths, progress=bar.update, corpus_ids=corpus_ids, graded=graded,
                                     known=known, on_seed=on_seed)
    bar.close()
    names = [name for name, _, _ in opened] + baselines
    changes = {name: paired_changes(rows, name) for name in names}
    out = {"lengths": lengths, "seeds": seeds, "depths": depths, "filler": source,
           "chunk_reads": chunk_reads,
           "prompts_per_length": len(seeds) * len(depths), "accuracy": results,
           "changes": changes, "equal": {name: results["fp16"] == results[name] for name in names},
           "answers": rows}
    if graded:
        out["graded"] = {name: graded_changes(rows, name) for name in names}
    if as_json:
        click.echo(json.dumps({**out, **run_metadata()}))
        return
    click.echo(f"{'tokens':>6}  {'fp16':>6}  " + "  ".join(f"{name:>16}" for name in names))
    for n in lengths:
        cells = [f"{results[name][n]:.2f} (-{changes[name][n]['lost']} +{changes[name][n]['won']})"
                 for name in names]
        click.echo(f"{n:>6}  {results['fp16'][n]:>6.2f}  " + "  ".join(f"{c:>16}" for c in cells))
    for name in names:
        total = changes[name][ALL]
        click.echo(f"{name}: passkey retrieval {'equal to' if out['equal'][name] else 'DIFFERS from'} FP16; "
                   f"all lengths: {total['lost']} lost, {total['won']} won (sign test p = {total['p']:.3f})")
        for n, g in out.get("graded", {}).get(name, {}).items():
            click.echo(f"  {n:>6}{' tokens' if n != ALL else ''}: key log-probability {g['mean']:+.3f} "
                       f"nats against FP16 [95% CI {g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}]")
