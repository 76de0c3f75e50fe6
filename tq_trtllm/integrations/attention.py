"""The 'turboquant' attention implementation for transformers models.

The model calls `cache.update` first (TurboQuantCache quantizes the new tokens into its pages and
returns the keys and values read back from them) and then this function. It is also where
calibration observes post-RoPE queries, keys and values, through `observe`.
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
