"""docs/FORMAT.md pinned: byte counts, and page bytes rebuilt from the document's own rules."""

import re
import struct
from pathlib import Path

import pytest
import torch

from tq_trtllm.core.errors import TQError
from tq_trtllm.core.packing import PageLayout, pack_page, read_tokens
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.spec import SUPPORTED_WIDTHS, CodecSpec, check_format_version, parse_kv_bits

FORMAT_MD = Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md"
PLANES = {1: [1], 2: [2], 3: [2, 1], 4: [4], 5: [4, 1]}  # FORMAT.md section 3, as the document states it


def documented_bytes_per_token():
    """{(width, head_dim): bytes} from the table in FORMAT.md section 2."""
    text = FORMAT_MD.read_text()
    table = {}
    for line in text.splitlines():
        m = re.match(r"\|\s*([0-9.]+)\s*\|\s*(\d+)\s*\|\s*\*?\*?(\d+)\*?\*?\s*\|\s*(\d+)\s*\|", line)
        if m:
            w = float(m.group(1))
            for d, b in zip((64, 128, 256), m.group(2, 3, 4)):
                table[(w, d)] = int(b)
    return table


def test_documented_byte_counts_match_the_code():
    table = documented_bytes_per_token()
    assert len(table) == 3 * len(SUPPORTED_WIDTHS)
    for (w, d), b in table.items():
        assert CodecSpec(d, w).bytes_per_token == b
    assert table[(3.0, 128)] == 50  # 48 bytes of codes + one fp16 norm


def expected_page(codes, norms, groups, tokens):
    """Page bytes built from FORMAT.md's words alone, with Python integers."""
    out = bytearray()
    for g, (n, bits) in enumerate(groups):
        shift = 0
        for w in PLANES[bits]:
            per_word = 32 // w
            for t in range(tokens):
                for k in range(n * w // 32):
                    word = 0
                    for i in range(per_word):
                        # the high plane of 3-bit codes: nibble order (4n + 2 - 2b + i % 2)
                        bit = 4 * (i % 16 // 2) + 2 - 2 * (i // 16) + i % 2 if bits == 3 and w == 1 else w * i
                        word |= ((int(codes[g][t, k * per_word + i]) >> shift) & ((1 << w) - 1)) << bit
                    out += struct.pack("<I", word)
            shift += w
    for g in range(len(groups)):
        for t in range(tokens):
            out += struct.pack("<e", float(norms[t, g]))
    return bytes(out)


@pytest.mark.parametrize("width", SUPPORTED_WIDTHS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_page_bytes_follow_the_document(width, head_dim, gen):
    tokens = 16
    spec = CodecSpec(head_dim, width)
    enc = VectorCodec(spec, seed=9).encode(torch.randn(tokens, head_dim, generator=gen))
    page = pack_page(enc, PageLayout(spec, tokens))
    groups = [(g.dim, g.bits) for g in spec.groups]
    assert bytes(page.numpy()) == expected_page(enc.codes, enc.norms.numpy(), groups, tokens)


def test_the_documented_example_page():
    layout = PageLayout(CodecSpec(128, 3), 64)
    assert layout.page_bytes == 3200
    assert [(s.offset, s.words) for s in layout.segments] == [(0, 8), (2048, 4)]
    assert layout.norms_offset == 3072


@pytest.mark.parametrize("width", SUPPORTED_WIDTHS)
def test_pack_then_read_is_exact(width, gen):
    spec, tokens = CodecSpec(128, width), 32
    enc = VectorCodec(spec, seed=1).encode(torch.randn(tokens, 128, generator=gen))
    page = pack_page(enc, PageLayout(spec, tokens))
    back = read_tokens(page[None], PageLayout(spec, tokens), torch.zeros(tokens, dtype=torch.long),
                       torch.arange(tokens))
    assert all(torch.equal(a, b) for a, b in zip(enc.codes, back.codes))
    assert torch.equal(enc.norms, back.norms)


def test_codes_are_the_nearest_levels_of_the_best_scale(gen):
    """Step 4.4: the codes are the nearest levels of alpha * y for the alpha_k = (40 + k) / 50
    (float32, k < 32) whose codes c maximize <y, c>^2 / ||c||^2, the first such k on ties."""
    for width in (2, 3, 4):
        codec = VectorCodec(CodecSpec(64, width), seed=4)
        x = torch.randn(300, 64, generator=gen, dtype=torch.float64)
        y = codec.rotated(x)[0] / x.norm(dim=-1, keepdim=True)  # no mean/scale: same rotation as keys
        book = codec.codebooks[0]
        best_score = torch.full((len(x),), -1.0, dtype=torch.float64)
        want = None
        for k in range(32):
            alpha = float(torch.tensor((40 + k) / 50, dtype=torch.float32))
            codes = (alpha * y[..., None] - book).abs().argmin(dim=-1)  # the lower code on ties
            c = book[codes]
            dot = (c * y).sum(-1)
            score = torch.where(dot > 0, dot**2 / (c * c).sum(-1), 0.0)
            better = score > best_score
            best_score = torch.where(better, score, best_score)
            want = codes if want is None else torch.where(better[:, None], codes, want)
        got = codec.encode(x).codes[0].long()
        assert torch.equal(got, want)
        assert not torch.equal(got, (y[..., None] - book).abs().argmin(dim=-1))  # the search acts


def test_the_papers_mse_codec_rounds_to_the_nearest_level(gen):
    """With the paper's gain (the stored norm, the TurboQuant-MSE baseline) step 4.4 stays plain
    nearest-level rounding of y: the scale search serves the unbiased gain only."""
    codec = VectorCodec(CodecSpec(64, 3), seed=4, gain="norm")
    x = torch.randn(200, 64, generator=gen, dtype=torch.float64)
    y = codec.rotated(x)[0] / x.norm(dim=-1, keepdim=True)
    nearest = (y[..., None] - codec.codebooks[0]).abs().argmin(dim=-1)
    assert torch.equal(codec.encode(x).codes[0].long(), nearest)


def test_unknown_format_version_is_refused():
    check_format_version(2)  # version 2's bytes are version 3's: engines built before stay readable
    check_format_version(3)  # version 4's grid applies to the codebooks of older tables
    check_format_version(4)
    for version in (1, 5):
        with pytest.raises(TQError, match=f"version {version} is not readable"):
            check_format_version(version)


@pytest.mark.parametrize("tokens", [0, 8, 24, -16])
def test_tokens_per_block_must_be_a_multiple_of_16(tokens):
    with pytest.raises(TQError, match="multiple of 16"):
        PageLayout(CodecSpec(128, 3), tokens)


def test_kv_bit_pairs_parse():
    assert parse_kv_bits("3") == (3.0, 3.0)
    assert parse_kv_bits("k4v3") == (4.0, 3.0)
    assert parse_kv_bits("K3.5V2.5") == (3.5, 2.5)
    with pytest.raises(TQError, match="KV width"):
        parse_kv_bits("k6v3")
