"""The engine config.json that tq-build --backend trtllm ships (tq_trtllm/trtllm/engine_config.py),
read the way TensorRT-LLM 1.2's GptJsonConfig reads it: the keys and rules are in
tests/fixtures/trtllm_1.2_engine_config.json, which cites the source it was derived from."""

import copy
import json
from pathlib import Path

import pytest

from tq_trtllm.calibration.table import oblivious_table
from tq_trtllm.core.errors import TQError
from tq_trtllm.core.spec import CodecSpec
from tq_trtllm.trtllm.engine_config import (block_bytes, build_config_options, finalize_engine_config,
                                            packed_head_size, plugin_config_options, write_json)

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "trtllm_1.2_engine_config.json").read_text())
WRITTEN = FIXTURE["engine_config_as_written_by_the_1.2_builder"]
FP = {"family": "llama", "layers": 2, "heads": 8, "kv_heads": 4, "head_dim": 128, "config_hash": "0123456789abcdef"}


def _get(config: dict, path: list[str]):
    for key in path:
        config = config[key]
    return config


def runtime_view(config: dict) -> dict:
    """What GptJsonConfig takes from config.json (the fixture's rules), or KeyError where a key it
    requires is missing."""
    for path in FIXTURE["required"]:
        _get(config, path)
    pre, build = config["pretrained_config"], config["build_config"]
    plugins = build["plugin_config"]
    tp, cp = pre["mapping"]["tp_size"], pre["mapping"].get("cp_size", 1)
    heads = pre["num_attention_heads"] // (tp * cp)
    return {"size_per_head": pre.get("head_size", pre["hidden_size"] // tp // heads),
            "num_kv_heads": max(pre.get("num_key_value_heads", heads * tp * cp) // (tp * cp), 1),
            "gpt_attention_plugin": plugins["gpt_attention_plugin"] is not None,
            "paged": bool(plugins["paged_kv_cache"]), "packed_input": plugins["remove_input_padding"],
            "max_num_tokens": build.get("max_num_tokens"),
            "lora": plugins["lora_plugin"] is not None and bool(build["lora_config"].get("lora_target_modules")),
            "spec_decoding": build.get("speculative_decoding_mode") not in (None, 1)}


def test_the_shipped_config_gives_the_runtime_one_packed_chunk_per_block():
    table = oblivious_table(FP, 3.0, 3.0)
    head_size = packed_head_size(table)
    assert head_size == 25  # 3-bit K and V at head_dim 128: 50 packed bytes per token
    out = finalize_engine_config(WRITTEN, head_size)
    view = runtime_view(out)
    assert view["size_per_head"] == 25 and view["num_kv_heads"] == 2
    assert view["gpt_attention_plugin"] and view["paged"] and view["packed_input"] and view["max_num_tokens"]
    assert not view["lora"] and not view["spec_decoding"]
    bpt = CodecSpec(128, 3.0).bytes_per_token
    assert block_bytes(view["num_kv_heads"], view["size_per_head"], 32, "float16") == view["num_kv_heads"] * bpt * 32
    # only head_size changed; the builder's own config is left as written
    changed = copy.deepcopy(out)
    changed["pretrained_config"]["head_size"] = WRITTEN["pretrained_config"]["head_size"]
    assert changed == WRITTEN


@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_width_gives_a_block_of_exactly_the_packed_bytes(head_dim):
    """Packed rows are an even number of bytes at every width, so the 2-byte head_size loses none."""
    from tq_trtllm.core.spec import SUPPORTED_WIDTHS

    for width in SUPPORTED_WIDTHS:
        table = oblivious_table({**FP, "head_dim": head_dim}, width, width)
        assert 2 * packed_head_size(table) == CodecSpec(head_dim, width).bytes_per_token, width


def test_layers_with_different_page_sizes_are_refused():
    table = oblivious_table(FP, 3.0, 3.0)
    table.layers[1].key_width = 4.0
    with pytest.raises(TQError, match="--uniform"):
        packed_head_size(table)


@pytest.mark.parametrize("path, value, message", [
    (("build_config", "plugin_config", "lora_plugin"), "float16", "LoRA"),
    (("build_config", "speculative_decoding_mode"), 2, "speculative decoding"),
    (("build_config", "max_draft_len"), 4, "speculative decoding"),
    (("build_config", "plugin_config", "gpt_attention_plugin"), None, "gpt_attention_plugin"),
    (("build_config", "plugin_config", "paged_kv_cache"), False, "paged_kv_cache"),
    (("build_config", "plugin_config", "remove_input_padding"), False, "remove_input_padding"),
    (("pretrained_config", "quantization", "kv_cache_quant_algo"), "INT8", "quantized KV"),
    (("build_config", "max_beam_width"), 4, "beam"),
    (("pretrained_config", "dtype"), "float32", "dtype"),
])
def test_configs_the_plugin_cannot_serve_are_refused(path, value, message):
    config = copy.deepcopy(WRITTEN)
    _get(config, path[:-1])[path[-1]] = value
    with pytest.raises(TQError, match=message):
        finalize_engine_config(config, 25)


def test_lora_targets_are_refused_too():
    config = copy.deepcopy(WRITTEN)
    config["build_config"]["lora_config"]["lora_target_modules"] = ["attn_qkv"]
    with pytest.raises(TQError, match="LoRA"):
        finalize_engine_config(config, 25)


def test_build_options_keep_the_inputs_the_plugin_consumes():
    opts = plugin_config_options("bfloat16", 64)
    assert opts["gpt_attention_plugin"] == "bfloat16" and opts["paged_kv_cache"] and opts["remove_input_padding"]
    assert opts["lora_plugin"] is None
    build = build_config_options(4, 1024)
    assert build["max_beam_width"] == 1 and build["max_draft_len"] == 0 and build["max_num_tokens"] == 4096
    with pytest.raises(TQError, match="float16 or bfloat16"):
        plugin_config_options("float32", 64)
    with pytest.raises(TQError, match="multiple of 16"):
        plugin_config_options("float16", 40)


def test_write_json_replaces_atomically(tmp_path):
    path = tmp_path / "config.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2} and [p.name for p in tmp_path.iterdir()] == ["config.json"]
