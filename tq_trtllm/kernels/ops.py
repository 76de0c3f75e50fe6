"""Torch-facing calls of the CUDA kernels: tensors' data pointers and the current stream go in.

KernelCache describes a PagedLayerCache (tq_trtllm.core.paged) on the GPU to the library; the
functions below launch on torch.cuda.current_stream() and raise TQError on any bad input.
"""

from __future__ import annotations

import copy
import ctypes
from functools import lru_cache

import torch

from ..core.errors import TQError
from ..core.paged import PagedLayerCache
from ..core.quantizer import VectorCodec
from ._lib import (BF16, FP16, MAX_DECODE_Q_LEN, TqAttentionParams, TqAttentionPlanInfo, TqCodec,
                   TqPagedCache, check, library)

_DTYPES = {torch.float16: FP16, torch.bfloat16: BF16}


def _dtype_code(dtype: torch.dtype) -> int:
    if dtype not in _DTYPES:
        raise TQError(f"the kernels take float16 or bfloat16 activations, got {dtype}")
    return _DTYPES[dtype]


def _stream() -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def _per_head(codec: VectorCodec, name: str, heads: int, dtype, device):
    """A [heads, head_dim] contiguous device copy of the codec's mean, scale or perm, or None."""
    t = codec.per_head(name, heads)
    return None if t is None else t.to(device=device, dtype=dtype).contiguous()


def codec_struct(codec: VectorCodec) -> TqCodec:
    """The library's tq_codec for the codec's width at its head_dim (tq_codec_init: the groups of
    FORMAT.md section 2, the codebooks as float32, the seed), without per-head tables."""
    if codec.rotation != "hadamard":
        raise TQError("the kernels implement the Hadamard rotation only")
    spec = codec.spec
    levels = torch.cat([torch.as_tensor(c).reshape(-1) for c in codec.codebooks]).to(torch.float32)
    books = (ctypes.c_float * levels.numel())(*levels.tolist())
    s = TqCodec()
    check(library().tq_codec_init(ctypes.byref(s), spec.head_dim, round(spec.width * 2), codec.seed,
                                  books, levels.numel()), "tq_codec_init")
    return s


class DeviceCodec:
    """tq_codec for one VectorCodec, holding the device tables its pointers name."""

    def __init__(self, codec: VectorCodec, num_kv_heads: int, device):
        s = codec_struct(codec)
        self.perm = _per_head(codec, "perm", num_kv_heads, torch.int32, device)
        self.mean = _per_head(codec, "mean", num_kv_heads, torch.float32, device)
        self.scale = _per_head(codec, "scale", num_kv_heads, torch.float32, device)
        s.perm = self.perm.data_ptr() if self.perm is not None else None
        s.mean = self.mean.data_ptr() if self.mean is not None else None
        s.scale = self.scale.data_ptr() if self.scale is not None else None
        rotary = codec.rotary
        if rotary is not None:  # tq_codec.rotary_*: channel a of each pair, frequency, mean
            self.rotary = (rotary.channels.to(device, torch.int32).contiguous(),
                           rotary.freq.to(device, torch.float32).contiguous(),
                           rotary.mean.to(device, torch.float32).contiguous())
            s.rotary_pairs = rotary.freq.shape[-1]
            s.rotary_channel, s.rotary_freq, s.rotary_mean = (t.data_ptr() for t in self.rotary)
        self.struct = s


class KernelCache:
    """tq_paged_cache over a PagedLayerCache whose pools live on a CUDA device.

    block_table: int32 [batch, 2, max_blocks] on the same device (chunk indices for K and V).
    page_lse_shift: the table's float [num_q_heads] shift of the cached positions' log-sum-exp
    (tq_paged_cache::page_lse_shift), or None.
    """

    def __init__(self, cache: PagedLayerCache, block_table: torch.Tensor,
                 page_lse_shift: torch.Tensor | None = None):
        pools = cache.pools
        if not all(p.is_cuda for p in pools):
            raise TQError("KernelCache needs the pools on a CUDA device")
        self.cache = cache
        device = pools[0].device
        h = cache.num_kv_heads
        self.key = DeviceCodec(cache.key, h, device)
        self.value = DeviceCodec(cache.value, h, device)
        s = TqPagedCache()
        s.k_pool, s.v_pool = pools[0].data_ptr(), pools[1].data_ptr()
        s.k_chunk_bytes, s.v_chunk_bytes = cache.chunk_bytes
        s.tokens_per_block = cache.tokens_per_block
        s.num_kv_heads = h
        s.num_chunks = pools[0].shape[0]
        s.key, s.value = self.key.struct, self.value.struct
        self.page_lse_shift = None
        if page_lse_shift is not None:
            self.page_lse_shift = page_lse_shift.to(device, torch.float32).contiguous()
            s.page_lse_shift = self.page_lse_shift.data_ptr()
        self.struct = s
        self._set_block_table(block_table)

    def _set_block_table(self, block_table: torch.Tensor) -> None:
        if not block_table.is_cuda:
            raise TQError("KernelCache needs the block table on a CUDA device")
        if block_table.dtype != torch.int32 or block_table.dim() != 3 or block_table.shape[1] != 2:
            raise TQError(f"block_table must be int32 [batch, 2, max_blocks], got "
                          f"{block_table.dtype} {list(block_table.shape)}")
        self.block_table = block_table.contiguous()
        self.struct.block_table = self.block_table.data_ptr()
        self.struct.max_blocks = self.block_table.shape[2]

    def over(self, block_table: torch.Tensor) -> KernelCache:
        """The same pools and codec tables under another block table (no tables uploaded again)."""
        other = copy.copy(self)
        other.struct = TqPagedCache.from_buffer_copy(self.struct)
        other._set_block_table(block_table)
        return other

    @property
    def batch(self) -> int:
        return self.block_table.shape[0]

    @property
    def head_dim(self) -> int:
        return self.cache.key.spec.head_dim


def page_bytes(codec: VectorCodec, tokens_per_block: int) -> int:
    """tq_page_bytes: the library's page size for a codec (it must equal PageLayout's)."""
    # page sizes depend on the widths alone: the codec without its per-head tables
    n = library().tq_page_bytes(ctypes.byref(codec_struct(codec)), tokens_per_block)
    if n < 0:
        raise TQError(f"tq_page_bytes failed: {library().tq_last_error().decode(errors='replace')}")
    return n


def _check_rows(name: str, t: torch.Tensor, heads: int, head_dim: int) -> None:
    if t.dim() != 3 or t.shape[1] != heads or t.shape[2] != head_dim or t.stride(2) != 1 \
            or t.stride(1) != head_dim:
        raise TQError(f"{name} must be [tokens, {heads}, {head_dim}] with contiguous heads, got "
                      f"{list(t.shape)} strides {t.stride()}")


def quantize_append(kc: KernelCache, k: torch.Tensor, v: torch.Tensor, seq_idx: torch.Tensor,
                    pos: torch.Tensor) -> None:
    """Quantize k, v ([n, num_kv_heads, head_dim], fp16/bf16) into (seq_idx[i], pos[i]). A row
    holding NaN or Inf is stored with NaN gains (FORMAT.md step 5): what reads it is NaN."""
    _check_unbiased(kc, "quantize_append")
    h, d = kc.cache.num_kv_heads, kc.head_dim
    _check_rows("k", k, h, d)
    _check_rows("v", v, h, d)
    if k.shape != v.shape or k.dtype != v.dtype or k.stride(0) != v.stride(0):
        raise TQError("k and v must share shape, dtype and token stride")
    seq_idx = seq_idx.to(device=k.device, dtype=torch.int32).contiguous()
    pos = pos.to(device=k.device, dtype=torch.int32).contiguous()
    if seq_idx.numel() != k.shape[0] or pos.numel() != k.shape[0]:
        raise TQError("seq_idx and pos need one entry per token")
    check(library().tq_quantize_append(
        ctypes.byref(kc.struct), k.data_ptr(), v.data_ptr(), k.stride(0), _dtype_code(k.dtype),
        seq_idx.data_ptr(), pos.data_ptr(), k.shape[0], kc.batch, _stream()), "tq_quantize_append")


def _check_unbiased(kc: KernelCache, what: str) -> None:
    if kc.cache.key.gain != "unbiased" or kc.cache.value.gain != "unbiased":
        # the kernels write the unbiased gain (FORMAT.md step 4.5); the reference would disagree
        raise TQError(f"{what} writes the unbiased gain only; the cache's codecs use "
                      f"{kc.cache.key.gain!r} (keys) and {kc.cache.value.gain!r} (values)")


@lru_cache(maxsize=64)
def attention_plan(batch: int, q_len: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                   max_kv_len: int, num_sms: int = 0) -> TqAttentionPlanInfo:
    """The library's plan (tq_attention_plan) for attention calls of this shape on num_sms SMs (0:
    the current device's): how the keys split over CTAs and the workspace the calls need. Cached
    per shape: a decode step plans once and every layer's call reuses it. Read-only."""
    plan = TqAttentionPlanInfo()
    check(library().tq_attention_plan(batch, q_len, num_q_heads, num_kv_heads, head_dim, max_kv_len,
                                      num_sms, ctypes.byref(plan)), "tq_attention_plan")
    return plan


@lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def workspace_bytes(batch: int, q_len: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                    max_kv_len: int) -> int:
    """Bytes of workspace for any attention call of at most this batch, q_len and max_kv_len on the
    current device (its plan's workspace_bytes)."""
    return attention_plan(batch, q_len, num_q_heads, num_kv_heads, head_dim, max_kv_len).workspace_bytes


def attention(kc: KernelCache, q: torch.Tensor, kv_lens: torch.Tensor, max_kv_len: int,
              softmax_scale: float | None = None, out: torch.Tensor | None = None,
              workspace: torch.Tensor | None = None, lse: torch.Tensor | None = None,
              own: tuple[torch.Tensor, torch.Tensor] | None = None, append: bool = False,
              plan: TqAttentionPlanInfo | None = None) -> torch.Tensor:
    """q: [batch, q_len, num_q_heads, head_dim]; the last q_len positions of each sequence, causal
    (tq_attention_run's contract).

    lse, if given (float32 [batch, q_len, num_q_heads], contiguous, on q's device), receives each
    row's natural-log log-sum-exp of softmax_scale * q . k over the keys it sees (-inf if none), to
    merge this attention with attention over keys outside the cache; the cached keys' part is
    lowered by kc's page_lse_shift, as in the output. own=(k, v), each
    [batch, q_len, num_kv_heads, head_dim] in q's dtype: the new tokens' keys and values, with which
    each query attends to the call's positions up to its own exactly (older ones through the cache:
    core.attention.reference_attention's rule). append=True (q_len up to MAX_DECODE_Q_LEN) first
    writes them at those positions (the quantize-append fused into the attention launch, rounding
    y itself, without step 4.4's scale search). plan: attention_plan(...) of this call's shape, or
    None for the cached plan of its shape on q's device. Returns out.
    """
    if append:
        if own is None:
            raise TQError("attention(append=True) needs own=(k, v), the rows to write")
        _check_unbiased(kc, "attention(append=True)")
    if q.dim() != 4 or q.shape[-1] != kc.head_dim or not q.is_contiguous():
        raise TQError(f"q must be contiguous [batch, q_len, num_q_heads, {kc.head_dim}], got "
                      f"{list(q.shape)}")
    batch, q_len, hq, d = q.shape
    if batch > kc.batch:
        raise TQError(f"q has batch {batch} but the block table has {kc.batch} rows")
    kv_lens = kv_lens.to(device=q.device, dtype=torch.int32).contiguous()
    if kv_lens.numel() != batch:
        raise TQError("kv_lens needs one length per sequence")
    out = torch.empty_like(q) if out is None else out
    if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise TQError("out must be a contiguous tensor shaped and typed like q")
    if lse is not None and (lse.shape != (batch, q_len, hq) or lse.dtype != torch.float32
                            or not lse.is_contiguous() or lse.device != q.device):
        raise TQError(f"lse must be a contiguous float32 [{batch}, {q_len}, {hq}] tensor on "
                      f"{q.device}, got {lse.dtype} {list(lse.shape)} on {lse.device}")
    if kc.page_lse_shift is not None and kc.page_lse_shift.shape != (hq,):
        raise TQError(f"page_lse_shift must hold one value per query head ({hq}), got "
                      f"{list(kc.page_lse_shift.shape)}")
    rows = None if own is None else _own_rows(kc, own, q)
    params = TqAttentionParams(cache=ctypes.pointer(kc.struct), q=q.data_ptr(), out=out.data_ptr(),
                               lse=None if lse is None else lse.data_ptr(), kv_lens=kv_lens.data_ptr(),
                               max_kv_len=max_kv_len, batch=batch, q_len=q_len, num_q_heads=hq,
                               softmax_scale=d**-0.5 if softmax_scale is None else softmax_scale,
                               dtype=_dtype_code(q.dtype), append=int(append))
    if own is not None:
        k, v = rows
        params.k_new, params.v_new, params.new_stride = k.data_ptr(), v.data_ptr(), k.stride(0)
    if plan is None:
        plan = attention_plan(batch, q_len, hq, kc.cache.num_kv_heads, d, max_kv_len,
                              _sm_count(q.device))
    if workspace is None:
        workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=q.device)
    check(library().tq_attention_run(ctypes.byref(plan), ctypes.byref(params), workspace.data_ptr(),
                                     workspace.numel() * workspace.element_size(), _stream()),
          "tq_attention_run")
    return out


def _own_rows(kc: KernelCache, own: tuple[torch.Tensor, torch.Tensor],
              q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The new tokens' (k, v), each [batch, q_len, num_kv_heads, head_dim] in q's dtype, as
    [batch * q_len, heads, head_dim] rows."""
    batch, q_len = q.shape[:2]
    h, d = kc.cache.num_kv_heads, kc.head_dim
    if any(x.dtype != q.dtype for x in own):
        raise TQError(f"own's k and v must have q's dtype {q.dtype}, got "
                      f"{own[0].dtype} and {own[1].dtype}")
    rows = []
    for name, x in zip("kv", own):
        if x.shape != (batch, q_len, h, d):
            raise TQError(f"own's {name} must be [{batch}, {q_len}, {h}, {d}], got {list(x.shape)}")
        x = x.reshape(batch * q_len, h, d)  # a view where the strides allow
        _check_rows(name, x, h, d)
        rows.append(x)
    if rows[0].stride(0) != rows[1].stride(0):
        raise TQError("own's k and v must share their token stride")
    return rows[0], rows[1]


def decode_attention(kc: KernelCache, q: torch.Tensor, kv_lens: torch.Tensor, max_kv_len: int,
                     softmax_scale: float | None = None, out: torch.Tensor | None = None,
                     workspace: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                     own: tuple[torch.Tensor, torch.Tensor] | None = None,
                     append: bool = False) -> torch.Tensor:
    """attention() of a decode step: q_len 1..MAX_DECODE_Q_LEN (the split pass)."""
    if q.dim() == 4 and not 1 <= q.shape[1] <= MAX_DECODE_Q_LEN:
        raise TQError(f"decode_attention takes q_len 1..{MAX_DECODE_Q_LEN}, got {q.shape[1]}; "
                      "use prefill_attention for a longer chunk")
    return attention(kc, q, kv_lens, max_kv_len, softmax_scale, out, workspace, lse, own, append)


def prefill_attention(kc: KernelCache, q: torch.Tensor, kv_lens: torch.Tensor, max_kv_len: int,
                      softmax_scale: float | None = None, out: torch.Tensor | None = None,
                      workspace: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                      own: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """attention() of a chunk of any number of new query tokens (causal)."""
    return attention(kc, q, kv_lens, max_kv_len, softmax_scale, out, workspace, lse, own)


def dequantize(kc: KernelCache, seq: int, start: int, length: int,
               dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of positions [start, start + length) of `seq`: [length, num_kv_heads, head_dim]."""
    shape = (length, kc.cache.num_kv_heads, kc.head_dim)
    device = kc.block_table.device
    k = torch.empty(shape, dtype=dtype, device=device)
    v = torch.empty(shape, dtype=dtype, device=device)
    check(library().tq_dequantize(ctypes.byref(kc.struct), seq, start, length, k.data_ptr(),
                                  v.data_ptr(), _dtype_code(dtype), _stream()), "tq_dequantize")
    return k, v
