"""QuantizedAttention end to end on the GPU, through TensorRT's plugin interfaces (header-only).

plugin_cpp/tests/plugin_harness.cpp dlopens libtq_attention_plugin.so, creates the plugin from the
fields written here, serializes and recreates it, and runs a sequence of in-flight-batching steps
(context only, generation only, mixed, a chunked context, then a step whose length overruns the
block table) against a pool laid out like TensorRT-LLM's. This test checks the outputs and the pool
bytes against the Python reference: codes and gains against VectorCodec.encode of the same
rotary-embedded keys and values, outputs against fp32 attention over the dequantized pool.
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from required import REQUIRE_PLUGIN, needs
from tq_trtllm.core.attention import reference_attention
from tq_trtllm.core.packing import PageLayout, read_tokens
from tq_trtllm.core.quantizer import Encoded
from tq_trtllm.trt.plugin_fields import layer_table_bytes, plugin_fields

from .cases import make_table

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TQ_PLUGIN_BUILD_DIR", ROOT / "build" / "plugin_cpp" / "plugin"))
LIBRARY, HARNESS = BUILD / "libtq_attention_plugin.so", BUILD / "tq_plugin_harness"
FIELD_TYPES = {np.dtype(np.int32): 5, np.dtype(np.float32): 1, np.dtype(np.int64): 10, np.dtype(np.uint8): 8}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

# Skipped where not built; failed instead where TQ_REQUIRE_PLUGIN=1 (the device scripts set it).
pytestmark = needs(None if LIBRARY.exists() and HARNESS.exists() else
                   f"the plugin and its harness are not built in {BUILD} (needs TensorRT headers: "
                   "build_scripts/fetch_trt_headers.md, build_scripts/build_kernels.sh)", REQUIRE_PLUGIN)

CASES = {
    "fp16-d128-k3.5v3-tables-llama3": dict(dtype="fp16", head_dim=128, hq=8, hkv=2, kw=3.5, vw=3.0, tables=True,
                                           T=16, rope=dict(rope_base=500000.0, rope_scaling="llama3",
                                                           rope_factor=8.0, rope_original_max_positions=64)),
    "bf16-d64-k3v4-gqa3": dict(dtype="bf16", head_dim=64, hq=9, hkv=3, kw=3.0, vw=4.0, tables=False, T=32,
                               rope=dict(rope_base=10000.0)),
    "fp16-d64-k5v4.5-tables": dict(dtype="fp16", head_dim=64, hq=9, hkv=3, kw=5.0, vw=4.5, tables=True, T=32,
                                   rope=dict(rope_base=10000.0)),  # format 3's widths
}
LAYER, LAYERS_IN_POOL, LAYER_IN_POOL, NUM_LAYERS = 5, 2, 1, 8

# Steps: (request id, kind, tokens this step). Request ids are sequences; each step lists context
# requests first, as TensorRT-LLM does.
STEPS = [
    [(0, "ctx", 37), (1, "ctx", 50)],              # context only
    [(0, "gen", 1), (1, "gen", 1)],                # generation only
    [(2, "ctx", 20), (0, "gen", 1), (1, "gen", 1)],  # mixed: a new request joins
    [(2, "ctx", 13), (1, "gen", 1)],               # mixed: a chunked context continues after 20 tokens
]
MAX_LEN = 64


def rope(x: torch.Tensor, pos: torch.Tensor, base: float, rope_scaling: str = "none", rope_factor: float = 1.0,
         rope_low_freq_factor: float = 1.0, rope_high_freq_factor: float = 4.0,
         rope_original_max_positions: int = 8192) -> torch.Tensor:
    """GPT-NeoX / Llama rotary embedding in float64, with HF transformers' linear and llama3 scaling."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    if rope_scaling == "linear":
        inv = inv / rope_factor
    elif rope_scaling == "llama3":
        wavelen = 2 * math.pi / inv
        low, high = rope_original_max_positions / rope_low_freq_factor, rope_original_max_positions / rope_high_freq_factor
        smooth = (rope_original_max_positions / wavelen - rope_low_freq_factor) / (rope_high_freq_factor - rope_low_freq_factor)
        mid = (1 - smooth) * inv / rope_factor + smooth * inv
        inv = torch.where(wavelen < high, inv, torch.where(wavelen > low, inv / rope_factor, mid))
    ang = pos.to(torch.float64)[:, None, None] * inv
    x = x.to(torch.float64)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], dim=-1)


def write_fields(path: Path, fields: dict) -> None:
    with open(path, "wb") as f:
        for name, value in fields.items():
            f.write(name.encode() + b"\0")
            f.write(np.array([FIELD_TYPES[value.dtype], value.size], dtype=np.int32).tobytes())
            f.write(value.tobytes())


def test_plugin_steps_match_reference(tmp_path):
    for name, case in CASES.items():
        run_case(tmp_path / name, case)


def encode_as_written(codec, x, searched, positions=None):
    """The reference's encoding of rows x [n, H, d]: with step 4.4's search where searched [n] is
    True, y itself rounded elsewhere."""
    a, b = codec.encode(x, positions), codec.encode(x, positions, search=False)
    mask = searched.view(-1, 1, 1)  # codes [n, H, n_g], norms [n, H, G]
    return Encoded([torch.where(mask, u, w) for u, w in zip(a.codes, b.codes)], torch.where(mask, a.norms, b.norms))


def run_case(work: Path, case: dict) -> None:
    case_dir, out_dir = work / "case", work / "out"
    case_dir.mkdir(parents=True)
    out_dir.mkdir()
    gen = torch.Generator().manual_seed(2026)
    d, hq, hkv, T = case["head_dim"], case["hq"], case["hkv"], case["T"]
    dtype = DTYPES[case["dtype"]]
    # calibrated cases carry a page shift and a key rotary mean too (the kernels lower the cached
    # positions by the one and restore the other at each position)
    table = make_table(d, case["kw"], case["vw"], hkv, hq, gen, layer=LAYER, seed=77, tables=case["tables"],
                       page_shift=case["tables"])
    key, value = table.codecs(LAYER)
    blob = layer_table_bytes(table, LAYER, num_q_heads=hq, num_kv_heads=hkv, fingerprint=0xFEEDC0DE12345678)
    fields = plugin_fields(blob, tokens_per_block=T, **case["rope"])
    write_fields(case_dir / "fields.bin", fields)
    layouts = (PageLayout(key.spec, T), PageLayout(value.spec, T))
    head_size = max(key.spec.bytes_per_token, value.spec.bytes_per_token)  # what the builder declares
    chunk = hkv * T * head_size

    # Blocks: every sequence gets max_blocks shuffled blocks of the pool.
    num_seqs, max_blocks = 3, MAX_LEN // T
    num_blocks = num_seqs * max_blocks + 3
    blocks = torch.randperm(num_blocks, generator=gen)[: num_seqs * max_blocks].reshape(num_seqs, max_blocks)
    rope_args = {k: v for k, v in case["rope"].items() if k != "rope_base"}

    # per sequence, in position order: (k_rot, v, searched) rows; context rows go through
    # tq_quantize_append (step 4.4's scale search), generation rows through the fused append of
    # decode attention (y itself rounded)
    history = {s: [] for s in range(num_seqs)}
    expected_rows = []  # per step: (sequence, KV length, q rows, own (k, v) rows) per request
    steps = STEPS + [[(0, "gen", 1)]]  # the last one overruns the block table (below)
    for i, step in enumerate(steps):
        batch, tokens = len(step), sum(n for _, _, n in step)
        types = [0 if kind == "ctx" else 1 for _, kind, _ in step]
        past, ctx, qkv_rows, q_rot = [], [], [], []
        for seq, kind, n in step:
            start = len(history[seq])
            if i == len(steps) - 1:
                start = MAX_LEN  # KV length MAX_LEN + 1: beyond the block table
            x = torch.randn(n, hq + 2 * hkv, d, generator=gen).to(dtype)
            qkv_rows.append(x.reshape(n, -1))
            pos = torch.arange(start, start + n)
            q = rope(x[:, :hq], pos, case["rope"]["rope_base"], **rope_args).to(dtype)
            k = rope(x[:, hq:hq + hkv], pos, case["rope"]["rope_base"], **rope_args).to(dtype)
            if i < len(steps) - 1:
                history[seq] += [(kr, vr, kind == "ctx") for kr, vr in zip(k, x[:, hq + hkv:])]
            q_rot.append((seq, start + n, q, (k, x[:, hq + hkv:])))  # own rows: attended exactly
            past.append(start + n if kind == "ctx" else start)
            ctx.append(n if kind == "ctx" else 99)  # generation rows hold the prompt length in TRT-LLM
        meta = np.array([batch, tokens] + types + past + ctx, dtype=np.int32)
        (case_dir / f"step{i}_meta.bin").write_bytes(meta.tobytes())
        (case_dir / f"step{i}_qkv.bin").write_bytes(torch.cat(qkv_rows).view(torch.int16).numpy().tobytes())
        offsets = torch.stack([torch.stack([blocks[s] * LAYERS_IN_POOL * 2 + kv for kv in range(2)])
                               for s, _, _ in step]).to(torch.int32)  # [batch, 2, max_blocks], beam 1
        (case_dir / f"step{i}_offsets.bin").write_bytes(offsets.numpy().tobytes())
        expected_rows.append(q_rot)
    (case_dir / "case.txt").write_text(
        f"dtype {case['dtype']}\nheads {hq} {hkv} {d} {LAYER}\n"
        f"pool {num_blocks} {LAYERS_IN_POOL} {LAYER_IN_POOL} {NUM_LAYERS}\n"
        f"chunk_bytes {chunk}\nmax_blocks {max_blocks}\nsteps {len(steps)}\n")

    done = subprocess.run([str(HARNESS), str(LIBRARY), str(case_dir), str(out_dir)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    statuses = [int((out_dir / f"step{i}_status.txt").read_text()) for i in range(len(steps))]
    assert statuses[:-1] == [0] * len(STEPS), (statuses, done.stderr)
    assert statuses[-1] != 0 and "beyond its block table" in done.stderr, done.stderr

    # The pool: [blocks][layers in pool][K, V][chunk]; this layer's pages are head-major in a chunk.
    pool = torch.from_numpy(np.fromfile(out_dir / "pool.bin", dtype=np.uint8)).reshape(
        num_blocks, LAYERS_IN_POOL, 2, chunk)

    def stored(seq: int, length: int):
        """Encodings read back from the harness's pool for positions [0, length) of `seq`: K and V."""
        pos = torch.arange(length)
        block = blocks[seq][pos // T]
        out = []
        for kv, layout in enumerate(layouts):
            pages = pool[:, LAYER_IN_POOL, kv, : hkv * layout.page_bytes].reshape(num_blocks * hkv, layout.page_bytes)
            page = block[:, None] * hkv + torch.arange(hkv)
            out.append(read_tokens(pages, layout, page, (pos % T)[:, None].expand_as(page)))
        return out

    for seq, rows in history.items():
        searched = torch.tensor([s for _, _, s in rows])
        k_ref = encode_as_written(key, torch.stack([k for k, _, _ in rows]), searched, torch.arange(len(rows)))
        v_ref = encode_as_written(value, torch.stack([v for _, v, _ in rows]), searched)
        for ref, got in zip((k_ref, v_ref), stored(seq, len(rows))):
            same = sum(int((a == b).sum()) for a, b in zip(ref.codes, got.codes))
            total = sum(a.numel() for a in ref.codes)
            assert same / total >= 0.999, f"sequence {seq}: {total - same} of {total} codes differ"
            # the gain depends on the codes: compare it where the group's codes agree
            agree = torch.stack([(a == b).all(dim=-1) for a, b in zip(ref.codes, got.codes)], dim=-1)
            rel = ((ref.norms.float() - got.norms.float()).abs() / ref.norms.float().clamp_min(1e-3))[agree]
            assert float(rel.max()) <= 2 ** -10 * 1.01, f"sequence {seq}: gains differ by {float(rel.max())}"

    atol = 5e-3 if dtype == torch.float16 else 2e-2
    for i, q_rot in enumerate(expected_rows[:-1]):
        out = torch.from_numpy(np.fromfile(out_dir / f"step{i}_out.bin", dtype=np.int16)).view(dtype)
        out = out.reshape(-1, hq, d).float()
        row = 0
        for seq, kv_len, q, own in q_rot:
            k_enc, v_enc = stored(seq, kv_len)
            ref = reference_attention(q.float(), key.decode(k_enc, positions=torch.arange(kv_len)),
                                      value.decode(v_enc), 1 / math.sqrt(d), own, shift)
            got = out[row: row + q.shape[0]]
            assert torch.isfinite(got).all(), f"step {i}, sequence {seq}: non-finite output"
            err = float((got - ref).abs().max())
            assert err <= atol, f"step {i}, sequence {seq}: max abs error {err:.2e} > {atol}"
            row += q.shape[0]
