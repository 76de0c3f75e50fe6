"""Byte-exact pages of packed codes and norms (docs/FORMAT.md, sections 3 and 5)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import TQError
from .quantizer import Encoded
from .spec import CodecSpec


@dataclass(frozen=True)
class Segment:
    """One plane array of a page: uint32[T][words] at byte `offset`."""

    group: int
    plane_bits: int
    shift: int  # the plane holds bits shift .. shift + plane_bits - 1 of each code
    offset: int
    words: int


class PageLayout:
    """Where each plane and the norms sit inside one page."""

    def __init__(self, spec: CodecSpec, tokens_per_block: int):
        self.page_bytes = spec.page_bytes(tokens_per_block)  # validates head_dim and T
        self.spec = spec
        self.tokens = tokens_per_block
        segments, offset = [], 0
        for gi, g in enumerate(spec.groups):
            shift = 0
            for w in g.planes:
                segments.append(Segment(gi, w, shift, offset, g.plane_words(w)))
                offset += tokens_per_block * g.plane_words(w) * 4
                shift += w
        self.segments = tuple(segments)
        self.norms_offset = offset


def bit_offsets(plane_bits: int, shift: int, device=None) -> torch.Tensor:
    """The bit of its word where each of a word's 32 / plane_bits codes sits (FORMAT.md section 3):
    in order, except the high plane of 3-bit codes (plane width 1 above 2 low bits), in nibble order."""
    per_word = 32 // plane_bits
    r = torch.arange(per_word, device=device)
    if plane_bits == 1 and shift == 2:
        return 4 * ((r % 16) // 2) + 2 - 2 * (r // 16) + r % 2
    return plane_bits * r


def pack_words(codes: torch.Tensor, plane_bits: int, shift: int) -> torch.Tensor:
    """Bits shift..shift+plane_bits-1 of each code, packed into int32 words (little-endian)."""
    per_word = 32 // plane_bits
    vals = (codes.to(torch.int64) >> shift) & ((1 << plane_bits) - 1)
    vals = vals.reshape(*codes.shape[:-1], -1, per_word)
    words = (vals << bit_offsets(plane_bits, shift, codes.device)).sum(dim=-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_words(words: torch.Tensor, plane_bits: int, shift: int) -> torch.Tensor:
    w = words.to(torch.int64) & 0xFFFFFFFF
    vals = (w.unsqueeze(-1) >> bit_offsets(plane_bits, shift, words.device)) & ((1 << plane_bits) - 1)
    return vals.reshape(*words.shape[:-1], -1)


def _segment_view(pages: torch.Tensor, layout: PageLayout, seg: Segment) -> torch.Tensor:
    size = layout.tokens * seg.words * 4
    return pages[:, seg.offset:seg.offset + size].view(torch.int32).view(-1, layout.tokens, seg.words)


def _norms_view(pages: torch.Tensor, layout: PageLayout) -> torch.Tensor:
    g = len(layout.spec.groups)
    return pages[:, layout.norms_offset:].view(torch.float16).view(-1, g, layout.tokens)


def _check_pages(pages: torch.Tensor, layout: PageLayout) -> None:
    if pages.dtype != torch.uint8 or pages.dim() != 2 or pages.shape[1] != layout.page_bytes:
        raise TQError(f"pages must be uint8 [num_pages, {layout.page_bytes}], got "
                      f"{pages.dtype} {list(pages.shape)}")


def write_tokens(pages: torch.Tensor, layout: PageLayout, page_idx: torch.Tensor,
                 slot: torch.Tensor, enc: Encoded) -> None:
    """Write token i's codes and norms into slot slot[i] of page page_idx[i], in place."""
    _check_pages(pages, layout)
    if ((slot < 0) | (slot >= layout.tokens)).any():
        raise TQError(f"slots must lie in 0..{layout.tokens - 1}")
    for seg in layout.segments:
        _segment_view(pages, layout, seg)[page_idx, slot] = pack_words(
            enc.codes[seg.group], seg.plane_bits, seg.shift)
    norms = _norms_view(pages, layout)
    for g in range(len(layout.spec.groups)):
        norms[page_idx, g, slot] = enc.norms[..., g]


def read_tokens(pages: torch.Tensor, layout: PageLayout, page_idx: torch.Tensor,
                slot: torch.Tensor) -> Encoded:
    """The codes and norms in slot slot[i] of page page_idx[i]."""
    _check_pages(pages, layout)
    codes = [torch.zeros(0)] * len(layout.spec.groups)
    for seg in layout.segments:
        part = unpack_words(_segment_view(pages, layout, seg)[page_idx, slot], seg.plane_bits, seg.shift)
        codes[seg.group] = part if seg.shift == 0 else codes[seg.group] | (part << seg.shift)
    codes = [c.to(torch.uint8) for c in codes]
    norms = _norms_view(pages, layout)[page_idx, :, slot]
    return Encoded(codes, norms)


def pack_page(enc: Encoded, layout: PageLayout) -> torch.Tensor:
    """One whole page (uint8 [page_bytes]) from the encodings of its T tokens (leading dim T)."""
    page = torch.zeros(1, layout.page_bytes, dtype=torch.uint8, device=enc.norms.device)
    slots = torch.arange(layout.tokens, device=page.device)
    write_tokens(page, layout, torch.zeros_like(slots), slots, enc)
    return page[0]
