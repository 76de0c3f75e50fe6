"""TensorRT-LLM's engine config.json for a QuantizedAttention engine: what the build sets, and the
packed head size written into it after the build.

TensorRT-LLM 1.2's runtime sizes a KV block as num_kv_heads x head_size x tokens_per_block x
sizeof(kv dtype), reading head_size from pretrained_config (GptJsonConfig, no check against
hidden_size / heads). The engine keeps the model dtype (2 bytes) as its KV dtype, so
head_size = packed bytes per token / 2 makes a block exactly one packed chunk (docs/PLUGIN.md
section 5). The model definition itself uses head_size for the QKV split and RoPE, so the build
runs with the true head_dim and the packed value replaces it only in the written config.json.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..calibration.table import KVTable
from ..core.errors import TQError
from ..core.spec import CodecSpec, check_tokens_per_block

KV_DTYPE_BYTES = {"float16": 2, "bfloat16": 2}
SPEC_DECODING_NONE = 1  # SpeculativeDecodingMode.NONE (IntFlag, first member) as build_config stores it


def layer_bytes_per_token(table: KVTable, layer: int) -> int:
    """The packed bytes per token of a layer's pages: the wider of K and V (the plugin's
    poolHeadSizeBytes)."""
    t = table.layers[layer]
    return max(CodecSpec(table.head_dim, t.key_width).bytes_per_token,
               CodecSpec(table.head_dim, t.value_width).bytes_per_token)


def packed_head_size(table: KVTable) -> int:
    """head_size for config.json: the packed bytes per token, rounded up to even, over 2.

    TensorRT-LLM 1.2 sizes every layer's blocks alike, while each layer's plugin addresses its
    chunks by its own widths; layers whose pages differ in size would read each other's bytes,
    so such a table is refused."""
    sizes = {layer_bytes_per_token(table, i) for i in range(len(table.layers))}
    if len(sizes) != 1:
        raise TQError(f"the table's layers have pages of {sorted(sizes)} bytes per token; a TensorRT-LLM "
                      "engine needs one page size for all layers: build with --uniform widths")
    bpt = sizes.pop()
    return (bpt + bpt % 2) // 2


def block_bytes(num_kv_heads: int, head_size: int, tokens_per_block: int, dtype: str) -> int:
    """One block's K (or V) part of one layer as TensorRT-LLM 1.2 allocates it."""
    return num_kv_heads * head_size * tokens_per_block * KV_DTYPE_BYTES[dtype]


def plugin_config_options(dtype: str, tokens_per_block: int) -> dict:
    """PluginConfig attributes the build sets. gpt_attention_plugin, paged_kv_cache and
    remove_input_padding must be on: the runtime's supportsInflightBatching reads them from
    config.json and prepare_inputs creates the paged-KV inputs (which the plugin consumes) only then."""
    if dtype not in KV_DTYPE_BYTES:
        raise TQError(f"dtype {dtype} is not supported for a TensorRT-LLM engine; use float16 or bfloat16")
    check_tokens_per_block(tokens_per_block)
    return {"gpt_attention_plugin": dtype, "paged_kv_cache": True, "remove_input_padding": True,
            "tokens_per_block": tokens_per_block, "lora_plugin": None}


def build_config_options(max_batch_size: int, max_seq_len: int, max_num_tokens: int | None = None,
                         gather_logits: bool = False) -> dict:
    """BuildConfig arguments: beam width 1, no speculative decoding (the plugin takes one query
    token per generation request), optionally every logit gathered (trtllm-check compares them)."""
    if max_batch_size < 1 or max_seq_len < 2:
        raise TQError("--max-batch-size must be at least 1 and --max-seq-len at least 2")
    return {"max_batch_size": max_batch_size, "max_seq_len": max_seq_len, "max_input_len": max_seq_len - 1,
            "max_num_tokens": max_num_tokens or max_batch_size * max_seq_len, "max_beam_width": 1,
            "max_draft_len": 0, "gather_context_logits": gather_logits,
            "gather_generation_logits": gather_logits}


def check_engine_config(config: dict) -> None:
    """Refuse a written config.json that the plugin cannot serve, naming the setting."""
    try:
        pretrained, build = config["pretrained_config"], config["build_config"]
        plugins = build["plugin_config"]
    except (KeyError, TypeError):
        raise TQError("the engine's config.json has no pretrained_config / build_config.plugin_config; "
                      "it was not written by TensorRT-LLM 1.2's builder") from None
    for key in ("gpt_attention_plugin",):
        if plugins.get(key) in (None, False):
            raise TQError(f"the engine's plugin_config.{key} is off; the runtime would not bind the paged KV inputs")
    for key in ("paged_kv_cache", "remove_input_padding"):
        if plugins.get(key) is not True:
            raise TQError(f"the engine's plugin_config.{key} must be true for in-flight batching over the paged pool")
    if plugins.get("lora_plugin") is not None or (build.get("lora_config") or {}).get("lora_target_modules"):
        raise TQError("LoRA is not supported: TensorRT-LLM sizes LoRA modules from head_size, which holds "
                      "the packed page size in this engine")
    if build.get("speculative_decoding_mode", SPEC_DECODING_NONE) not in (None, SPEC_DECODING_NONE) \
            or build.get("max_draft_len", 0):
        raise TQError("speculative decoding is not supported: the plugin takes one query token per "
                      "generation request and the draft-token rewind moves rows of head_size bytes")
    if build.get("max_beam_width", 1) != 1:
        raise TQError("beam search is not supported: build with max_beam_width 1")
    if (pretrained.get("quantization") or {}).get("kv_cache_quant_algo") is not None:
        raise TQError("the engine declares a quantized KV cache; this engine keeps the model dtype as its "
                      "KV dtype (declaring INT8 would switch paged context FMHA and block reuse off)")
    if pretrained.get("dtype") not in KV_DTYPE_BYTES:
        raise TQError(f"the engine's dtype {pretrained.get('dtype')!r} is not float16 or bfloat16")


def finalize_engine_config(config: dict, head_size: int) -> dict:
    """The config.json to ship: checked, with the packed head size; the true head_dim stays in
    the plugin's fields (and rotary_embedding_dim)."""
    check_engine_config(config)
    out = json.loads(json.dumps(config))
    out["pretrained_config"]["head_size"] = int(head_size)
    return out


def write_json(path: Path, data: dict) -> None:
    """Write JSON through a temporary file renamed into place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=4)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
