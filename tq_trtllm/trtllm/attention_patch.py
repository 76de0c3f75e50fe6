"""Replacing each decoder layer's attention in TensorRT-LLM 1.2's Llama by the QuantizedAttention
plugin (TensorRT-LLM imported inside the functions only).

The replacement keeps the layer's `qkv` and `dense` linear modules (so the weights TensorRT-LLM's
loader put there stay, under the same names) and puts one IPluginV3 layer between them whose inputs
are the network inputs TensorRT-LLM's runtime binds for GPTAttention in paged mode
(docs/PLUGIN.md section 4): the fused qkv, host_past_key_value_lengths, host_context_lengths,
host_request_types, kv_cache_block_offsets, host_kv_cache_pool_pointers and
host_kv_cache_pool_mapping. TensorRT-LLM declares kv_cache_block_offsets as
[pools, batch x beam, 2, max_blocks] (generation_mixin.prepare_basic_inputs); the plugin takes
[pools, batch, beam 1, 2, max_blocks], so a shuffle inserts the beam axis (no copy).
"""

from __future__ import annotations

import numpy as np

from ..core.errors import TQError
from ..models.fingerprint import rope_of
from ..trt.plugin_fields import (FIELD_TYPES, PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION, layer_table_bytes,
                                 plugin_fields)
from .weight_names import KEPT_ATTENTION_MODULES

# the plugin's inputs in its order (plugin_cpp/plugin/io_layout.h)
PLUGIN_INPUTS = ("qkv", "host_past_key_value_lengths", "host_context_lengths", "host_request_types",
                 "kv_cache_block_offsets", "host_kv_cache_pool_pointers", "host_kv_cache_pool_mapping")


def rope_field_args(hf_config) -> dict:
    """plugin_fields' RoPE arguments from a Hugging Face config (theta, none / linear / llama3)."""
    rope = rope_of(hf_config)
    scaling = dict(rope["scaling"] or {})
    kind = scaling.get("rope_type", scaling.get("type", "none")) or "none"
    args = {"rope_base": float(rope["theta"] or 10000.0)}
    if kind in ("none", "default"):
        return {**args, "rope_scaling": "none"}
    if kind == "linear":
        return {**args, "rope_scaling": "linear", "rope_factor": float(scaling["factor"])}
    if kind == "llama3":
        return {**args, "rope_scaling": "llama3", "rope_factor": float(scaling["factor"]),
                "rope_low_freq_factor": float(scaling["low_freq_factor"]),
                "rope_high_freq_factor": float(scaling["high_freq_factor"]),
                "rope_original_max_positions": int(scaling["original_max_position_embeddings"])}
    raise TQError(f"RoPE scaling {kind!r} is not supported by the QuantizedAttention plugin "
                  "(none, linear and llama3 are)")


def layer_fields(table, layer: int, tokens_per_block: int, rope_args: dict) -> dict:
    """The plugin fields of one layer of a (rank's) calibration table: its layer table, with the
    heads of that rank, and the block size and RoPE."""
    fp = table.fingerprint
    blob = layer_table_bytes(table, layer, num_q_heads=int(fp["heads"]), num_kv_heads=int(fp["kv_heads"]),
                             fingerprint=int(fp["config_hash"], 16))
    return plugin_fields(blob, tokens_per_block=tokens_per_block, **rope_args)


def _tensorrt(trt):
    if trt is None:
        import tensorrt as trt
    return trt


def plugin_field_collection(fields: dict, trt=None):
    """PluginFieldCollection of plugin_fields' arrays (the layer table as kUNKNOWN bytes); `trt`: the
    TensorRT Python module (default: tensorrt, TensorRT-LLM's)."""
    trt = _tensorrt(trt)
    return trt.PluginFieldCollection([
        trt.PluginField(name, np.ascontiguousarray(value), getattr(trt.PluginFieldType, FIELD_TYPES[value.dtype]))
        for name, value in fields.items()])


def create_plugin(name: str, fields: dict, trt=None, registry=None):
    """The plugin object for one layer, created for the build phase from `fields`."""
    trt = _tensorrt(trt)
    registry = registry or trt.get_plugin_registry()
    creator = registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    if creator is None:
        raise TQError("the QuantizedAttention plugin is not registered with TensorRT; load "
                      "libtq_attention_plugin.so first (plugin_libraries.register_with_tensorrt)")
    plugin = creator.create_plugin(name, plugin_field_collection(fields, trt), trt.TensorRTPhase.BUILD)
    if plugin is None:
        raise TQError(f"the QuantizedAttention plugin refused the fields of {name} (TensorRT's log names the field)")
    return plugin


def _attention_class():
    from tensorrt_llm._common import default_trtnet
    from tensorrt_llm.functional import _create_tensor, unsqueeze
    from tensorrt_llm.module import Module

    class QuantizedAttention(Module):
        """qkv -> QuantizedAttention plugin (paged packed KV) -> dense."""

        def __init__(self, attention, fields: dict, name: str):
            super().__init__()
            for module in KEPT_ATTENTION_MODULES:
                setattr(self, module, getattr(attention, module))
            self.plugin_fields = fields
            self.plugin_layer_name = name

        def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                    attention_params=None, lora_layer_params=None, spec_decoding_params=None,
                    all_reduce_params=None, **_):
            if lora_layer_params is not None:
                raise TQError("LoRA is not supported by the QuantizedAttention engine")
            if spec_decoding_params is not None:
                raise TQError("speculative decoding is not supported by the QuantizedAttention engine")
            if kv_cache_params is None or kv_cache_params.kv_cache_block_offsets is None:
                raise TQError("the QuantizedAttention engine needs the paged KV cache inputs "
                              "(plugin_config.paged_kv_cache and gpt_attention_plugin on)")
            qkv = self.qkv(hidden_states)
            tensors = {"qkv": qkv,
                       "host_past_key_value_lengths": kv_cache_params.host_past_key_value_lengths,
                       "host_context_lengths": attention_params.host_context_lengths,
                       "host_request_types": attention_params.host_request_types,
                       # [pools, batch, 2, max_blocks] -> [pools, batch, beam 1, 2, max_blocks]
                       "kv_cache_block_offsets": unsqueeze(kv_cache_params.kv_cache_block_offsets, 2),
                       "host_kv_cache_pool_pointers": kv_cache_params.host_kv_cache_pool_pointers,
                       "host_kv_cache_pool_mapping": kv_cache_params.host_kv_cache_pool_mapping}
            plugin = create_plugin(self.plugin_layer_name, self.plugin_fields)
            layer = default_trtnet().add_plugin_v3([tensors[n].trt_tensor for n in PLUGIN_INPUTS], [], plugin)
            layer.name = self.plugin_layer_name
            context = _create_tensor(layer.get_output(0), layer)
            output = self.dense(context, all_reduce_params=all_reduce_params)
            if use_cache:
                past = kv_cache_params.past_key_value[0] if kv_cache_params.past_key_value else None
                return output, past
            return output

    return QuantizedAttention


def patch_attention(model, table, tokens_per_block: int, rope_args: dict) -> int:
    """Replace every decoder layer's attention of `model` (a TensorRT-LLM LLaMAForCausalLM of one
    rank, pipeline parallelism 1) by QuantizedAttention with `table` (that rank's slice). Returns the
    number of layers patched."""
    cls = _attention_class()
    layers = list(model.transformer.layers)
    if len(layers) != len(table.layers):
        raise TQError(f"the TensorRT-LLM model has {len(layers)} decoder layers but the table {len(table.layers)}")
    for i, layer in enumerate(layers):
        old = layer.attention
        for module in KEPT_ATTENTION_MODULES:
            if not hasattr(old, module):
                raise TQError(f"layer {i}'s attention has no '{module}' module; this TensorRT-LLM's Llama is "
                              "not the 1.2 layout")
        layer.attention = cls(old, layer_fields(table, i, tokens_per_block, rope_args),
                              f"tq_quantized_attention_{i}")
    return len(layers)
