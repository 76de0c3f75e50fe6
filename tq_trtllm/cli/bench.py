"""tq-bench: speed of the CUDA kernels against torch SDPA over an fp16 cache, in the same run."""

from __future__ import annotations

import json

import click

from ..core.spec import MAX_ROTARY_PAIRS
from ..eval.run_record import run_metadata
from ..serving.bench import serve as serve_command
from .common import clean_errors, kv_widths

ROTARY = click.option("--rotary-pairs", type=click.IntRange(0, MAX_ROTARY_PAIRS), default=0,
                      show_default=True,
                      help="Give the keys a rotary mean on this many channel pairs (tq-build's "
                           "calibrated tables have 16).")
SHAPES = {  # name: (q heads, kv heads, head_dim)
    "llama3-8b": (32, 8, 128),
    "smollm2": (9, 3, 64),
}
# Options the decode and prefill benchmarks share.
SHAPE = click.option("--shape", type=click.Choice(sorted(SHAPES)), default="llama3-8b", show_default=True)
BITS = click.option("--bits", default="3", show_default=True,
                    help="Comma-separated widths or K/V pairs, e.g. 3,4,k5v3.")
JSON_ROWS = click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
L2_FLUSH = click.option("--l2-flush", type=click.Choice(["read", "write"]), default="read", show_default=True,
                        help="How the L2 is emptied before each timed launch: read a large buffer "
                             "(leaves it clean), or write one (leaves dirty lines whose write-back slows "
                             "a bandwidth-bound baseline: docs/BENCHMARKS.md#the-l2-flush).")


def _parse_pairs(text: str) -> list[tuple[int, int]]:
    """'1x4096,32x32768' -> [(1, 4096), (32, 32768)] (batch x context)."""
    pairs = []
    for item in text.split(","):
        b, _, c = item.strip().lower().partition("x")
        pairs.append((int(b), int(c)))
    return pairs


def _parse_widths(text: str) -> list[tuple[float, float]]:
    """'3,k5v3' -> [(3.0, 3.0), (5.0, 3.0)] (key, value widths)."""
    return [kv_widths(item, "--bits") for item in text.split(",")]


def _echo_rows(rows, as_json: bool) -> None:
    if as_json:
        meta = run_metadata()
        for r in rows:
            click.echo(json.dumps({**r.as_dict(), **meta}))
        return
    click.echo(f"{'bench':8}{'batch':>6}{'context':>9}{'q_len':>6}{'heads':>7}{'d':>5}{'K/V bits':>9}"
               f"{'rot':>4}{'tq us':>10}{'sdpa us':>10}{'speedup':>9}{'TB/s':>7}{'append us':>11}{'append %':>9}"
               f"{'fused us':>10}{'fused +%':>9}{'fp8 us':>9}{'vs fp8':>8}")
    for r in rows:
        app = f"{r.append_us:11.1f}{r.append_pct:9.2f}" if r.append_us is not None else f"{'-':>11}{'-':>9}"
        app += f"{r.fused_us:10.1f}{r.fused_append_pct:9.2f}" if r.fused_us is not None else f"{'-':>10}{'-':>9}"
        fp8 = getattr(r, "fp8_us", None)
        app += f"{fp8:9.1f}{r.speedup_vs_fp8:7.2f}x" if fp8 is not None else f"{'-':>9}{'-':>8}"
        click.echo(f"{r.bench:8}{r.batch:>6}{r.context:>9}{r.q_len:>6}{f'{r.q_heads}/{r.kv_heads}':>7}"
                   f"{r.head_dim:>5}{f'{r.k_bits:g}/{r.v_bits:g}':>9}{r.rotary_pairs:>4}{r.tq_us:10.1f}{r.sdpa_us:10.1f}"
                   f"{r.speedup:8.2f}x{r.tq_read_tbps:7.2f}{app}")


def _require_kernels():
    from ..kernels import unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise click.ClickException(f"tq-bench needs the CUDA kernels: {reason}")


@click.group(help="Time the tq_trtllm CUDA kernels against torch SDPA (fp16 cache, enable_gqa).")
def main():
    pass


@main.command(help="Decode attention (one query token per sequence by default).")
@SHAPE
@click.option("--sizes", default="1x4096,1x32768,1x131072,8x32768,32x32768", show_default=True,
              help="Comma-separated BATCHxCONTEXT.")
@BITS
@click.option("--q-len", type=click.IntRange(1, 8), default=1, show_default=True)
@click.option("--iters", type=click.IntRange(min=1), default=50, show_default=True)
@ROTARY
@L2_FLUSH
@JSON_ROWS
@clean_errors
def decode(shape, sizes, bits, q_len, iters, rotary_pairs, l2_flush, as_json):
    _require_kernels()
    from ..eval.kernel_speed import Timer, decode_row

    hq, hkv, d = SHAPES[shape]
    timer = Timer(iters, flush=l2_flush)
    rows = []
    for k_bits, v_bits in _parse_widths(bits):
        for batch, context in _parse_pairs(sizes):
            rows.append(decode_row(timer, batch, context, hq, hkv, d, k_bits, v_bits, q_len, rotary_pairs))
            if as_json:
                _echo_rows(rows[-1:], True)
    if not as_json:
        _echo_rows(rows, False)


@main.command(help="Chunked prefill: CHUNK new tokens over HISTORY packed tokens (batch 1, causal); "
                    "the append columns time the chunk's bulk quantize-append on its own.")
@SHAPE
@click.option("--history", type=click.IntRange(min=0), default=32768, show_default=True)
@click.option("--chunk", type=click.IntRange(min=1), default=2048, show_default=True)
@BITS
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True)
@ROTARY
@L2_FLUSH
@JSON_ROWS
@clean_errors
def prefill(shape, history, chunk, bits, iters, rotary_pairs, l2_flush, as_json):
    _require_kernels()
    from ..eval.kernel_speed import Timer, prefill_row

    hq, hkv, d = SHAPES[shape]
    timer = Timer(iters, flush=l2_flush)
    rows = [prefill_row(timer, history, chunk, hq, hkv, d, k_bits, v_bits, rotary_pairs)
            for k_bits, v_bits in _parse_widths(bits)]
    _echo_rows(rows, as_json)


@main.command(help="One decode step's attention over every layer of an engine (tq-build's output), "
                    "each layer at its own K/V widths, against SDPA over an fp16 cache in every layer: "
                    "each call timed alone and summed, then the layers' calls in one CUDA graph. "
                    "The caches hold random data at the engine's widths and rotary pairs.")
@click.option("--engine", "engine_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--sizes", default="1x2048,1x8192,16x8192", show_default=True,
              help="Comma-separated BATCHxCONTEXT.")
@click.option("--iters", type=click.IntRange(min=1), default=50, show_default=True)
@L2_FLUSH
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per width pair (with its layer count), then one per step.")
@clean_errors
def engine(engine_dir, sizes, iters, l2_flush, as_json):
    from ..engine import read_manifest

    manifest = read_manifest(engine_dir)
    _require_kernels()
    from ..eval.kernel_speed import Timer, engine_step

    fp = manifest["fingerprint"]
    layer_widths = list(zip(manifest["key_widths"], manifest["value_widths"]))
    rotary_pairs = manifest["calibration"].get("rotary_pairs", 0)
    timer = Timer(iters, flush=l2_flush)
    for batch, context in _parse_pairs(sizes):
        rows, step = engine_step(timer, batch, context, fp["heads"], fp["kv_heads"], fp["head_dim"],
                                 layer_widths, rotary_pairs)
        if as_json:
            meta = run_metadata()
            for n, r in rows:
                click.echo(json.dumps({**r.as_dict(), "layers": n, **meta}))
            click.echo(json.dumps({**step.as_dict(), **meta}))
            continue
        _echo_rows([r for _, r in rows], False)
        click.echo("layers per K/V width pair: " + ", ".join(f"{r.k_bits:g}/{r.v_bits:g} x {n}" for n, r in rows))
        click.echo(f"step: {step.layers} layers, batch {batch} x {context}: tq {step.tq_us:.1f} us "
                   f"(fused append {step.fused_us:.1f}), SDPA {step.sdpa_us:.1f} us, {step.speedup:.2f}x; "
                   f"one CUDA graph: tq {step.tq_graph_us:.1f} us (fused append {step.fused_graph_us:.1f}), "
                   f"SDPA {step.sdpa_graph_us:.1f} us, {step.graph_speedup:.2f}x")


main.add_command(serve_command, "serve")  # tq-bench serve: tq_trtllm/serving/bench.py

if __name__ == "__main__":
    main()
