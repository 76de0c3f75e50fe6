"""tq-build's TensorRT-LLM options and the checks that run before any calibration.

The options are added to tq-build by `trtllm_build_options` (a decorator that keeps them out of
tq-build's own signature: it moves them into the click context), and `prepare_trtllm_build` reads
them back, refuses what the engine cannot hold, and returns what tq-build's main needs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from ..core.errors import TQError
from .requirement import require_tensorrt_llm

if TYPE_CHECKING:  # the builder needs torch: imported when a build runs, so --help stays quick
    from .builder import TrtllmBuildOptions

META_KEY = "tq_trtllm.trtllm_options"
_OPTIONS = (
    click.option("--tp-size", type=click.IntRange(1, 64), default=1, show_default=True,
                 help="--backend trtllm: tensor-parallel ranks (one engine each; must divide the heads)."),
    click.option("--max-batch-size", type=click.IntRange(1, 4096), default=8, show_default=True,
                 help="--backend trtllm: requests in flight at once."),
    click.option("--max-seq-len", type=click.IntRange(2), default=4096, show_default=True,
                 help="--backend trtllm: prompt plus generated tokens per request."),
    click.option("--tokens-per-block", type=click.IntRange(16), default=64, show_default=True,
                 help="--backend trtllm: tokens per KV block (a multiple of 16)."),
    click.option("--dtype", "trtllm_dtype", type=click.Choice(["float16", "bfloat16"]), default="float16",
                 show_default=True, help="--backend trtllm: the engine's activation and KV-pool dtype."),
)
_NAMES = ("tp_size", "max_batch_size", "max_seq_len", "tokens_per_block", "trtllm_dtype")
# tq-build options whose defaults the plugin cannot serve: (name, value the engine needs, why)
_PLUGIN_NEEDS = (
    ("sink_tokens", 0, "the plugin keeps no exact fp16 sink rows"),
    ("recent_tokens", 1, "the plugin keeps no fp16 recent window beyond each token's own row"),
    ("per_layer", False, "TensorRT-LLM 1.2 sizes one KV page for all layers, so widths must be uniform"),
)


def trtllm_build_options(func):
    """Adds --tp-size, --max-batch-size, --max-seq-len, --tokens-per-block and --dtype to a command,
    keeping them out of its signature (they are read back by prepare_trtllm_build)."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        click.get_current_context().meta[META_KEY] = {n: kwargs.pop(n) for n in _NAMES}
        return func(*args, **kwargs)
    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


@dataclass
class TrtllmBuild:
    options: TrtllmBuildOptions
    sink_tokens: int = 0
    recent_tokens: int = 1
    per_layer: bool = False

    def build(self, output, family, checkpoint, loaded, table) -> dict:
        from .builder import build_trtllm_engine

        return build_trtllm_engine(output, family, checkpoint, loaded, table, self.options)


def prepare_trtllm_build(ctx: click.Context, family: str) -> TrtllmBuild:
    """Everything checked before the model loads: TensorRT-LLM present, a Llama, and the calibration
    options the plugin can serve (defaults switched to them; explicit contrary values refused)."""
    require_tensorrt_llm("tq-build --backend trtllm")
    if family != "llama":
        raise TQError(f"--backend trtllm builds TensorRT-LLM's Llama; --model {family} is not supported on it")
    values = ctx.meta.get(META_KEY, {})
    for name, needed, why in _PLUGIN_NEEDS:
        given = ctx.params.get(name)
        if ctx.get_parameter_source(name) != ParameterSource.DEFAULT and given != needed:
            flag = ("--per-layer" if name == "per_layer" else "--" + name.replace("_", "-"))
            raise click.UsageError(f"{flag} cannot be used with --backend trtllm: {why}")
    from .builder import TrtllmBuildOptions

    options = TrtllmBuildOptions(tp_size=values.get("tp_size", 1), max_batch_size=values.get("max_batch_size", 8),
                                 max_seq_len=values.get("max_seq_len", 4096),
                                 tokens_per_block=values.get("tokens_per_block", 64),
                                 dtype=values.get("trtllm_dtype", "float16"))
    if options.tokens_per_block % 16:
        raise click.UsageError(f"--tokens-per-block {options.tokens_per_block} must be a multiple of 16")
    from .builder import check_model, read_config

    check_model(read_config(ctx.params.get("checkpoint")), options)  # heads, head_dim, RoPE: before calibrating
    return TrtllmBuild(options)
