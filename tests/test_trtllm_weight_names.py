"""The Hugging Face -> TensorRT-LLM 1.2 Llama weight names (tq_trtllm/trtllm/weight_names.py) over a
real transformers Llama's state dict, and the attention parameters the replacement keeps."""

import pytest
import torch

from tq_trtllm.trtllm.weight_names import KEPT_ATTENTION_MODULES, attention_parameter_names, trtllm_name


@pytest.fixture(scope="module")
def hf_names():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                         num_hidden_layers=3, vocab_size=128, tie_word_embeddings=False)
    return list(LlamaForCausalLM(config).state_dict())


def test_every_llama_weight_has_a_trtllm_name(hf_names):
    names = {n: trtllm_name(n) for n in hf_names}
    assert all(names.values()), [n for n, t in names.items() if t is None]
    # q, k and v go into one fused qkv per layer; every other weight has its own name
    fused = [t for t in names.values() if t.endswith("attention.qkv.weight")]
    assert len(fused) == 3 * 3 and len(set(fused)) == 3
    others = [t for t in names.values() if not t.endswith("attention.qkv.weight")]
    assert len(set(others)) == len(others)


def test_the_replacement_keeps_every_attention_parameter_the_loader_fills(hf_names):
    for layer in range(3):
        filled = sorted({trtllm_name(n) for n in hf_names if f".layers.{layer}.self_attn." in n})
        assert filled == sorted(attention_parameter_names(layer))
    assert KEPT_ATTENTION_MODULES == ("qkv", "dense")


def test_unknown_names_map_to_none():
    assert trtllm_name("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    assert trtllm_name("vision_tower.weight") is None
