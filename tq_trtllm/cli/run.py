"""tq-run: generate text with an engine's quantized KV cache."""

from __future__ import annotations

import json

import click

from ..core.errors import TQError
from ..trtllm.cli_backend import backend_option, run_trtllm
from .common import check_device, clean_errors, device_option, place_model


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
@device_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@backend_option(run_trtllm)
@clean_errors
def main(engine_dir, prompt, max_new_tokens, chat, device, as_json):
    if not prompt.strip():
        raise TQError("the prompt is empty")
    check_device(device)
    import torch

    from ..engine import open_engine
    from ..integrations.attention import use_turboquant_attention
    from ..integrations.cache import TurboQuantCache

    engine = open_engine(engine_dir)  # the manifest and tables checked before the model loads
    loaded = engine.loaded
    on_gpu = place_model(loaded.model, device)
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
              **fp16_rows(engine.table, cache.get_seq_length()),
              "backend": "kernels" if on_gpu else "reference"}
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(text)
    click.echo("\n" + kv_bytes_text(result))


def fp16_rows(table, tokens: int) -> dict:
    """What a sequence of `tokens` keeps in fp16 beside the pages (its sink tokens and the recent
    window's rows, which the pages hold too), and the cache's size ratio to FP16 once the sequence
    is long enough for each further token to cost its packed bytes alone (the steady state)."""
    sinks = min(tokens, table.sink_tokens)
    recent = min(tokens - sinks, table.recent_tokens - 1)
    per_fp16_token = len(table.layers) * table.kv_heads * table.fp16_token_bytes()
    long = table.sink_tokens + table.recent_tokens
    return {"fp16_rows": {"sink": sinks, "recent": recent,
                          "bytes": (sinks + recent) * per_fp16_token},
            "steady_state_ratio": per_fp16_token / (table.cache_bytes(long + 1) - table.cache_bytes(long))}


def kv_bytes_text(r: dict) -> str:
    rows = r["fp16_rows"]
    lines = [f"KV cache: {r['kv_bytes']:,} bytes for {r['cached_tokens']} tokens; an FP16 cache would "
             f"hold {r['kv_bytes_fp16']:,} bytes ({r['kv_bytes_fp16'] / max(r['kv_bytes'], 1):.2f}x "
             "larger)."]
    if rows["bytes"]:
        share = rows["bytes"] / max(r["kv_bytes"], 1)
        lines.append(f"  {rows['sink']} sink and {rows['recent']} recent tokens stay in FP16 beside the "
                     f"pages ({rows['bytes']:,} bytes, {share:.0%} of the cache), so a short sequence "
                     "compresses less;")
    lines.append(f"  each further token is {r['steady_state_ratio']:.2f}x smaller than in FP16 (the "
                 "steady-state ratio of long sequences).")
    return "\n".join(lines)
