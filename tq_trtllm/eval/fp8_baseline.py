"""The FP8 KV cache baseline of tq-bench decode: FlashInfer's paged decode over an e4m3 cache.

On Hopper the KV cache a TensorRT-LLM or vLLM user picks today is FP8 (e4m3, one byte per
coordinate, half of FP16's bytes). FlashInfer (flashinfer-python) is the maintained library whose
paged decode serves it in vLLM and SGLang; it JIT-compiles its kernels with the local nvcc on first
use. Where it is not installed the bench leaves the FP8 column empty and says why once.

Both of FlashInfer's decode paths are timed, the CUDA-core decode kernel and the tensor-core one
(`use_tensor_cores=True`, which its documentation advises for grouped-query heads), and the faster
one is the baseline, so the comparison is against FP8 at its best.
"""

from __future__ import annotations

import torch

PAGE_SIZE = 16  # tokens per page: vLLM's and TensorRT-LLM's common default for FP8 caches
WORKSPACE_BYTES = 256 << 20
FP8 = torch.float8_e4m3fn


def fp8_bytes_per_token(kv_heads: int, head_dim: int) -> int:
    """Bytes per token of an e4m3 cache (keys and values, one byte a coordinate, no scales: the
    per-tensor scale is one float for the whole cache)."""
    return 2 * kv_heads * head_dim


def flashinfer_missing() -> str | None:
    """None where FlashInfer's paged decode can run here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # an absent package or one that fails to import: the same answer
        return f"flashinfer-python is not importable ({type(exc).__name__}: {exc})"
    return None


def fp8_decode_calls(batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int):
    """{path name: call} for one decode step of `batch` sequences of `context` tokens over a random
    e4m3 paged cache, each call with its plan made once (as an engine plans once per step)."""
    import flashinfer

    pages_per_seq = (context + PAGE_SIZE - 1) // PAGE_SIZE
    num_pages = batch * pages_per_seq
    kv = torch.randn(num_pages, 2, PAGE_SIZE, kv_heads, head_dim, device="cuda",
                     dtype=torch.float16).to(FP8)
    # Pages in a random order, as a paged cache's allocator leaves them.
    indices = torch.randperm(num_pages, device="cuda", dtype=torch.int32)
    indptr = torch.arange(0, num_pages + 1, pages_per_seq, device="cuda", dtype=torch.int32)
    last = torch.full((batch,), context - (pages_per_seq - 1) * PAGE_SIZE, device="cuda",
                      dtype=torch.int32)
    q = torch.randn(batch, q_heads, head_dim, device="cuda", dtype=torch.float16)
    calls = {}
    for name, tensor_cores in (("cuda_cores", False), ("tensor_cores", True)):
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                                use_tensor_cores=tensor_cores)
        wrapper.plan(indptr, indices, last, q_heads, kv_heads, head_dim, PAGE_SIZE,
                     pos_encoding_mode="NONE", q_data_type=torch.float16, kv_data_type=FP8)

        def call(wrapper=wrapper):
            return wrapper.run(q, kv)
        call.buffers = (workspace, kv, q, indices, indptr, last)
        calls[name] = call
    return calls


def fp8_decode_us(timer, batch: int, context: int, q_heads: int, kv_heads: int,
                  head_dim: int) -> tuple[float, str]:
    """The faster of FlashInfer's two FP8 decode paths at this shape, timed like the kernels
    (median, L2 flushed before each launch): (microseconds, path name)."""
    times = {name: timer.median_us(call)
             for name, call in fp8_decode_calls(batch, context, q_heads, kv_heads, head_dim).items()}
    best = min(times, key=times.get)
    return times[best], best
