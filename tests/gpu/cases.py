"""Building blocks of the GPU tests: random caches, codecs with calibration tables, references."""

from __future__ import annotations

import torch

from tq_trtllm.calibration.table import KVTable, oblivious_table
from tq_trtllm.core.paged import PagedLayerCache
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.rotary_mean import MAX_ROTARY_PAIRS, RotaryMean
from tq_trtllm.core.spec import CodecSpec
from tq_trtllm.kernels import KernelCache


def make_rotary(head_dim: int, heads: int, gen: torch.Generator) -> RotaryMean:
    """A rotary mean over random rotate-half pairs at RoPE frequencies (base 10,000): all 16 pairs
    at head_dim 128 (two mma k steps), 5 at 64 (one, partly empty); float32-exact values."""
    pairs = MAX_ROTARY_PAIRS if head_dim == 128 else 5
    half = head_dim // 2
    a = torch.stack([torch.randperm(half, generator=gen)[:pairs] for _ in range(heads)])
    freq = (10000.0 ** (-2.0 * a.double() / head_dim)).float().double()
    mean = torch.randn(heads, pairs, 2, generator=gen).double()
    return RotaryMean(a, freq, mean)


def make_side(head_dim: int, width: float, heads: int, gen: torch.Generator) -> dict:
    """One side's calibration arrays: a per-head mean, a positive scale and (fractional widths)
    outliers."""
    spec = CodecSpec(head_dim, width)
    mean = 0.3 * torch.randn(heads, head_dim, generator=gen)
    scale = 0.5 + torch.rand(heads, head_dim, generator=gen)
    outliers = None
    if spec.num_outliers:
        outliers = torch.stack([torch.randperm(head_dim, generator=gen)[:spec.num_outliers]
                                for _ in range(heads)])
    return {"mean": mean, "scale": scale, "outliers": outliers}


def make_codec(head_dim: int, width: float, heads: int, gen: torch.Generator, seed: int,
               tables: bool, rotary: bool = False) -> VectorCodec:
    """A codec; with tables, make_side's arrays; with rotary, a rotary mean (keys)."""
    spec = CodecSpec(head_dim, width)
    if not tables:
        return VectorCodec(spec, seed=seed)
    return VectorCodec(spec, seed=seed, **make_side(head_dim, width, heads, gen),
                       rotary=make_rotary(head_dim, heads, gen) if rotary else None)


def make_table(head_dim: int, k_width: float, v_width: float, kv_heads: int, q_heads: int,
               gen: torch.Generator, *, layer: int = 0, seed: int = 77, tables: bool = False,
               page_shift: bool = False, config_hash: str = "feedc0de12345678") -> KVTable:
    """A calibration table whose layer `layer` has these widths and rotation seed (the layers before
    it: data-oblivious); with tables, make_side's arrays on both sides and the keys' rotary mean;
    with page_shift, a page shift per query head in (0.5, 1.5)."""
    fingerprint = {"family": "llama", "layers": layer + 1, "heads": q_heads, "kv_heads": kv_heads,
                   "head_dim": head_dim, "config_hash": config_hash}
    table = oblivious_table(fingerprint, k_width, v_width)
    entry = table.layers[layer]
    entry.seed = seed
    if tables:
        for side, width in (("key", k_width), ("value", v_width)):
            for name, t in make_side(head_dim, width, kv_heads, gen).items():
                setattr(entry, f"{side}_{name}", t)
        entry.key_rotary = make_rotary(head_dim, kv_heads, gen)
    if page_shift:
        entry.page_lse_shift = torch.rand(q_heads, generator=gen) + 0.5
    return table


def make_cache(head_dim: int, k_width: float, v_width: float, heads: int, tokens_per_block: int,
               lengths: list[int], gen: torch.Generator, tables: bool = False,
               spare_blocks: int = 1):
    """A GPU cache whose block table gives each sequence shuffled chunks for its lengths; with
    tables, the keys' codec has a rotary mean too."""
    key = make_codec(head_dim, k_width, heads, gen, seed=1234, tables=tables, rotary=tables)
    value = make_codec(head_dim, v_width, heads, gen, seed=99, tables=tables)
    blocks = [(n + tokens_per_block - 1) // tokens_per_block + spare_blocks for n in lengths]
    max_blocks = max(blocks)
    num_chunks = sum(blocks) * 2
    cache = PagedLayerCache(key, value, heads, tokens_per_block, num_chunks, device="cuda")
    for pool in cache.pools:  # unwritten slots hold garbage, never zeros
        pool.copy_(torch.randint(0, 256, pool.shape, generator=gen, dtype=torch.uint8))
    order = torch.randperm(num_chunks, generator=gen).to(torch.int32)
    table = torch.full((len(lengths), 2, max_blocks), -1, dtype=torch.int32)
    used = 0
    for s, nb in enumerate(blocks):
        for kv in range(2):
            table[s, kv, :nb] = order[used:used + nb]
            used += nb
    table = table.cuda()
    return cache, table, KernelCache(cache, table)


def twin(cache: PagedLayerCache, table: torch.Tensor, gen: torch.Generator):
    """A second cache with the same codecs and shape (garbage pools), and its KernelCache."""
    other = PagedLayerCache(cache.key, cache.value, cache.num_kv_heads, cache.tokens_per_block,
                            cache.pools[0].shape[0], device="cuda")
    for pool in other.pools:
        pool.copy_(torch.randint(0, 256, pool.shape, generator=gen, dtype=torch.uint8))
    return other, KernelCache(other, table)


def positions(lengths: list[int], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(seq_idx, pos) of every token of every sequence, shuffled by `gen` (the test's data, so each
    position gets the same vector on every run)."""
    seq = torch.cat([torch.full((n,), s) for s, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n) for n in lengths])
    perm = torch.randperm(seq.numel(), generator=gen)
    return seq[perm].int().cuda(), pos[perm].int().cuda()
