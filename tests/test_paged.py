"""The reference paged pool: tokens land where FORMAT.md section 6 says and come back exactly."""

import pytest
import torch

from tq_trtllm.core.errors import TQError
from tq_trtllm.core.paged import PagedLayerCache
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.spec import CodecSpec


def make_cache(kw=3, vw=2.5, heads=2, tokens=16, chunks=12):
    return PagedLayerCache(VectorCodec(CodecSpec(64, kw), seed=1), VectorCodec(CodecSpec(64, vw), seed=2),
                           heads, tokens, chunks)


def test_append_then_gather_equals_the_codec_roundtrip(gen):
    cache = make_cache()
    table = torch.tensor([[[3, 7, 0], [5, 1, 2]], [[4, 6, 8], [9, 10, 11]]], dtype=torch.int32)
    k = torch.randn(2, 40, 2, 64, generator=gen)
    v = torch.randn(2, 40, 2, 64, generator=gen)
    for s in range(2):  # one token at a time for sequence 0, in bulk for sequence 1
        steps = [slice(i, i + 1) for i in range(40)] if s == 0 else [slice(0, 40)]
        for sl in steps:
            pos = torch.arange(40)[sl]
            cache.append(table, k[s, sl], v[s, sl], torch.full_like(pos, s), pos)
    for s in range(2):
        kh, vh = cache.gather(table, s, 0, 40)
        torch.testing.assert_close(kh, cache.key.roundtrip(k[s]), rtol=0, atol=1e-6)
        torch.testing.assert_close(vh, cache.value.roundtrip(v[s]), rtol=0, atol=1e-6)


def test_read_returns_the_stored_encoding_in_the_order_asked(gen):
    cache = make_cache()
    table = torch.tensor([[[3, 7], [5, 1]], [[4, 6], [9, 10]]], dtype=torch.int32)
    x = torch.randn(2, 2, 20, 2, 64, generator=gen)  # [seq, K/V, token, head, d]
    for s in range(2):
        cache.append(table, x[s, 0], x[s, 1], torch.full((20,), s), torch.arange(20))
    seq, pos = torch.tensor([1, 0, 1, 0]), torch.tensor([19, 3, 0, 17])
    for kv, codec in enumerate((cache.key, cache.value)):
        got = cache.read(table, kv, seq, pos)
        want = codec.encode(x[seq, kv, pos], pos)
        assert all(map(torch.equal, got.codes, want.codes)) and torch.equal(got.norms, want.norms)


def test_pools_hold_exactly_the_format_bytes():
    cache = make_cache(kw=3, vw=3, heads=8, tokens=64, chunks=4)
    assert cache.pools[0].numel() == 4 * 8 * 64 * 26
    assert cache.chunk_bytes == (8 * 64 * 26, 8 * 64 * 26)


def test_token_lands_in_the_named_chunk_and_slot():
    cache = make_cache(heads=1)
    table = torch.tensor([[[2, 5], [4, 1]]], dtype=torch.int32)
    cache.append(table, torch.ones(1, 1, 64), torch.ones(1, 1, 64), torch.tensor([0]), torch.tensor([17]))
    written = [(c, p) for c in range(12) for p in range(2) if cache.pools[p][c].any()]
    assert written == [(1, 1), (5, 0)]  # block 1 of the sequence: K chunk 5, V chunk 1


def test_positions_beyond_the_block_table_are_refused():
    cache = make_cache()
    table = torch.zeros(1, 2, 2, dtype=torch.int32)
    with pytest.raises(TQError, match="beyond the block table"):
        cache.append(table, torch.ones(1, 2, 64), torch.ones(1, 2, 64), torch.tensor([0]), torch.tensor([32]))


def test_chunks_outside_the_pool_are_refused():
    cache = make_cache()
    table = torch.full((1, 2, 2), 99, dtype=torch.int32)
    with pytest.raises(TQError, match="outside the pool"):
        cache.append(table, torch.ones(1, 2, 64), torch.ones(1, 2, 64), torch.tensor([0]), torch.tensor([0]))
