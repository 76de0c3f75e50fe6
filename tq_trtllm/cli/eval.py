"""tq-eval: measure the quantizer and the quantized cache."""

from __future__ import annotations

import json

import click

from ..core.spec import ROTATIONS, SUPPORTED_WIDTHS
from ..eval.distortion import KINDS, measure_distortion
from ..eval.run_record import run_metadata
from ..trtllm.check import check_command
from .common import clean_errors, kv_widths, widths_text
from .eval_ppl_needle import needle, ppl

PROD_WIDTHS = (2.0, 3.0, 4.0)  # TurboQuant-prod: (b - 1)-bit MSE codes, integer b, plus one QJL bit


@click.group(help="Measure TurboQuant's distortion and the quantized cache's quality.")
def main():
    pass


@main.command(help="Distortion of TurboQuant on random unit vectors.")
@click.option("--bits", required=True,
              help=f"Bits per coordinate: {widths_text(SUPPORTED_WIDTHS)} (the format's widths; "
                   f"--kind prod takes {widths_text(PROD_WIDTHS)}).")
@click.option("--dim", type=int, required=True, help="Vector dimension (head_dim).")
@click.option("--kind", type=click.Choice(KINDS), default="mse", show_default=True)
@click.option("--rotation", type=click.Choice(ROTATIONS), default="hadamard", show_default=True)
@click.option("--samples", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@clean_errors
def distortion(bits, dim, kind, rotation, samples, seed, as_json):
    widths = PROD_WIDTHS if kind == "prod" else SUPPORTED_WIDTHS
    why = " (TurboQuant-prod: an integer-bit MSE code plus one QJL bit)" if kind == "prod" else ""
    bits, _ = kv_widths(bits, "--bits", widths, pairs=False, why=why)
    bits = int(bits) if bits.is_integer() else bits  # integer widths print and serialize as 3, not 3.0
    result = measure_distortion(bits, dim, kind, rotation, samples, seed)
    if as_json:
        click.echo(json.dumps({**result, **run_metadata()}))
        return
    click.echo(f"TurboQuant-{kind}, {bits:g} bits, dim {dim}, {rotation} rotation, "
               f"{samples} samples, seed {seed}")
    click.echo(f"  E||x - x_hat||^2     {result['mse']:.6f}")
    click.echo(f"  <y, x_hat - x> mean  {result['ip_bias']:+.3e} "
               f"(standard error {result['ip_bias_stderr']:.1e})")
    click.echo(f"  <y, x_hat - x> var   {result['ip_var']:.3e}")


main.add_command(ppl)
main.add_command(needle)
main.add_command(check_command())


if __name__ == "__main__":
    main()
