"""tq-run: generate text with an engine's quantized KV cache."""

from __future__ import annotations

import json

import click

from ..core.errors import TQError
from .common import clean_errors


def prompt_ids(tokenizer, prompt: str, chat: bool):
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    return tokenizer(prompt, return_tensors="pt")["input_ids"]


@click.command(help="Generate with an engine's TurboQuant KV cache; prints the text and the KV bytes.")
@click.option("--engine", "engine_dir", type=click.Path(), required=True, help="Engine directory (tq-build).")
@click.option("--prompt", required=True, help="Prompt text.")
@click.option("--max-new-tokens", type=click.IntRange(1, 8192), default=64, show_default=True)
@click.option("--chat/--no-chat", default=True, show_default=True,
              help="Wrap the prompt in the tokenizer's chat template when it has one.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="cuda: the model in bfloat16 on the GPU, the cache on the kernel library; cpu: "
                   "float32 on the Python reference; auto: cuda where the kernels can run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@clean_errors
def main(engine_dir, prompt, max_new_tokens, chat, device, as_json):
    if not prompt.strip():
        raise TQError("the prompt is empty")
    import torch

    from .. import kernels
    from ..engine import open_engine
    from ..integrations.attention import use_turboquant_attention
    from ..integrations.cache import TurboQuantCache

    why_not = kernels.unavailable_reason()
    if device == "cuda" and why_not:
        raise TQError(f"--device cuda cannot run here: {why_not}")
    on_gpu = device == "cuda" or (device == "auto" and why_not is None)
    engine = open_engine(engine_dir)
    loaded = engine.loaded
    if on_gpu:
        loaded.model.to("cuda", torch.bfloat16)
    ids = prompt_ids(loaded.tokenizer, prompt, chat).to(loaded.model.device)
    if ids.shape[1] + max_new_tokens > loaded.max_context:
        raise TQError(f"the prompt has {ids.shape[1]} tokens; with {max_new_tokens} new tokens that "
                      f"exceeds the model's context of {loaded.max_context} tokens")
    use_turboquant_attention(loaded.model)
    cache = TurboQuantCache(engine.table, backend="kernels" if on_gpu else "reference")
    with torch.inference_mode():
        out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                    max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=loaded.tokenizer.eos_token_id)
    text = loaded.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    result = {"text": text, "prompt_tokens": int(ids.shape[1]),
              "new_tokens": int(out.shape[1] - ids.shape[1]), "cached_tokens": cache.get_seq_length(),
              "kv_bytes": cache.stored_bytes(), "kv_bytes_fp16": cache.fp16_bytes(),
              "backend": "kernels" if on_gpu else "reference"}
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(text)
    click.echo(f"\nKV cache: {result['kv_bytes']:,} bytes for {result['cached_tokens']} tokens; an FP16 "
               f"cache would hold {result['kv_bytes_fp16']:,} bytes "
               f"({result['kv_bytes_fp16'] / max(result['kv_bytes'], 1):.2f}x larger)")
