"""The 'turboquant' attention function that a transformers model calls, registered through
transformers' AttentionInterface.

It hands every call's post-RoPE queries, keys and values to the callbacks of `observe`
(calibration), then routes by how the cache tagged the keys it returned:
- `tq_layer` = the cache layer (integrations.cache.TurboQuantLayer), which attends over its packed
  pages itself (`layer.attention(query, mask, scaling)`);
- `tq_exact` = (k, v, recent), the step's rows as computed and how many recent positions each query
  reads from them (the evaluation's reference caches, the calibration's sensitivity pass): the
  dense keys under that rule (core.attention.dense_attention);
- untagged keys and values (no cache, or another cache) go to transformers' SDPA attention.
Only the cache knows its layout, so this module imports no cache: calibration uses it without the
runtime above it.
"""

from __future__ import annotations

from contextlib import contextmanager

ATTENTION_NAME = "turboquant"
_observers: list = []


def turboquant_attention(module, query, key, value, attention_mask, **kwargs):
    """query [B, Hq, T, d]; key, value [B, Hkv, S, d] as the cache returned them."""
    for observer in _observers:
        observer(module.layer_idx, query, key, value)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from ..core.attention import dense_attention

    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    layer = getattr(key, "tq_layer", None)
    if layer is not None:
        return layer.attention(query, attention_mask, scaling), None
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
