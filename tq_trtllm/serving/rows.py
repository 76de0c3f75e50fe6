"""One batched forward over sequences that each keep their own cache.

A decode step runs the model once on [B, 1] tokens (the embedding, projections, MLPs and LM head
batched); RowsCache hands each row's new key and value to that sequence's own cache (a
TurboQuantCache or, for the FP16 baseline, a DynamicCache), and the "turboquant_rows" attention
function attends each row over what its cache returned, through integrations.attention's function
(the packed pages read in place, or SDPA over an FP16 cache's keys). Each row's attention is then
the same computation as a batch-1 step of tq-run.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ..integrations.attention import turboquant_attention

ROWS_ATTENTION = "turboquant_rows"


class RowsLayer(DynamicLayer):
    """Layer `index` of every row's cache."""

    def __init__(self, index: int, caches: list):
        super().__init__()
        self.index, self.caches = index, caches
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """key_states, value_states [B, H, 1, d]: row b goes to caches[b]. Returns a placeholder
        tagged with each row's (key, value) as its cache returned them."""
        rows = [cache.update(key_states[b:b + 1], value_states[b:b + 1], self.index)
                for b, cache in enumerate(self.caches)]
        tagged = key_states[:, :, :0]
        tagged.tq_rows = rows
        return tagged, value_states[:, :, :0]

    def get_seq_length(self, *args) -> int:
        return max(cache.get_seq_length() for cache in self.caches)

    def get_mask_sizes(self, query, *args) -> tuple[int, int]:
        query_length = query if isinstance(query, int) else query.shape[0]
        return self.get_seq_length() + query_length, 0


class RowsCache(Cache):
    """The caches of the sequences in one decode step, row b = caches[b]."""

    def __init__(self, caches: list, num_layers: int):
        super().__init__(layers=[RowsLayer(i, caches) for i in range(num_layers)])


def rows_attention(module, query, key, value, attention_mask, **kwargs):
    """Per-row attention for RowsCache's placeholder keys; anything else (a prefill over one
    sequence's own cache) goes to integrations.attention's function unchanged."""
    rows = getattr(key, "tq_rows", None)
    if rows is None:
        return turboquant_attention(module, query, key, value, attention_mask, **kwargs)
    outs = [turboquant_attention(module, query[b:b + 1], k, v, None, **kwargs)[0]
            for b, (k, v) in enumerate(rows)]
    return torch.cat(outs), None


def use_rows_attention(model) -> None:
    """Register the function (without a mask function: every row's attention is bottom-right
    causal over its own cache, so transformers builds no mask) and select it for the model."""
    from transformers import AttentionInterface

    AttentionInterface.register(ROWS_ATTENTION, rows_attention)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ROWS_ATTENTION)
    else:
        model.config._attn_implementation = ROWS_ATTENTION
