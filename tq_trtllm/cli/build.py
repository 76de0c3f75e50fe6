"""tq-build: calibrate a model's KV cache and write an engine directory."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..calibration.options import MAX_RECENT_TOKENS, CalibrationOptions
from ..core.errors import TQError
from ..core.spec import MAX_ROTARY_PAIRS, SUPPORTED_WIDTHS
from ..eval.corpus import CALIBRATION_BOOK, read_corpus
from ..models.checkpoint import check_checkpoint
from ..models.registry import FAMILIES, get_family
from ..trtllm.cli_options import prepare_trtllm_build, trtllm_build_options
from .common import check_output_dir, clean_errors, kv_widths, token_lengths

BACKENDS = ("auto", "hf", "trtllm")
BUILD_WIDTHS = tuple(w for w in SUPPORTED_WIDTHS if w >= 2.0)  # below 2 bits: too lossy to ship


def default_calibration_text() -> tuple[str, str]:
    """Austen's Emma when the corpus is present, else the Python reference manual that every
    Python installation ships (pydoc_data): English prose, available offline."""
    try:
        return read_corpus(f"austen:{CALIBRATION_BOOK}")
    except TQError:
        from pydoc_data.topics import topics

        return "\n\n".join(topics.values()), "Python reference manual (pydoc_data.topics)"


def calibration_summary(calibration: dict) -> str:
    """Which text the tables were calibrated on, and how much of it, in one line."""
    if calibration.get("mode") != "calibrated":
        return "none (--oblivious: the format's defaults, no calibration data)"
    window = calibration["window"]
    return (f"{calibration['source']}, {calibration['tokens']:,} tokens "
            f"({calibration['tokens'] // window} windows of {window})")


def _scale_lengths(text: str) -> tuple[int, ...] | None:
    """--key-scale-lengths: auto -> None (the calibration's default), context -> (), else the list."""
    choice = text.strip().lower()
    if choice == "auto":
        return None
    return () if choice == "context" else tuple(token_lengths(text))


@click.command(help="Calibrate a model's TurboQuant KV cache and write an engine directory.")
@click.option("--model", "family", default="llama", show_default=True,
              help=f"Model family: {', '.join(FAMILIES)}.")
@click.option("--kv-bits", default="3", show_default=True,
              help="Average code bits per coordinate (2 to 5 in steps of 0.5) or a K/V pair such as k4v3.")
@click.option("--checkpoint", type=click.Path(), default=None,
              help="GGUF file or Hugging Face model directory (default: the embedded SmolLM2-135M-Instruct).")
@click.option("--calib-text", default=None,
              help="Calibration text file, or austen:BOOK. Default: Jane Austen's Emma where "
                   "build_scripts/fetch_corpus.sh has unpacked it, else the Python reference "
                   "manual that every Python ships; the summary names the text used.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True)
@click.option("--output", type=click.Path(), default=None,
              help="Engine directory to create (default: engines/<model>-kv<bits>); never overwritten.")
@click.option("--oblivious", is_flag=True, help="Plain TurboQuant: no calibration data at all.")
@click.option("--sink-tokens", type=click.IntRange(0, 64), default=1, show_default=True,
              help="First tokens of each sequence kept exact in fp16.")
@click.option("--recent-tokens", type=click.IntRange(1, MAX_RECENT_TOKENS),
              default=CalibrationOptions.recent_tokens,
              show_default=True,
              help="Each query reads its N most recent positions (its own included) exact; the "
                   "last N - 1 are kept in fp16 beside the pages and count in the effective bits "
                   "(per-layer widths give code bits back for them; --uniform widths cannot).")
@click.option("--key-mean/--no-key-mean", default=True, show_default=True)
@click.option("--key-scale/--no-key-scale", default=True, show_default=True)
@click.option("--value-mean/--no-value-mean", default=False, show_default=True)
@click.option("--value-scale/--no-value-scale", default=False, show_default=True)
@click.option("--per-layer/--uniform", default=True, show_default=True,
              help="Per-layer widths from measured sensitivity, or the same widths in every layer.")
@click.option("--calib-windows", type=click.IntRange(1, 256), default=8, show_default=True,
              help="512-token windows of calibration text for the statistics.")
@click.option("--retrieval-windows", type=click.IntRange(0, 64), default=2, show_default=True,
              help="Synthetic retrieval windows (a number to copy from far back) added to the layer "
                   "sensitivity's windows, so the widths also price long-range retrieval.")
@click.option("--page-shift/--no-page-shift", default=CalibrationOptions.page_shift, show_default=True,
              help="Measure how much quantization noise inflates the packed keys' softmax mass, per "
                   "layer and query head, and take it back at attention time.")
@click.option("--rotary-pairs", type=click.IntRange(0, MAX_ROTARY_PAIRS),
              default=CalibrationOptions.rotary_pairs, show_default=True,
              help="Channel pairs per KV head whose pre-RoPE key mean is subtracted as RoPE turns it "
                   "(restored exactly at attention time); 0 turns it off.")
@click.option("--stats-context", type=click.IntRange(min=1), default=CalibrationOptions.stats_context,
              show_default=True,
              help="Positions the key mean and the outlier channels stand for (RoPE turns queries "
                   "and keys further at later positions), and the key scale with "
                   "--key-scale-lengths context; at most the model's context limit "
                   "(docs/QUALITY.md#statistics-context).")
@click.option("--key-scale-lengths", default="auto", show_default=True,
              help="Prompt lengths the per-channel key scale is balanced over, comma-separated (each "
                   "length's key logit error against its own optimum counts alike); auto: powers of "
                   "two from 1024 to the model's context; context: fitted to the --stats-context "
                   "positions alone (docs/QUALITY.md#key-scale-balanced-over-lengths).")
@click.option("--seed", type=click.IntRange(0, 2**31), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@trtllm_build_options
@clean_errors
def main(family, kv_bits, checkpoint, calib_text, backend, output, oblivious, sink_tokens,
         recent_tokens, key_mean, key_scale, value_mean, value_scale, per_layer, calib_windows,
         retrieval_windows, page_shift, rotary_pairs, stats_context, key_scale_lengths, seed, as_json):
    family = get_family(family).name
    key_w, value_w = kv_widths(kv_bits, "--kv-bits", BUILD_WIDTHS,
                               why=" (below 2 bits the cache loses too much to be useful)")
    trtllm = None
    if backend == "trtllm":  # TensorRT-LLM and the plugin's needs checked before any calibration
        trtllm = prepare_trtllm_build(click.get_current_context(), family)
        sink_tokens, recent_tokens, per_layer = trtllm.sink_tokens, trtllm.recent_tokens, trtllm.per_layer
    backend = "trtllm" if trtllm else "hf"
    tag = str(kv_bits).strip().lower()
    # every check that needs no model, before the model loads and the calibration runs
    output = Path(output) if output else Path("engines") / f"{family}-kv{tag}"
    check_output_dir(output)
    check_checkpoint(checkpoint)  # a GGUF file or a model directory, before it loads
    scale_lengths = _scale_lengths(key_scale_lengths)
    text, source = (read_corpus(calib_text) if calib_text else default_calibration_text()) \
        if not oblivious else (None, None)

    from ..calibration.calibrate import calibrate
    from ..calibration.table import oblivious_table
    from ..engine import write_engine
    from ..models.checkpoint import load_model
    from ..models.fingerprint import fingerprint

    loaded = load_model(family, checkpoint)
    if oblivious:
        table = oblivious_table(fingerprint(family, loaded.config), key_w, value_w, seed, kv_bits=tag)
    else:
        opts = CalibrationOptions(key_mean=key_mean, key_scale=key_scale, value_mean=value_mean,
                                  value_scale=value_scale, sink_tokens=sink_tokens,
                                  recent_tokens=recent_tokens, per_layer=per_layer,
                                  windows=calib_windows, retrieval_windows=retrieval_windows,
                                  page_shift=page_shift, rotary_pairs=rotary_pairs,
                                  stats_context=stats_context,
                                  key_scale_lengths=scale_lengths, seed=seed)
        table = calibrate(loaded, text, tag, opts, source=source, progress=not as_json)
    manifest = (trtllm.build(output, family, checkpoint, loaded, table) if trtllm
                else write_engine(output, family, checkpoint, backend, table))
    if as_json:
        click.echo(json.dumps({"output": str(output), **manifest}))
        return
    avg = manifest["average_widths"]
    click.echo(f"engine written to {output}")
    click.echo(f"  model {family} ({loaded.checkpoint.name}), backend {backend}")
    click.echo(f"  calibration text: {calibration_summary(table.calibration)}")
    click.echo(f"  widths: keys {avg['key']:.2f}, values {avg['value']:.2f} code bits on average; "
               f"{manifest['effective_bits']['bits']:.3f} effective bits per coordinate at "
               f"{manifest['effective_bits']['context']} tokens")
    click.echo("  per layer (K/V): " + " ".join(
        f"{k:g}/{v:g}" for k, v in zip(manifest["key_widths"], manifest["value_widths"])))
