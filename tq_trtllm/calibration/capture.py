"""Running a model over token windows while observing every layer's post-RoPE q, k, v."""

from __future__ import annotations

import torch

from ..models.attention import observe, use_turboquant_attention


def token_windows(tokenizer, text: str, length: int, count: int) -> torch.Tensor:
    """Up to `count` consecutive, non-overlapping windows of `length` tokens: int64 [n, length]."""
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    n = min(count, ids.numel() // length)
    return ids[: n * length].view(n, length)


def run_observed(model, input_ids: torch.Tensor, observer, *, grad: bool = False):
    """One forward pass without a cache, calling observer(layer, q, k, v) in every layer."""
    use_turboquant_attention(model)
    with observe(observer), torch.set_grad_enabled(grad):
        return model(input_ids=input_ids, use_cache=False).logits
