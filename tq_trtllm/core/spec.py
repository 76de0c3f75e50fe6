"""Widths, groups and byte counts of the packed format (docs/FORMAT.md, sections 2, 3 and 5)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .errors import TQError

FORMAT_VERSION = 4
# Version 3 added the 4.5- and 5-bit widths; version 2's bytes are version 3's. Version 4 puts the
# codebooks' levels on an 8-bit grid, which a reader applies to the codebooks of older tables too.
READABLE_FORMAT_VERSIONS = (2, 3, 4)
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_WIDTHS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)
NORM_BYTES = 2  # one fp16 norm per group and token
# Bit planes of each code width, low bits first (FORMAT.md section 3).
PLANES = {1: (1,), 2: (2,), 3: (2, 1), 4: (4,), 5: (4, 1)}
MAX_ROTARY_PAIRS = 16  # the kernels' limit (tq_kernels.h TQ_MAX_ROTARY_PAIRS)
ROTATIONS = ("hadamard", "dense")  # the quantizer's rotations (the format uses hadamard)


def check_format_version(version: int) -> None:
    if version not in READABLE_FORMAT_VERSIONS:
        raise TQError(
            f"packed cache format version {version} is not readable by this tq_trtllm, which reads "
            f"versions {', '.join(map(str, READABLE_FORMAT_VERSIONS))}; rebuild the engine or "
            "tables with this version"
        )


def check_head_dim(head_dim: int) -> None:
    """Head dims of the packed format and the randomized Hadamard rotation."""
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise TQError(
            f"head_dim {head_dim} is not supported by the packed cache format; supported head dims "
            f"are {', '.join(map(str, SUPPORTED_HEAD_DIMS))} (the reference quantizer's dense "
            "rotation takes any head_dim, for comparisons)"
        )


def check_bits(bits: int) -> None:
    if bits not in PLANES:
        raise TQError(f"{bits} bits per coordinate is not supported; use one of "
                      f"{', '.join(map(str, PLANES))}")


def parse_width(width: float | str) -> float:
    """A width as a float, refusing anything outside SUPPORTED_WIDTHS."""
    try:
        value = float(width)
    except (TypeError, ValueError):
        raise TQError(f"KV width {width!r} is not a number; use one of {_widths_text()}") from None
    if value not in SUPPORTED_WIDTHS:
        raise TQError(f"KV width {width} is not supported; use one of {_widths_text()}")
    return value


def parse_kv_bits(text: str) -> tuple[float, float]:
    """'3' -> (3, 3); 'k4v3' or 'k3.5v3' -> (key width, value width)."""
    text = str(text).strip().lower()
    match = re.fullmatch(r"k([0-9.]+)v([0-9.]+)", text)
    if match:
        return parse_width(match.group(1)), parse_width(match.group(2))
    width = parse_width(text)
    return width, width


def _widths_text() -> str:
    return ", ".join(f"{w:g}" for w in SUPPORTED_WIDTHS) + " (or a K/V pair such as k4v3)"


@dataclass(frozen=True)
class Group:
    """A run of consecutive permuted coordinates with its own norm, rotation and codebook."""

    start: int
    dim: int
    bits: int

    @property
    def planes(self) -> tuple[int, ...]:
        return PLANES[self.bits]

    def plane_words(self, plane_bits: int) -> int:
        """32-bit words one token's codes fill in a plane of width plane_bits."""
        return self.dim * plane_bits // 32

    @property
    def code_bytes(self) -> int:
        return self.dim * self.bits // 8


@dataclass(frozen=True)
class CodecSpec:
    """How one of K or V is encoded: head_dim and width determine the groups."""

    head_dim: int
    width: float

    def __post_init__(self):
        object.__setattr__(self, "width", parse_width(self.width))
        if self.head_dim < 2 or (not self.width.is_integer() and self.head_dim % 2):
            raise TQError(f"head_dim {self.head_dim} cannot be split for width {self.width:g}: "
                          "fractional widths split head_dim into two equal halves")

    @property
    def groups(self) -> tuple[Group, ...]:
        if self.width.is_integer():
            return (Group(0, self.head_dim, int(self.width)),)
        half = self.head_dim // 2
        return (Group(0, half, math.ceil(self.width)), Group(half, half, math.floor(self.width)))

    @property
    def num_outliers(self) -> int:
        """Channels in the wider group of a fractional width (0 for integer widths)."""
        return 0 if self.width.is_integer() else self.groups[0].dim

    @property
    def bytes_per_token(self) -> int:
        return sum(g.code_bytes + NORM_BYTES for g in self.groups)

    def page_bytes(self, tokens_per_block: int) -> int:
        check_head_dim(self.head_dim)
        check_tokens_per_block(tokens_per_block)
        return tokens_per_block * self.bytes_per_token

    @property
    def effective_bits(self) -> float:
        """Stored bits per coordinate, norms included."""
        return self.bytes_per_token * 8 / self.head_dim


def check_tokens_per_block(tokens_per_block: int) -> None:
    if tokens_per_block <= 0 or tokens_per_block % 16:
        raise TQError(f"tokens_per_block {tokens_per_block} must be a positive multiple of 16")


def bytes_table() -> str:
    """FORMAT.md's bytes-per-token table, computed."""
    lines = ["| width | " + " | ".join(f"d = {d}" for d in SUPPORTED_HEAD_DIMS) + " |"]
    lines.append("|---" * (len(SUPPORTED_HEAD_DIMS) + 1) + "|")
    for w in SUPPORTED_WIDTHS:
        cells = [str(CodecSpec(d, w).bytes_per_token) for d in SUPPORTED_HEAD_DIMS]
        lines.append(f"| {w:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(bytes_table())
