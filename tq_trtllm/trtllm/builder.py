"""tq-build --backend trtllm: TensorRT-LLM 1.2's Llama, converted by its own loader rank by rank,
each decoder layer's attention replaced by the QuantizedAttention plugin with that rank's tables,
built with TensorRT-LLM's builder into an engine directory (engine_dir.py)."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..calibration.table import KVTable
from ..core.errors import TQError
from ..engine import MANIFEST, write_engine
from .engine_config import (build_config_options, finalize_engine_config, packed_head_size,
                            plugin_config_options, write_json)
from .engine_dir import CONFIG, TOKENIZER_DIR, rank_engine_name
from .plugin_libraries import DYNAMIC, ENGINE_LIB_DIR, copy_libraries, find_library, register_with_tensorrt
from .rank_tables import rank_heads, rank_table
from .requirement import installed_version, require_tensorrt_llm


@dataclass
class TrtllmBuildOptions:
    tp_size: int = 1
    max_batch_size: int = 8
    max_seq_len: int = 4096
    tokens_per_block: int = 64
    dtype: str = "float16"
    gather_logits: bool = False  # every context and generation logit as an output (trtllm-check)


def write_hf_directory(loaded, directory: Path) -> Path:
    """A Hugging Face directory (config, safetensors, tokenizer) from a loaded model: what
    TensorRT-LLM's from_hugging_face reads when the checkpoint is a GGUF file."""
    directory.mkdir(parents=True, exist_ok=True)
    loaded.model.save_pretrained(directory, safe_serialization=True)
    loaded.tokenizer.save_pretrained(directory)
    return directory


PLUGIN_HEAD_DIMS = (64, 128)
MAX_GQA_GROUP = 8  # query heads per KV head the kernels take (docs/PLUGIN.md, fields)


def check_model(hf_config, opts: TrtllmBuildOptions) -> None:
    """What the plugin and the rank split need, before anything is calibrated or built."""
    from ..models.fingerprint import head_dim_of
    from .attention_patch import rope_field_args

    rank_heads(hf_config.num_attention_heads, hf_config.num_key_value_heads, opts.tp_size, 0)
    if head_dim_of(hf_config) not in PLUGIN_HEAD_DIMS:
        raise TQError(f"head_dim {head_dim_of(hf_config)} is not supported by the QuantizedAttention plugin "
                      f"(it takes {' or '.join(map(str, PLUGIN_HEAD_DIMS))})")
    group = hf_config.num_attention_heads // hf_config.num_key_value_heads
    if hf_config.num_attention_heads % hf_config.num_key_value_heads or not 1 <= group <= MAX_GQA_GROUP:
        raise TQError(f"{hf_config.num_attention_heads} query heads over {hf_config.num_key_value_heads} KV heads: "
                      f"the QuantizedAttention plugin takes 1 to {MAX_GQA_GROUP} query heads per KV head")
    if getattr(hf_config, "attention_bias", False):
        raise TQError("attention with a qkv bias is not supported by the TensorRT-LLM path")
    rope_field_args(hf_config)


def read_config(checkpoint: str | None):
    """The checkpoint's Hugging Face config alone (no weights), for the checks before calibration."""
    from ..models.checkpoint import load_part

    return load_part("AutoConfig", checkpoint)


def _build_rank(hf_dir: Path, table: KVTable, opts: TrtllmBuildOptions, rank: int, rope_args: dict,
                stage: Path) -> None:
    import tensorrt_llm
    from tensorrt_llm import BuildConfig
    from tensorrt_llm.mapping import Mapping
    from tensorrt_llm.models import LLaMAForCausalLM
    from tensorrt_llm.plugin import PluginConfig

    from .attention_patch import patch_attention

    mapping = Mapping(world_size=opts.tp_size, rank=rank, tp_size=opts.tp_size, pp_size=1)
    model = LLaMAForCausalLM.from_hugging_face(str(hf_dir), dtype=opts.dtype, mapping=mapping)
    patch_attention(model, rank_table(table, opts.tp_size, rank), opts.tokens_per_block, rope_args)
    plugin_config = PluginConfig()
    for name, value in plugin_config_options(opts.dtype, opts.tokens_per_block).items():
        if name == "paged_kv_cache" and not hasattr(plugin_config, name):
            continue  # 1.2 takes it as BuildConfig.kv_cache_type (below)
        setattr(plugin_config, name, value)
    extra = {}
    try:
        from tensorrt_llm.llmapi.kv_cache_type import KVCacheType

        extra["kv_cache_type"] = KVCacheType.PAGED
    except ImportError:
        pass
    build_config = BuildConfig(**build_config_options(opts.max_batch_size, opts.max_seq_len,
                                                      gather_logits=opts.gather_logits),
                               plugin_config=plugin_config, **extra)
    engine = tensorrt_llm.build(model, build_config)
    engine.save(str(stage))
    if not (stage / rank_engine_name(rank)).is_file():
        raise TQError(f"TensorRT-LLM's Engine.save wrote no {rank_engine_name(rank)} in {stage}")


def build_trtllm_engine(output: Path, family: str, checkpoint: str | None, loaded, table: KVTable,
                        opts: TrtllmBuildOptions) -> dict:
    """Build the engine directory `output` (never overwritten; written in a temporary sibling
    directory and renamed into place). Returns the manifest."""
    require_tensorrt_llm("tq-build --backend trtllm")
    from .attention_patch import rope_field_args

    output = Path(output)
    if table.sink_tokens != 0 or table.recent_tokens != 1:
        raise TQError("the QuantizedAttention plugin keeps no fp16 sink or recent rows: build with "
                      "--sink-tokens 0 --recent-tokens 1")
    head_size = packed_head_size(table)
    check_model(loaded.config, opts)
    rope_args = rope_field_args(loaded.config)
    register_with_tensorrt(find_library(DYNAMIC))
    output.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{output.name}.trtllm-", dir=output.parent))
    try:
        stage = work / "engine"
        write_engine(stage, family, checkpoint, "trtllm", table)  # manifest + tables, atomically
        ckpt = Path(checkpoint) if checkpoint else None
        hf_dir = ckpt if ckpt is not None and ckpt.is_dir() else write_hf_directory(loaded, work / "hf")
        for rank in range(opts.tp_size):
            _build_rank(hf_dir, table, opts, rank, rope_args, stage)
        config = json.loads((stage / CONFIG).read_text())
        write_json(stage / CONFIG, finalize_engine_config(config, head_size))
        copy_libraries(stage / ENGINE_LIB_DIR)
        loaded.tokenizer.save_pretrained(stage / TOKENIZER_DIR)
        manifest = json.loads((stage / MANIFEST).read_text())
        manifest["trtllm"] = {
            "tensorrt_llm_version": installed_version(), "tp_size": opts.tp_size,
            "engines": [rank_engine_name(r) for r in range(opts.tp_size)], "config": CONFIG,
            "head_dim": table.head_dim, "head_size": head_size, "dtype": opts.dtype,
            "tokens_per_block": opts.tokens_per_block, "max_batch_size": opts.max_batch_size,
            "max_seq_len": opts.max_seq_len, "libraries": ENGINE_LIB_DIR, "tokenizer": TOKENIZER_DIR,
            "block_reuse": False, "partial_reuse": False, "speculative_decoding": False,
            "cuda_graphs": False}
        write_json(stage / MANIFEST, manifest)
        if output.exists():
            raise TQError(f"output {output} already exists; remove it or choose another --output")
        stage.rename(output)
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)
