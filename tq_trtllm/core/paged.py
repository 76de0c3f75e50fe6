"""One layer's paged KV pool, as docs/FORMAT.md section 6 lays it out: the reference for the kernels'
quantize-append and for every reader of the pool.

K and V get separate pools whose chunks are exactly num_kv_heads pages, so the cache holds exactly
the format's bytes. A block table row [2][max_blocks] per sequence names each block's K and V chunk.
"""

from __future__ import annotations

import torch

from .errors import TQError
from .packing import PageLayout, read_tokens, write_tokens
from .quantizer import VectorCodec


class PagedLayerCache:
    def __init__(self, key: VectorCodec, value: VectorCodec, num_kv_heads: int,
                 tokens_per_block: int, num_chunks: int, device="cpu"):
        if key.spec.head_dim != value.spec.head_dim:
            raise TQError("keys and values must share head_dim")
        self.key, self.value = key, value
        self.num_kv_heads = num_kv_heads
        self.tokens_per_block = tokens_per_block
        self.layouts = (PageLayout(key.spec, tokens_per_block), PageLayout(value.spec, tokens_per_block))
        # pools[kv] is uint8 [num_chunks, num_kv_heads, page_bytes]
        self.pools = tuple(torch.zeros(num_chunks, num_kv_heads, lay.page_bytes, dtype=torch.uint8,
                                       device=device) for lay in self.layouts)

    def grow(self, num_chunks: int) -> None:
        """Enlarge both pools to num_chunks chunks, keeping every written page (block tables stay valid)."""
        self.pools = tuple(
            torch.cat([p, p.new_zeros(num_chunks - p.shape[0], *p.shape[1:])]) if num_chunks > p.shape[0]
            else p for p in self.pools)

    @property
    def chunk_bytes(self) -> tuple[int, int]:
        return tuple(self.num_kv_heads * lay.page_bytes for lay in self.layouts)

    def _locate(self, block_table: torch.Tensor, kv: int, seq_idx: torch.Tensor, pos: torch.Tensor):
        """The K (kv 0) or V (kv 1) pool as rows of one page, and each token's page index in it and
        slot, per KV head: [n, H] each."""
        max_blocks = block_table.shape[-1]
        block = pos // self.tokens_per_block
        if ((pos < 0) | (block >= max_blocks)).any():
            raise TQError(f"a position lies beyond the block table ({max_blocks} blocks of "
                          f"{self.tokens_per_block} tokens)")
        chunk = block_table[seq_idx, kv, block].long()
        if ((chunk < 0) | (chunk >= self.pools[kv].shape[0])).any():
            raise TQError("the block table names a chunk outside the pool")
        heads = torch.arange(self.num_kv_heads, device=pos.device)
        page = chunk[:, None] * self.num_kv_heads + heads
        slot = (pos % self.tokens_per_block)[:, None].expand_as(page)
        return self.pools[kv].view(-1, self.layouts[kv].page_bytes), page, slot

    def append(self, block_table: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               seq_idx: torch.Tensor, pos: torch.Tensor, search: bool = True) -> None:
        """Quantize k, v ([n, num_kv_heads, head_dim]) and write token i at (seq_idx[i], pos[i])
        (search: VectorCodec.encode's)."""
        for kv, (x, codec) in enumerate(((k, self.key), (v, self.value))):
            pages, page, slot = self._locate(block_table, kv, seq_idx, pos)
            write_tokens(pages, self.layouts[kv], page, slot, codec.encode(x, pos, search))

    def read(self, block_table: torch.Tensor, kv: int, seq_idx: torch.Tensor, pos: torch.Tensor):
        """The packed K (kv 0) or V (kv 1) tokens at (seq_idx[i], pos[i]), as stored: an Encoded."""
        pages, page, slot = self._locate(block_table, kv, seq_idx, pos)
        return read_tokens(pages, self.layouts[kv], page, slot)

    def gather(self, block_table: torch.Tensor, seq: int, start: int, length: int,
               dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K and V of positions [start, start + length) of `seq`: [length, H, head_dim]."""
        pos = torch.arange(start, start + length, device=block_table.device)
        seq_idx = torch.full_like(pos, seq)
        k, v = (codec.decode(self.read(block_table, kv, seq_idx, pos), dtype, pos)
                for kv, codec in enumerate((self.key, self.value)))
        return k, v
