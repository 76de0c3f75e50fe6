"""Timing the CUDA kernels against torch SDPA over an fp16 cache, in one process (tq-bench).

Every measurement is the median of per-launch CUDA-event times with the L2 cache flushed before each
launch (a decode step of a real model finds the cache cold: the other layers evicted it), for both
the kernels and the baseline; an engine step is also timed as its layers' calls back to back in
one CUDA graph. The packed cache is filled by the kernels' own quantize-append from
unit-normal vectors, so the data are realistic.
"""

from __future__ import annotations

import ctypes
import statistics
from collections import Counter
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..core.paged import PagedLayerCache
from ..core.quantizer import VectorCodec
from ..core.rotary_mean import select_pairs
from ..core.spec import CodecSpec
from ..kernels import KernelCache, attention_plan, library, quantize_append
from ..kernels._lib import TqAttentionParams
from ..kernels.ops import _dtype_code
from .fp8_baseline import flashinfer_missing, fp8_bytes_per_token, fp8_decode_us

FLUSH_BYTES = 256 << 20
ROPE_BASE = 500000.0  # Llama 3's, for the rotary mean's frequencies


@dataclass
class Row:
    bench: str
    batch: int
    context: int
    q_len: int
    q_heads: int
    kv_heads: int
    head_dim: int
    k_bits: float
    v_bits: float
    tq_us: float
    sdpa_us: float
    speedup: float
    packed_mb: float
    tq_read_tbps: float
    # tq_quantize_append of the call's new rows (a decode step's, or a prefill chunk's in bulk), its
    # own launch, and as % of tq_us
    append_us: float | None = None
    append_pct: float | None = None
    fused_us: float | None = None    # the same append fused in (tq_attention_params::append)
    fused_append_pct: float | None = None  # (fused_us - tq_us) as % of tq_us
    rotary_pairs: int = 0  # the keys' rotary mean (calibrated tables have one), pairs per KV head
    # FlashInfer's paged decode over an FP8 (e4m3) cache at the same shape (eval/fp8_baseline.py),
    # the faster of its two paths; None where FlashInfer is absent or q_len > 1
    fp8_us: float | None = None
    fp8_path: str | None = None
    speedup_vs_fp8: float | None = None  # fp8_us / tq_us
    # KV cache bytes per token (all KV heads, keys and values) of each cache
    tq_bytes_per_token: float | None = None
    fp16_bytes_per_token: int | None = None
    fp8_bytes_per_token: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


class Timer:
    """flush: how the L2 is emptied before each launch. "read" reads a buffer five times its size,
    which leaves it clean; "write" (zeroing the buffer) leaves it full of dirty lines, whose
    write-back then takes HBM bandwidth from the timed launch, which slows a bandwidth-bound
    baseline more than the kernels (docs/BENCHMARKS.md#the-l2-flush)."""

    def __init__(self, iters: int, warmup: int = 3, flush: str = "read"):
        self.iters, self.warmup = iters, warmup
        self.flush_buffer = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self.flush = {"read": lambda: self.flush_buffer.max(), "write": self.flush_buffer.zero_}[flush]

    def median_us(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.iters):
            self.flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in times)

    def graph_us(self, calls) -> float:
        """The calls launched back to back, as one CUDA graph (as an engine's decode step runs
        them: no host launch cost between kernels), timed like one launch."""
        for call in calls:  # first launches outside the capture (kernel attributes, lazy init)
            call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for call in calls:
                call()
        return self.median_us(graph.replay)


def packed_cache(batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int,
                 k_bits: float, v_bits: float, tokens_per_block: int = 64, rotary_pairs: int = 0):
    """A filled packed cache of `batch` sequences of `context` tokens; its KernelCache. With
    rotary_pairs, the keys have a rotary mean on that many random pairs."""
    rotary = None
    if rotary_pairs:
        inv_freq = ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        rotary = select_pairs(torch.randn(kv_heads, head_dim, dtype=torch.float64), inv_freq, rotary_pairs)
    key = VectorCodec(CodecSpec(head_dim, k_bits), seed=1, rotary=rotary)
    value = VectorCodec(CodecSpec(head_dim, v_bits), seed=2)
    blocks = (context + tokens_per_block - 1) // tokens_per_block
    cache = PagedLayerCache(key, value, kv_heads, tokens_per_block, batch * blocks * 2, "cuda")
    table = torch.randperm(batch * blocks * 2, device="cuda").int().view(batch, 2, blocks)
    kc = KernelCache(cache, table)
    step = max(1, (1 << 22) // (kv_heads * head_dim))  # tokens per fill launch
    for b in range(batch):
        for p0 in range(0, context, step):
            n = min(step, context - p0)
            x = torch.randn(2, n, kv_heads, head_dim, device="cuda", dtype=torch.float16)
            quantize_append(kc, x[0], x[1], torch.full((n,), b, device="cuda", dtype=torch.int32),
                            torch.arange(p0, p0 + n, device="cuda", dtype=torch.int32))
    return cache, kc


def raw_attention_call(kc: KernelCache, q: torch.Tensor, kv_lens: torch.Tensor, max_kv_len: int,
                       new: torch.Tensor | None = None, append: bool = False):
    """The library call (tq_attention_run) with every argument prepared once (no per-call Python
    allocation) and the plan of its shape, which calls of the same shape share (attention_plan);
    new: the new tokens' rows [2, batch * q_len, kv_heads, head_dim] (k_new, v_new), or None;
    append: write them into the pages first (the fused append)."""
    batch, q_len, hq, d = q.shape
    out = torch.empty_like(q)
    plan = attention_plan(batch, q_len, hq, kc.cache.num_kv_heads, d, max_kv_len)
    ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    params = TqAttentionParams(cache=ctypes.pointer(kc.struct), q=q.data_ptr(), out=out.data_ptr(),
                               kv_lens=kv_lens.data_ptr(), max_kv_len=max_kv_len, batch=batch,
                               q_len=q_len, num_q_heads=hq, softmax_scale=d**-0.5,
                               dtype=_dtype_code(q.dtype), append=int(append))
    if new is not None:
        params.k_new, params.v_new, params.new_stride = new[0].data_ptr(), new[1].data_ptr(), new.stride(1)
    args = (ctypes.byref(plan), ctypes.byref(params), ws.data_ptr(), ws.numel())
    run = library().tq_attention_run

    def call():  # on the stream current at the call (a graph capture's)
        status = run(*args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if status:
            raise RuntimeError(library().tq_last_error().decode())
    call.buffers = (out, ws, params)  # args hold raw pointers: the call keeps what they point to alive
    return call, out


@dataclass
class DecodeCase:
    """One layer's decode step over a filled packed cache: its inputs, and the step's new rows
    (q_len tokens per sequence at the last positions, attended to exactly)."""
    kc: KernelCache
    context: int
    q: torch.Tensor
    lens: torch.Tensor
    kv_new: torch.Tensor  # [2, batch * q_len, kv_heads, head_dim]: k_new, v_new
    k_bits: float
    v_bits: float
    rotary_pairs: int

    def call(self, append: bool = False):
        return raw_attention_call(self.kc, self.q, self.lens, self.context, self.kv_new, append)[0]


def decode_case(batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int,
                k_bits: float, v_bits: float, q_len: int = 1, rotary_pairs: int = 0) -> DecodeCase:
    _, kc = packed_cache(batch, context, q_heads, kv_heads, head_dim, k_bits, v_bits,
                         rotary_pairs=rotary_pairs)
    q = torch.randn(batch, q_len, q_heads, head_dim, device="cuda", dtype=torch.float16)
    lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    kv_new = torch.randn(2, batch * q_len, kv_heads, head_dim, device="cuda", dtype=torch.float16)
    return DecodeCase(kc, context, q, lens, kv_new, k_bits, v_bits, rotary_pairs)


def decode_row(timer: Timer, batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int,
               k_bits: float, v_bits: float, q_len: int = 1, rotary_pairs: int = 0) -> Row:
    return case_row(timer, decode_case(batch, context, q_heads, kv_heads, head_dim, k_bits, v_bits,
                                       q_len, rotary_pairs))


def case_row(timer: Timer, case: DecodeCase) -> Row:
    """The decode row of a prepared case: its calls, a separate append of its new rows and SDPA at
    its shape, each timed alone."""
    kc, kv_new, context, k_bits, v_bits = case.kc, case.kv_new, case.context, case.k_bits, case.v_bits
    batch, q_len, q_heads, head_dim = case.q.shape
    kv_heads = kc.cache.num_kv_heads
    tq_us = timer.median_us(case.call())
    append_us = append_time(timer, kc, kv_new, batch, context, q_len)
    fused_us = timer.median_us(case.call(append=True))
    sdpa_us = timer.median_us(sdpa_decode_call(batch, context, q_heads, kv_heads, head_dim, q_len))
    fp8_us = fp8_path = None
    if q_len == 1 and flashinfer_missing() is None:
        fp8_us, fp8_path = fp8_decode_us(timer, batch, context, q_heads, kv_heads, head_dim)
    nbytes = packed_bytes_of(batch, context, kv_heads, head_dim, k_bits, v_bits)
    return Row("decode", batch, context, q_len, q_heads, kv_heads, head_dim, k_bits, v_bits,
               tq_us, sdpa_us, sdpa_us / tq_us, nbytes / 1e6, nbytes / tq_us / 1e6, append_us,
               100.0 * append_us / tq_us, fused_us, 100.0 * (fused_us - tq_us) / tq_us, case.rotary_pairs,
               fp8_us, fp8_path, None if fp8_us is None else fp8_us / tq_us,
               nbytes / (batch * context), 2 * fp8_bytes_per_token(kv_heads, head_dim),
               fp8_bytes_per_token(kv_heads, head_dim))


@dataclass
class StepRow:
    """One decode step's attention over every layer of an engine, each at its own K/V widths:
    each call timed alone (cache cold, launch included) and summed, and the layers' calls back to
    back in one CUDA graph, as an engine's decode step runs them (each layer its own cache; the L2
    flushed once, before the step)."""
    batch: int
    context: int
    layers: int
    tq_us: float     # the layers' attention times (tq_attention_run), summed
    fused_us: float  # ... with the append fused in, summed
    sdpa_us: float   # SDPA over an fp16 cache in every layer
    speedup: float   # sdpa_us / tq_us
    tq_graph_us: float     # the attention in every layer, one CUDA graph
    fused_graph_us: float  # ... with the append fused in
    sdpa_graph_us: float   # SDPA ...
    graph_speedup: float   # sdpa_graph_us / tq_graph_us
    bench: str = "step"

    def as_dict(self) -> dict:
        return asdict(self)


def engine_step(timer: Timer, batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int,
                layer_widths: list[tuple[float, float]],
                rotary_pairs: int = 0) -> tuple[list[tuple[int, Row]], StepRow]:
    """Times one decode row per distinct (key, value) width pair of the layers (on the first such
    layer's case), each with the count of layers that have it, and adds them up as the layers run,
    one after another (each finds its cache cold); then times the whole step's calls back to back,
    as one CUDA graph."""
    cases = [decode_case(batch, context, q_heads, kv_heads, head_dim, k, v, 1, rotary_pairs)
             for k, v in layer_widths]
    first = {}  # width pair -> its first layer's case
    for widths, case in zip(layer_widths, cases):
        first.setdefault(widths, case)
    rows = [(n, case_row(timer, first[widths])) for widths, n in Counter(layer_widths).items()]

    def total(attr: str) -> float:
        return sum(n * getattr(r, attr) for n, r in rows)
    tq_graph = timer.graph_us([c.call() for c in cases])
    fused_graph = timer.graph_us([c.call(append=True) for c in cases])
    sdpa_graph = timer.graph_us([sdpa_decode_call(batch, context, q_heads, kv_heads, head_dim, 1)
                               for _ in layer_widths])
    tq_us, sdpa_us = total("tq_us"), total("sdpa_us")
    return rows, StepRow(batch, context, len(layer_widths), tq_us, total("fused_us"), sdpa_us,
                         sdpa_us / tq_us, tq_graph, fused_graph, sdpa_graph, sdpa_graph / tq_graph)


def append_time(timer: Timer, kc: KernelCache, kv_new: torch.Tensor, batch: int, context: int,
                q_len: int) -> float:
    """tq_quantize_append of kv_new ([2, batch * q_len, kv heads, d]) at the last q_len positions of
    each sequence of `context` tokens."""
    seq = torch.arange(batch, device="cuda", dtype=torch.int32).repeat_interleave(q_len)
    pos = (context - q_len + torch.arange(q_len, device="cuda", dtype=torch.int32)).repeat(batch)
    return timer.median_us(lambda: quantize_append(kc, kv_new[0], kv_new[1], seq, pos))


def packed_bytes_of(batch, context, kv_heads, head_dim, k_bits, v_bits) -> int:
    per_token = CodecSpec(head_dim, k_bits).bytes_per_token + CodecSpec(head_dim, v_bits).bytes_per_token
    return batch * context * kv_heads * per_token


def sdpa_decode_call(batch, context, q_heads, kv_heads, head_dim, q_len):
    """SDPA over an fp16 cache of its own (enable_gqa), as a call with its inputs prepared."""
    q = torch.randn(batch, q_heads, q_len, head_dim, device="cuda", dtype=torch.float16)
    k = torch.randn(batch, kv_heads, context, head_dim, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    mask = None
    if q_len > 1:  # the new tokens sit at the end: bottom-right causal
        qpos = torch.arange(context - q_len, context, device="cuda")[:, None]
        mask = torch.arange(context, device="cuda")[None, :] <= qpos
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def prefill_row(timer: Timer, history: int, chunk: int, q_heads: int, kv_heads: int,
                head_dim: int, k_bits: float, v_bits: float, rotary_pairs: int = 0) -> Row:
    """Chunked prefill of `chunk` tokens over `history` packed ones, the chunk's bulk append (which
    precedes it in a step), and SDPA with the equivalent causal mask, each timed alone."""
    total = history + chunk
    _, kc = packed_cache(1, total, q_heads, kv_heads, head_dim, k_bits, v_bits,
                         rotary_pairs=rotary_pairs)
    q = torch.randn(1, chunk, q_heads, head_dim, device="cuda", dtype=torch.float16)
    lens = torch.full((1,), total, device="cuda", dtype=torch.int32)
    kv_new = torch.randn(2, chunk, kv_heads, head_dim, device="cuda", dtype=torch.float16)
    call, _ = raw_attention_call(kc, q, lens, total, kv_new)
    tq_us = timer.median_us(call)
    append_us = append_time(timer, kc, kv_new, 1, total, chunk)
    sdpa_us = timer.median_us(sdpa_decode_call(1, total, q_heads, kv_heads, head_dim, chunk))
    nbytes = packed_bytes_of(1, total, kv_heads, head_dim, k_bits, v_bits)
    return Row("prefill", 1, total, chunk, q_heads, kv_heads, head_dim, k_bits, v_bits, tq_us,
               sdpa_us, sdpa_us / tq_us, nbytes / 1e6, nbytes / tq_us / 1e6, append_us,
               100.0 * append_us / tq_us, rotary_pairs=rotary_pairs)
