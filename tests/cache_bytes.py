"""What a TurboQuantCache holds, measured from its tensors instead of the table's byte formula
(KVTable.layer_cache_bytes, which TurboQuantCache.stored_bytes sums): the page slots its writes
filled, the exact sink tensors, and the recent window's rows that the next step keeps."""

from __future__ import annotations

import torch

from tq_trtllm.core.packing import read_tokens

FP16_BYTES = 2


def written_slots(pool: torch.Tensor, layout) -> torch.Tensor:
    """Which token slots of a pool ([chunks, KV heads, page_bytes]) hold a token, [pages, T]: the
    pools start zeroed, and a written token's gains are nonzero (the vectors are never zero)."""
    pages = pool.reshape(-1, layout.page_bytes)
    page = torch.arange(pages.shape[0], device=pool.device).repeat_interleave(layout.tokens)
    slot = torch.arange(layout.tokens, device=pool.device).repeat(pages.shape[0])
    norms = read_tokens(pages, layout, page, slot).norms  # [pages * T, groups]
    return (norms != 0).any(dim=-1).view(pages.shape[0], layout.tokens)


def held_bytes(cache) -> int:
    """Bytes the cache holds: per layer, the filled page slots at the page's bytes per slot (the
    pages of K and V), the sink tensors' bytes, and the kept window in fp16 (the last
    recent_tokens - 1 rows of `exact`, which the next update keeps)."""
    total = 0
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        for pool, layout in zip(layer.pages.pools, layer.pages.layouts):
            assert layout.page_bytes % layout.tokens == 0
            total += int(written_slots(pool, layout).sum()) * (layout.page_bytes // layout.tokens)
        total += sum(s.numel() * s.element_size() for s in layer.sinks)
        kept = min(layer.exact[0].shape[2], layer.recent_tokens - 1)
        total += sum(x[:, :, x.shape[2] - kept:].numel() for x in layer.exact) * FP16_BYTES
    return total
