"""The parts of the TensorRT-LLM builder that run without TensorRT-LLM: the plugin's RoPE fields from
a Hugging Face config, the Hugging Face directory written for TensorRT-LLM's loader when the
checkpoint is a GGUF file, and the model checks made before a build."""

import json

import pytest
import torch

from tq_trtllm.core.errors import TQError
from tq_trtllm.trtllm.attention_patch import PLUGIN_INPUTS, rope_field_args
from tq_trtllm.trtllm.builder import TrtllmBuildOptions, check_model, write_hf_directory


def llama_config(**kw):
    from transformers import LlamaConfig

    base = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                num_hidden_layers=2, vocab_size=64, rope_theta=500000.0)
    return LlamaConfig(**{**base, **kw})


def test_rope_fields_follow_the_config():
    assert rope_field_args(llama_config()) == {"rope_base": 500000.0, "rope_scaling": "none"}
    linear = rope_field_args(llama_config(rope_scaling={"rope_type": "linear", "factor": 4.0}))
    assert linear["rope_scaling"] == "linear" and linear["rope_factor"] == 4.0
    llama3 = rope_field_args(llama_config(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}))
    assert llama3 == {"rope_base": 500000.0, "rope_scaling": "llama3", "rope_factor": 8.0,
                      "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
                      "rope_original_max_positions": 8192}
    with pytest.raises(TQError, match="'yarn' is not supported"):
        rope_field_args(llama_config(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 2048}))


def test_the_plugin_takes_gptattentions_paged_inputs_in_the_plugins_order():
    from pathlib import Path

    names = Path(__file__).resolve().parents[1] / "plugin_cpp" / "plugin" / "io_layout.h"
    text = names.read_text()
    order = [text.index(f'"{n}"') for n in PLUGIN_INPUTS[1:]]  # io_layout.h's input name list
    assert order == sorted(order)


def test_a_gguf_model_becomes_a_directory_transformers_reads(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

    from tq_trtllm.models.checkpoint import LoadedModel
    from tq_trtllm.models.registry import get_family
    from tq_trtllm.trtllm.check import tiny_tokenizer

    torch.manual_seed(1)
    model = LlamaForCausalLM(llama_config()).eval()
    loaded = LoadedModel(get_family("llama"), tmp_path / "model.gguf", model, tiny_tokenizer(64))
    out = write_hf_directory(loaded, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    assert AutoConfig.from_pretrained(out).num_key_value_heads == 2
    again = AutoModelForCausalLM.from_pretrained(out)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    assert (out / "tokenizer.json").is_file()


def test_models_the_plugin_cannot_split_or_serve_are_refused():
    check_model(llama_config(), TrtllmBuildOptions(tp_size=2))
    with pytest.raises(TQError, match="does not divide"):
        check_model(llama_config(hidden_size=96, num_attention_heads=6, num_key_value_heads=3), TrtllmBuildOptions(tp_size=2))
    with pytest.raises(TQError, match="bias"):
        check_model(llama_config(attention_bias=True), TrtllmBuildOptions())
    with pytest.raises(TQError, match="1 to 8 query heads per KV head"):
        check_model(llama_config(hidden_size=1024, num_attention_heads=16, num_key_value_heads=1), TrtllmBuildOptions())
    with pytest.raises(TQError, match="head_dim 32"):
        check_model(llama_config(hidden_size=128), TrtllmBuildOptions())
    with pytest.raises(TQError, match="'yarn'"):
        check_model(llama_config(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 2048}), TrtllmBuildOptions())
