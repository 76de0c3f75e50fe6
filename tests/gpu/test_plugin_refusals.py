"""The TensorRT plugin's refusals at run time, through plugin_cpp/tests/plugin_harness.cpp (the
harness of test_plugin_harness.py): a mapping that names no layer of the pool and a KV length
beyond the block table are refused with an error status, and nothing is written, neither the pool
nor the output; block-table entries outside the pool (TensorRT-LLM's pool-type flag, or negative)
are skipped: the step succeeds, nothing reaches the pool, and each token attends to the step's own
rows only. docs/PLUGIN.md, "Refused at build time ... Refused at run time"."""

from __future__ import annotations

import math
import subprocess

import numpy as np
import pytest
import torch

from tq_trtllm.core.attention import reference_attention
from tq_trtllm.trt.plugin_fields import layer_table_bytes, plugin_fields

from .cases import make_table
from .test_plugin_harness import HARNESS, LIBRARY, pytestmark, rope, write_fields  # noqa: F401

D, HQ, HKV, T, MAX_BLOCKS, NUM_BLOCKS, LAYER, NUM_LAYERS = 64, 9, 3, 32, 2, 6, 5, 8
POOL_TYPE_FLAG = 1 << 30  # an offset at or above it names a block of the secondary pool


def write_case(work, tokens: int, past: int, offsets: torch.Tensor, layer_in_pool: int = 1,
               mapping_pool: int = 0, num_layers: int = NUM_LAYERS):
    """The harness's case directory for one context request of `tokens` tokens whose KV length is
    `past`, the layer mapped to pool `mapping_pool` (one pool exists), layer `layer_in_pool` of it,
    in a mapping of `num_layers` rows: (case dir, out dir, q, own rows)."""
    case, out = work / "case", work / "out"
    case.mkdir(parents=True)
    out.mkdir()
    gen = torch.Generator().manual_seed(61)
    table = make_table(D, 3.0, 3.0, HKV, HQ, gen, layer=LAYER, seed=77)
    key, value = table.codecs(LAYER)
    blob = layer_table_bytes(table, LAYER, num_q_heads=HQ, num_kv_heads=HKV, fingerprint=0x61)
    write_fields(case / "fields.bin", plugin_fields(blob, tokens_per_block=T, rope_base=10000.0))
    chunk = HKV * T * max(key.spec.bytes_per_token, value.spec.bytes_per_token)
    x = torch.randn(tokens, HQ + 2 * HKV, D, generator=gen).half()
    (case / "step0_meta.bin").write_bytes(np.array([1, tokens, 0, past, tokens], dtype=np.int32).tobytes())
    (case / "step0_qkv.bin").write_bytes(x.reshape(tokens, -1).view(torch.int16).numpy().tobytes())
    (case / "step0_offsets.bin").write_bytes(offsets.to(torch.int32).numpy().tobytes())
    (case / "case.txt").write_text(f"dtype fp16\nheads {HQ} {HKV} {D} {LAYER}\n"
                                   f"pool {NUM_BLOCKS} 2 {layer_in_pool} {num_layers}\n"
                                   f"chunk_bytes {chunk}\nmax_blocks {MAX_BLOCKS}\nsteps 1\n"
                                   f"mapping_pool {mapping_pool}\n")
    pos = torch.arange(past - tokens, past)
    q = rope(x[:, :HQ], pos, 10000.0).half()
    own = (rope(x[:, HQ:HQ + HKV], pos, 10000.0).half(), x[:, HQ + HKV:])
    return case, out, q, own


def run_step(work, tokens: int, past: int, offsets: torch.Tensor, **mapping):
    """write_case's step through the harness: (status, output [tokens, Hq, d] as fp16 bits, the whole
    pool's bytes, the harness's stderr, q and own rows)."""
    case, out, q, own = write_case(work, tokens, past, offsets, **mapping)
    done = subprocess.run([str(HARNESS), str(LIBRARY), str(case), str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    status = int((out / "step0_status.txt").read_text())
    output = np.fromfile(out / "step0_out.bin", dtype=np.uint16).reshape(tokens, HQ, D)
    pool = np.fromfile(out / "pool.bin", dtype=np.uint8)
    return status, output, pool, done.stderr, q, own


def offsets_of(blocks: list[int]) -> torch.Tensor:
    """[1, 2, MAX_BLOCKS] block offsets of one request: K and V chunks of each block (layers in pool 2)."""
    return torch.tensor([[[b * 4 + kv if b >= 0 else b for b in blocks] for kv in range(2)]])


def assert_nothing_written(output, pool):
    assert (pool == 0).all(), "a refused step wrote to the pool"
    assert (output == 0xFFFF).all(), "a refused step wrote to the output"


@pytest.mark.parametrize("mapping", [{"layer_in_pool": -1}, {"mapping_pool": 1}], ids=["layer", "pool"])
def test_a_mapping_to_no_layer_of_a_pool_is_refused_and_writes_nothing(tmp_path, mapping):
    """The layer mapped to layer -1 of its pool, or to pool 1 where only pool 0 exists."""
    status, output, pool, stderr, _, _ = run_step(tmp_path, 20, 20, offsets_of([0, 1]), **mapping)
    assert status != 0 and "which does not exist" in stderr, stderr
    assert_nothing_written(output, pool)


def test_a_mapping_without_a_row_for_the_layer_is_refused_before_any_step(tmp_path):
    """5 rows for layer_idx 5: configurePlugin refuses the shapes (the harness stops there)."""
    case, out, _, _ = write_case(tmp_path, 20, 20, offsets_of([0, 1]), num_layers=LAYER)
    done = subprocess.run([str(HARNESS), str(LIBRARY), str(case), str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "configurePlugin failed" in done.stderr, done.stderr
    assert f"maps {LAYER} layers, but the layer table's layer index is {LAYER}" in done.stderr, done.stderr
    assert not (out / "step0_status.txt").exists()


def test_a_kv_length_beyond_the_block_table_is_refused_and_writes_nothing(tmp_path):
    status, output, pool, stderr, _, _ = run_step(tmp_path, 20, MAX_BLOCKS * T + 1, offsets_of([0, 1]))
    assert status != 0 and "beyond its block table" in stderr, stderr
    assert_nothing_written(output, pool)


def test_block_table_entries_outside_the_pool_are_skipped(tmp_path):
    """Both blocks flagged as the secondary pool's, then negative: the step succeeds, the pool stays
    zero, and the tokens attend causally to the step's own rows only (nothing read from the pool)."""
    for i, blocks in enumerate(([POOL_TYPE_FLAG // 4, POOL_TYPE_FLAG // 4 + 1], [-1, -1])):
        status, output, pool, stderr, q, own = run_step(tmp_path / str(i), 20, 20, offsets_of(blocks))
        assert status == 0, stderr
        assert (pool == 0).all(), "a token was written through an entry outside the pool"
        got = torch.from_numpy(output.astype(np.int16)).view(torch.float16).float()
        want = reference_attention(q.float(), own[0].float(), own[1].float(), 1 / math.sqrt(D), own)
        err = (got - want).abs().max().item()
        assert err <= 5e-3, f"max abs error {err:.2e} against attention over the step's own rows"
