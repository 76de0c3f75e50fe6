"""The 'turboquant' attention implementation for transformers models.

The model calls `cache.update` first (TurboQuantCache quantizes the new tokens into its pages and
returns its exact sink tokens, tagged with the layer) and then this function, which reads the
packed tokens in place (packed_attention) when the mask is the plain causal one, and otherwise (a
padded batch) attends densely over the cache read back, under the same rule (each token's most
recent positions exact, `layer.exact_recent`). Keys tagged `tq_exact` = (k, v, recent), the step's
rows as computed and how many recent positions each query reads from them (the evaluation's
reference caches, the calibration's sensitivity pass), get that rule on their dense keys too.
Untagged keys and values (no cache, or another cache) go to transformers' SDPA attention. It is
also where calibration observes post-RoPE queries, keys and values, through `observe`.
"""

from __future__ import annotations

from contextlib import contextmanager

ATTENTION_NAME = "turboquant"
# how a step's rows read the step's other positions: as computed, or through the cache
CHUNK_READS = ("exact", "cache")
_observers: list = []


def turboquant_attention(module, query, key, value, attention_mask, **kwargs):
    """query [B, Hq, T, d]; key, value [B, Hkv, S, d] as the cache returned them."""
    for observer in _observers:
        observer(module.layer_idx, query, key, value)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from .packed_attention import attend, dense_attention, is_bottom_right_causal

    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    layer = getattr(key, "tq_layer", None)
    if layer is not None:
        if is_bottom_right_causal(attention_mask, query.shape[2], layer.length):
            return attend(layer, query, scaling), None
        key, value = layer.read_dense()
        return dense_attention(query, key, value, layer.exact, attention_mask, scaling,
                               layer.exact_recent, layer.packed_logit_bias()), None
    exact = getattr(key, "tq_exact", None)
    if exact is not None:
        *rows, recent = exact
        return dense_attention(query, key, value, tuple(rows), attention_mask, scaling, recent), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> None:
    """Register the attention function and its mask (the sdpa mask) with transformers; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, turboquant_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_turboquant_attention(model) -> None:
    register()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION_NAME)
    else:
        model.config._attn_implementation = ATTENTION_NAME


@contextmanager
def observe(callback):
    """Call callback(layer_idx, query, key, value) on every attention call inside the block."""
    _observers.append(callback)
    try:
        yield
    finally:
        _observers.remove(callback)
