"""Tensor parallelism: which KV and query heads a rank holds, and its slice of the tables.

TensorRT-LLM 1.2 splits attention by heads: rank r of tp_size holds query heads
[r Hq/tp, (r+1) Hq/tp) and KV heads [r H/tp, (r+1) H/tp) (the qkv weight's rows, and so the rank's
K and V pages). Each KV head's codec is independent of the others, so a rank's plugin gets exactly
those heads' rows of every per-head array, and the page shift of its query heads.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch

from ..calibration.table import KVTable, LayerTable
from ..core.errors import TQError

# per-KV-head arrays of a LayerTable (leading dim = KV heads when they are per head)
KV_HEAD_TENSORS = ("key_mean", "key_scale", "key_outliers", "value_mean", "value_scale", "value_outliers",
                   "key_rotary_channels", "key_rotary_freq", "key_rotary_mean")
Q_HEAD_TENSORS = ("page_lse_shift",)


@dataclass(frozen=True)
class RankHeads:
    rank: int
    tp_size: int
    q_heads: range
    kv_heads: range


def rank_heads(num_q_heads: int, num_kv_heads: int, tp_size: int, rank: int) -> RankHeads:
    """The heads rank `rank` holds; refuses splits that would replicate or cut a KV head."""
    if tp_size < 1 or not 0 <= rank < tp_size:
        raise TQError(f"rank {rank} is not one of the {tp_size} tensor-parallel ranks")
    if num_kv_heads % tp_size or num_q_heads % tp_size:
        raise TQError(f"--tp-size {tp_size} does not divide the model's {num_q_heads} query heads and "
                      f"{num_kv_heads} KV heads; choose a tp size that divides both (each rank must own "
                      "whole KV heads and their pages)")
    q, kv = num_q_heads // tp_size, num_kv_heads // tp_size
    return RankHeads(rank, tp_size, range(rank * q, (rank + 1) * q), range(rank * kv, (rank + 1) * kv))


def _slice(t: torch.Tensor | None, heads: range, total: int, name: str) -> torch.Tensor | None:
    if t is None:
        return None
    if t.dim() == 1 and name not in Q_HEAD_TENSORS:
        return t.clone()  # one row shared by all heads
    if t.shape[0] != total:
        raise TQError(f"table array {name} has {t.shape[0]} rows, expected {total} (one per head)")
    return t[heads.start:heads.stop].clone()


def rank_layer(layer: LayerTable, heads: RankHeads, num_q_heads: int, num_kv_heads: int) -> LayerTable:
    """One layer's table restricted to the rank's heads."""
    changes = {name: _slice(getattr(layer, name), heads.kv_heads, num_kv_heads, name) for name in KV_HEAD_TENSORS}
    changes.update({name: _slice(getattr(layer, name), heads.q_heads, num_q_heads, name)
                    for name in Q_HEAD_TENSORS})
    return replace(layer, **changes)


def rank_table(table: KVTable, tp_size: int, rank: int) -> KVTable:
    """The table of rank `rank`: every layer sliced, the fingerprint's head counts the rank's."""
    fp = table.fingerprint
    heads = rank_heads(int(fp["heads"]), int(fp["kv_heads"]), tp_size, rank)
    out = copy.copy(table)
    out.fingerprint = {**fp, "heads": len(heads.q_heads), "kv_heads": len(heads.kv_heads)}
    out.layers = [rank_layer(layer, heads, int(fp["heads"]), int(fp["kv_heads"])) for layer in table.layers]
    return out


def join_rank_tables(tables: list[KVTable], full_fingerprint: dict) -> KVTable:
    """The inverse of rank_table over all ranks (the per-head arrays concatenated in rank order)."""
    first = tables[0]
    layers = []
    for i, layer in enumerate(first.layers):
        parts = [t.layers[i] for t in tables]
        changes = {}
        for name in KV_HEAD_TENSORS + Q_HEAD_TENSORS:
            values = [getattr(p, name) for p in parts]
            if values[0] is None or (values[0].dim() == 1 and name not in Q_HEAD_TENSORS):
                changes[name] = values[0]
            else:
                changes[name] = torch.cat(values)
        layers.append(replace(layer, **changes))
    out = copy.copy(first)
    out.fingerprint = dict(full_fingerprint)
    out.layers = layers
    return out
