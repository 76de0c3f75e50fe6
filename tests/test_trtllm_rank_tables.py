"""Tensor-parallel slicing of the calibration table (tq_trtllm/trtllm/rank_tables.py): the ranks'
calibration tables, and the layer tables built from them, together equal the single-rank table."""

import numpy as np
import pytest
import torch

from tq_trtllm.calibration.table import KVTable, LayerTable
from tq_trtllm.core.errors import TQError
from tq_trtllm.core.spec import CodecSpec
from tq_trtllm.trt.plugin_fields import HEADER, layer_table_header
from tq_trtllm.trtllm.rank_tables import (KV_HEAD_TENSORS, Q_HEAD_TENSORS, join_rank_tables, rank_heads,
                                          rank_table)
from tq_trtllm.trtllm.weight_names import rank_qkv_rows

HQ, HKV, D = 8, 4, 64


def full_table(gen, width=3.5) -> KVTable:
    """Two layers with every per-head array set to distinct values (fractional width: outliers too)."""
    n_hi = CodecSpec(D, width).groups[0].dim if width % 1 else 0
    layers = []
    for i in range(2):
        outliers = torch.stack([torch.randperm(D, generator=gen)[:n_hi] for _ in range(HKV)]) if n_hi else None
        pairs = 3
        layers.append(LayerTable(
            width, width, seed=100 + i, key_mean=torch.randn(HKV, D, generator=gen),
            key_scale=torch.rand(HKV, D, generator=gen) + 0.5, key_outliers=outliers,
            value_mean=torch.randn(HKV, D, generator=gen), value_scale=torch.rand(HKV, D, generator=gen) + 0.5,
            value_outliers=outliers, page_lse_shift=torch.rand(HQ, generator=gen),
            key_rotary_channels=torch.stack([torch.randperm(D // 2, generator=gen)[:pairs] for _ in range(HKV)]),
            key_rotary_freq=torch.rand(HKV, pairs, generator=gen) + 0.1,
            key_rotary_mean=torch.randn(HKV, pairs, 2, generator=gen)))
    fp = {"family": "llama", "layers": 2, "heads": HQ, "kv_heads": HKV, "head_dim": D, "config_hash": "00ff00ff00ff00ff"}
    return KVTable(fp, layers)


def test_two_ranks_together_equal_the_single_rank_table(gen):
    table = full_table(gen)
    ranks = [rank_table(table, 2, r) for r in range(2)]
    for r, t in enumerate(ranks):
        assert t.fingerprint["kv_heads"] == HKV // 2 and t.fingerprint["heads"] == HQ // 2
        for i, layer in enumerate(t.layers):
            assert torch.equal(layer.key_mean, table.layers[i].key_mean[2 * r:2 * r + 2])
            assert torch.equal(layer.page_lse_shift, table.layers[i].page_lse_shift[4 * r:4 * r + 4])
    joined = join_rank_tables(ranks, table.fingerprint)
    assert joined.fingerprint == table.fingerprint
    for a, b in zip(joined.layers, table.layers):
        for name in KV_HEAD_TENSORS + Q_HEAD_TENSORS:
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert (a.key_width, a.value_width, a.seed) == (b.key_width, b.value_width, b.seed)


def _payload_section(table_bytes: bytes, start: int, size: int) -> bytes:
    return table_bytes[HEADER.size + start: HEADER.size + start + size]


def test_rank_plugin_tables_hold_their_heads_rows(gen):
    """The layer table each rank's plugin gets: the header says its heads, and its key-mean rows are
    the single-rank table's rows of those heads, in order."""
    from tq_trtllm.trtllm.attention_patch import layer_fields

    table = full_table(gen)
    rope = {"rope_base": 10000.0}
    full = layer_fields(table, 1, 64, rope)["layer_table"].tobytes()
    parts = [layer_fields(rank_table(table, 2, r), 1, 64, rope)["layer_table"].tobytes() for r in range(2)]
    key, value = table.codecs(1)
    books = sum(len(c) for codec in (key, value) for c in codec.codebooks) * 4
    for part in parts:
        header = layer_table_header(part)
        assert (header.layer_idx, header.num_kv_heads, header.num_q_heads) == (1, HKV // 2, HQ // 2)
        assert (header.rotation_seed, header.model_fingerprint) == (101, 0x00FF00FF00FF00FF)
    rows = b"".join(_payload_section(p, books, HKV // 2 * D * 4) for p in parts)
    assert rows == _payload_section(full, books, HKV * D * 4)
    assert rows == table.layers[1].key_mean.numpy().astype("<f4").tobytes()


def test_splits_that_cut_heads_are_refused():
    with pytest.raises(TQError, match="does not divide"):
        rank_heads(9, 3, 2, 0)  # SmolLM2-135M: 9 query heads
    with pytest.raises(TQError, match="not one of"):
        rank_heads(8, 4, 2, 2)
    assert rank_heads(8, 4, 4, 3).kv_heads == range(3, 4)


def test_qkv_rows_of_a_rank_are_its_tables_heads():
    """TensorRT-LLM's fused qkv weight of rank r holds the key rows of exactly the KV heads whose
    tables rank r gets (and every row of q, k and v lands on exactly one rank)."""
    rows = [rank_qkv_rows(rank_heads(HQ, HKV, 2, r), HQ, HKV, D) for r in range(2)]
    assert sorted(rows[0] + rows[1]) == list(range((HQ + 2 * HKV) * D))
    for r in range(2):
        heads = rank_heads(HQ, HKV, 2, r)
        k_rows = rows[r][len(heads.q_heads) * D: (len(heads.q_heads) + len(heads.kv_heads)) * D]
        assert sorted({(row - HQ * D) // D for row in k_rows}) == list(heads.kv_heads)
        assert np.all(np.diff(k_rows) > 0)
