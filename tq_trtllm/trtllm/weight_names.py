"""How a Hugging Face Llama's weights land in TensorRT-LLM 1.2's Llama, and which of them the
replaced attention must keep.

TensorRT-LLM converts a Llama checkpoint itself (`LLaMAForCausalLM.from_hugging_face`, through
`tensorrt_llm/models/llama/convert.py`); the names below are that conversion's, written out so that
the builder can check that the patched model still has every attention parameter the loader fills,
and so that the head split of the fused qkv weight can be checked against the tables' rank slicing.
"""

from __future__ import annotations

from .rank_tables import RankHeads

# per decoder layer: Hugging Face name -> TensorRT-LLM name ({i} the layer); q, k and v are fused
HF_TO_TRTLLM_LAYER = {
    "model.layers.{i}.self_attn.q_proj.weight": "transformer.layers.{i}.attention.qkv.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "transformer.layers.{i}.attention.qkv.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "transformer.layers.{i}.attention.qkv.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "transformer.layers.{i}.attention.dense.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "transformer.layers.{i}.mlp.fc.weight",
    "model.layers.{i}.mlp.up_proj.weight": "transformer.layers.{i}.mlp.gate.weight",
    "model.layers.{i}.mlp.down_proj.weight": "transformer.layers.{i}.mlp.proj.weight",
    "model.layers.{i}.input_layernorm.weight": "transformer.layers.{i}.input_layernorm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "transformer.layers.{i}.post_layernorm.weight",
}
HF_TO_TRTLLM_MODEL = {
    "model.embed_tokens.weight": "transformer.vocab_embedding.weight",
    "model.norm.weight": "transformer.ln_f.weight",
    "lm_head.weight": "lm_head.weight",
}
# the submodules of TensorRT-LLM's Attention that the QuantizedAttention replacement keeps
KEPT_ATTENTION_MODULES = ("qkv", "dense")


def trtllm_name(hf_name: str) -> str | None:
    """The TensorRT-LLM parameter a Hugging Face Llama weight is converted into (None: not a Llama weight)."""
    if hf_name in HF_TO_TRTLLM_MODEL:
        return HF_TO_TRTLLM_MODEL[hf_name]
    parts = hf_name.split(".")
    if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        pattern = ".".join(parts[:2] + ["{i}"] + parts[3:])
        if pattern in HF_TO_TRTLLM_LAYER:
            return HF_TO_TRTLLM_LAYER[pattern].format(i=int(parts[2]))
    return None


def attention_parameter_names(layer: int, bias: bool = False) -> list[str]:
    """The parameters of layer `layer`'s attention that the loader fills and the replacement keeps."""
    suffixes = ("weight", "bias") if bias else ("weight",)
    return [f"transformer.layers.{layer}.attention.{m}.{s}" for m in KEPT_ATTENTION_MODULES for s in suffixes]


def rank_qkv_rows(heads: RankHeads, num_q_heads: int, num_kv_heads: int, head_dim: int) -> list[int]:
    """Rows of the Hugging Face cat([q_proj, k_proj, v_proj]) weight that the rank's fused qkv
    weight holds, in its order: its query heads' rows, then its KV heads' key rows, then their value
    rows (TensorRT-LLM splits q, k and v by heads and concatenates the rank's parts)."""
    def rows(base: int, head_range: range) -> list[int]:
        return [base + h * head_dim + c for h in head_range for c in range(head_dim)]

    k_base, v_base = num_q_heads * head_dim, (num_q_heads + num_kv_heads) * head_dim
    return rows(0, heads.q_heads) + rows(k_base, heads.kv_heads) + rows(v_base, heads.kv_heads)
