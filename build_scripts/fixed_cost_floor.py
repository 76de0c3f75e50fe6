"""The fixed cost's floor of a one-launch decode call (docs/DECODE_BUDGET.md, "Measurements that
decide it", step 1), on a CUDA GPU: plugin_cpp/kernels/bench/fixed_cost_floor.cu compiled with nvcc
and timed with tq-bench's timer (median of CUDA-event times, L2 flushed by a read before each
launch), beside an empty kernel and a one-element torch add_ (the timer's own floor).

    python build_scripts/fixed_cost_floor.py [--iters 500] [--json]

One row per shape (Llama-3-8B's attention: 8 KV heads, GQA 4, head_dim 128; 256 CTAs as the
split pass's plans at 1 x 131,072 and 32 x 32,768), with run_record's metadata.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tq_trtllm.eval.kernel_speed import Timer  # noqa: E402
from tq_trtllm.eval.run_record import run_metadata  # noqa: E402

SOURCE = ROOT / "plugin_cpp/kernels/bench/fixed_cost_floor.cu"
KV_HEADS, GROUP, HEAD_DIM, PAIRS, TOKENS_PER_BLOCK, CTAS = 8, 4, 128, 16, 64, 256
SHAPES = ((1, 131072), (32, 32768))
WHAT = ("timing-only floor of a one-launch decode call (one round of prologue reads, partial output, "
        "the last CTA of a row folding the splits; no tile loop)")


def build(out_dir: Path) -> ctypes.CDLL:
    lib = out_dir / "libtq_floor.so"
    subprocess.run(["nvcc", "-O3", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC", "-o", str(lib), str(SOURCE)],
                   check=True)
    return ctypes.CDLL(str(lib))


def floor_call(lib: ctypes.CDLL, batch: int, context: int):
    dev = torch.device("cuda")
    splits = CTAS // (batch * KV_HEADS)
    max_blocks = context // TOKENS_PER_BLOCK
    i32, f32 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.float32, device=dev)
    t = {
        "kv_lens": torch.full((batch,), context, **i32),
        "block_table": torch.arange(batch * 2 * max_blocks, **i32).view(batch, 2, max_blocks),
        "perm": torch.arange(HEAD_DIM, **i32).repeat(KV_HEADS),
        "mean": torch.zeros(KV_HEADS * HEAD_DIM, **f32),
        "scale": torch.ones(KV_HEADS * HEAD_DIM, **f32),
        "rot_channel": torch.arange(PAIRS, **i32).repeat(KV_HEADS),
        "rot_freq": torch.ones(KV_HEADS * PAIRS, **f32),
        "rot_mean": torch.zeros(KV_HEADS * PAIRS * 2, **f32),
        "q": torch.randn(batch, KV_HEADS * GROUP, HEAD_DIM, dtype=torch.float16, device=dev),
        "partial_o": torch.empty(batch * KV_HEADS * splits * GROUP * HEAD_DIM, **f32),
        "partial_lse": torch.empty(batch * KV_HEADS * splits * GROUP, **f32),
        "arrivals": torch.zeros(batch * KV_HEADS, **i32),
        "out": torch.empty(batch, KV_HEADS * GROUP, HEAD_DIM, dtype=torch.float16, device=dev),
    }
    ptrs = [ctypes.c_void_p(x.data_ptr()) for x in t.values()]
    ints = [ctypes.c_int32(v) for v in (batch, KV_HEADS, splits, max_blocks)]

    def call():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        err = lib.tq_floor_launch(*ptrs, *ints, stream)
        if err:
            raise RuntimeError(f"tq_floor_launch: CUDA error {err}")

    return call, splits, t


@click.command()
@click.option("--iters", type=click.IntRange(10), default=500, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def main(iters: int, rounds: int, as_json: bool) -> None:
    if not torch.cuda.is_available():
        raise click.ClickException("fixed_cost_floor needs a CUDA GPU")
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        timer = Timer(iters)
        one = torch.zeros(1, device="cuda")
        calls = {f"{b}x{c}": floor_call(lib, b, c) for b, c in SHAPES}
        stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)  # noqa: E731
        for r in range(rounds):
            empty_us = timer.median_us(lambda: lib.tq_floor_empty(stream()))
            add_us = timer.median_us(lambda: one.add_(1))
            for (batch, context), (name, (call, splits, t)) in zip(SHAPES, calls.items()):
                floor_us = timer.median_us(call)
                torch.cuda.synchronize()
                if splits > 1 and int(t["arrivals"].sum()) != 0:
                    raise click.ClickException("the last CTA of a row did not fold its splits")
                row = {"round": r, "batch": batch, "context": context, "kv_heads": KV_HEADS, "group": GROUP,
                       "head_dim": HEAD_DIM, "splits": splits, "ctas": batch * KV_HEADS * splits,
                       "floor_us": round(floor_us, 2), "empty_kernel_us": round(empty_us, 2),
                       "add_us": round(add_us, 2), "iters": iters}
                if as_json:  # a row of docs/results/benchmarks.jsonl
                    print(json.dumps({"what": WHAT, **run_metadata(), "figures": row}))
                else:
                    print(f"round {r} {name}: floor {floor_us:.2f} us ({splits} splits), empty kernel "
                          f"{empty_us:.2f} us, add_ {add_us:.2f} us")


if __name__ == "__main__":
    main()
