// attention.cu: tq_attention_run, the attention passes over the packed paged cache, and the one
// translation unit of their kernels (the plan: attention_plan.cpp).
//
// A call runs up to three passes, each a role of its own:
// - the chunk pass (chunk_attention.cu) for calls with new rows longer than kMaxMergeChunk tokens:
//   each query row's attention over the call's positions up to its own with the new rows, exactly;
// - the split pass (split_kernel.cuh; decode and short chunks) or the prefill pass
//   (prefill_attention.cu; long chunks): one partial softmax state per KV split of every query row;
// - the merge pass (merge_kernel.cuh): merges the splits and the chunk term, rotates back, writes
//   the output and the log-sum-exp.
// Their arguments (AttnArgs) and the workspace: attention_params.cuh; their shapes (warps, stages,
// CTAs per SM): attention_traits.h and split_kernel.cuh (the shared-memory plan). Every pair of the
// allocator's widths with values no wider than keys gets split kernels whose tile offsets and
// widths are compile-time constants (tile_shape, special_split_kernel); every other pair runs the
// same code with them read at run time.
#include <algorithm>
#include <cmath>

#include "attention_plan.h"
#include "errors.h"
#include "merge_kernel.cuh"
#include "split_kernel.cuh"

namespace tq {
namespace {

int smem_per_sm() {
  static int bytes = 0;
  if (!bytes) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess)
      bytes = 228 * 1024;  // an H200's
  }
  return bytes;
}

// Whether CTAs of kWideWarps fit ctas_per_sm(1, kWideWarps) per SM (wide codes need more stages'
// bytes), with the 1 KB that the runtime keeps per CTA.
bool wide_ctas_fit(const AttnArgs& a) {
  const int bytes = smem_plan(a.cache.codec[0].head_dim, kWideWarps, a.chunk[0], a.chunk[1],
                              a.cache.codec[0].rotary_pairs > 0).total;
  return ctas_per_sm(1, kWideWarps) * (bytes + 1024) <= smem_per_sm();
}

// The generic split kernel for these codecs' groups, decoding codes of up to MAXB bits.
template <int D, int MAXB, int NR, int W, typename T, bool E>
void (*generic_split_kernel(int kg, int vg))(AttnArgs) {
  if (kg == 1) return vg == 1 ? attention_split_kernel<D, 1, 1, 0, 0, MAXB, NR, W, T, E> : attention_split_kernel<D, 1, 2, 0, 0, MAXB, NR, W, T, E>;
  return vg == 1 ? attention_split_kernel<D, 2, 1, 0, 0, MAXB, NR, W, T, E> : attention_split_kernel<D, 2, 2, 0, 0, MAXB, NR, W, T, E>;
}

// The widths with kernels of their own, narrowest first: those the allocator gives
// (calibration/allocate.py: 2, 2.5, 3, 3.5, 4 and 5 bits) as (groups, bits of group 0). A
// fractional width's second group is one bit narrower (FORMAT.md section 2; make_layout refuses
// any other), so these two numbers name a width.
struct Width {
  int groups, bits;
};
constexpr Width kSpecialWidths[] = {{1, 2}, {2, 3}, {1, 3}, {2, 4}, {1, 4}, {1, 5}};
constexpr int kNumSpecialWidths = sizeof(kSpecialWidths) / sizeof(kSpecialWidths[0]);

__host__ inline bool has_width(const PageShape& s, Width w) {
  return s.num_groups == w.groups && s.group[0].bits == w.bits;
}

// The specialized split kernel of these codecs' widths, among the pairs whose value width is no
// wider than the key width (what calibrated engines have), from pair (KI, VI) of kSpecialWidths
// on; nullptr for any other pair.
template <int D, int NR, int W, typename T, bool E, int KI = 0, int VI = 0>
void (*special_split_kernel(const CacheView& c))(AttnArgs) {
  if constexpr (KI == kNumSpecialWidths) {
    return nullptr;
  } else if constexpr (VI > KI) {
    return special_split_kernel<D, NR, W, T, E, KI + 1, 0>(c);
  } else {
    constexpr Width k = kSpecialWidths[KI], v = kSpecialWidths[VI];
    if (has_width(c.codec[0], k) && has_width(c.codec[1], v))
      return attention_split_kernel<D, k.groups, v.groups, k.bits, v.bits, std::max(k.bits, v.bits), NR, W, T, E>;
    return special_split_kernel<D, NR, W, T, E, KI, VI + 1>(c);
  }
}

// The split kernel for these codecs: specialized for their widths where it exists, else generic.
template <int D, int NR, int W, typename T, bool E>
void (*split_kernel_for(const CacheView& c))(AttnArgs) {
  if (auto kernel = special_split_kernel<D, NR, W, T, E>(c)) return kernel;
  const int kg = c.codec[0].num_groups, vg = c.codec[1].num_groups;
  return has_5bit_codes(c) ? generic_split_kernel<D, 5, NR, W, T, E>(kg, vg) : generic_split_kernel<D, 4, NR, W, T, E>(kg, vg);
}

// The split kernel of a call of `warps` warps per CTA.
template <int D, typename T, bool E>
void (*split_kernel_of(const AttnArgs& a, int warps))(AttnArgs) {
  return warps == kWideWarps      ? split_kernel_for<D, 1, kWideWarps, T, E>(a.cache)
         : row_ntiles(a.rows) == 1 ? split_kernel_for<D, 1, kWarps, T, E>(a.cache)
                                   : split_kernel_for<D, 2, kWarps, T, E>(a.cache);
}

// Whether the split pass writes the fused append's rows: in append CTAs (a one-token step beside
// the splits) or in the splits (longer steps); a one-token step's merge pass may write them instead.
inline bool split_pass_encodes(const AttnArgs& a) {
  return a.append && (a.append_cta0 != kNoAppendCtas || a.q_len > 1);
}

// With append CTAs the split pass's grid is one-dimensional (attention_split_kernel): the split
// CTAs in the same order, then the append CTAs, dispatched last. CTAs of kWideWarps serve one
// row tile (plan_splits).
template <int D, typename T>
tq_status launch_split_pass(const AttnArgs& a, int warps, dim3 grid, cudaStream_t stream) {
  if (a.append_cta0 != kNoAppendCtas) grid = dim3(unsigned(a.append_cta0 + int64_t(grid.z) * grid.y));  // z = b here
  const int smem = smem_plan(D, warps, a.chunk[0], a.chunk[1], a.cache.codec[0].rotary_pairs > 0).total;
  auto kernel = split_pass_encodes(a) ? split_kernel_of<D, T, true>(a, warps) : split_kernel_of<D, T, false>(a, warps);
  return launch_pass(kernel, "attention (split pass)", grid, 32 * warps, smem, a, stream);
}

template <int D, typename T>
tq_status launch(const AttnArgs& a, const SplitPlan& sp, int batch, cudaStream_t stream) {
  const dim3 grid(a.num_splits, a.cache.num_kv_heads, batch * sp.cta_tiles);
  if (a.chunk_ml) TQ_TRY((launch_chunk_pass<D, T>(a, batch, stream)));  // done before the merge pass starts
  TQ_TRY((sp.prefill ? launch_prefill_pass<D, T>(a, grid, stream) : launch_split_pass<D, T>(a, sp.warps, grid, stream)));
  // The merge pass as a programmatic dependent launch: its launch overlaps the split pass's tail
  // (it starts with griddepcontrol.wait), which matters where the whole call lasts microseconds.
  // One CTA per query row, then with merge_appends one per (sequence, KV head).
  const int64_t rows = int64_t(batch) * a.cache.num_kv_heads * (a.rows + (a.merge_appends ? 1 : 0));
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(rows));
  cfg.blockDim = dim3(32 * kMergeWarps<D>);
  cfg.stream = stream;
  cfg.attrs = &pdl;
  cfg.numAttrs = 1;
  const cudaError_t err = a.merge_appends ? cudaLaunchKernelEx(&cfg, merge_kernel<D, T, true>, a, batch)
                                           : cudaLaunchKernelEx(&cfg, merge_kernel<D, T, false>, a, batch);
  cudaGetLastError();  // reported from err: leave no stale error for the next check_launch
  return err == cudaSuccess ? TQ_OK
                            : fail(TQ_ERR_CUDA, "attention (merge pass): CUDA launch failed: %s",
                                   cudaGetErrorString(err));
}

tq_status run(const tq_attention_plan_info* plan, const tq_attention_params* params, void* workspace,
              size_t ws_bytes, tq_stream stream) {
  AttnArgs a{};
  TQ_TRY(check_call(plan, params, &a.cache));
  const tq_attention_params& p = *params;
  const int heads = a.cache.num_kv_heads, d = a.cache.codec[0].head_dim, batch = p.batch, q_len = p.q_len;
  for (int kv = 0; kv < 2; ++kv) {
    a.tile[kv] = relayout(a.cache.codec[kv], kTile);
    a.chunk[kv] = relayout(a.cache.codec[kv], kChunk);
  }
  const SplitPlan sp = split_plan_of(*plan, wide_ctas_fit(a));
  size_t slots = 0, chunk = 0;
  TQ_TRY(check_workspace(sp, p, heads, d, workspace, ws_bytes, &slots, &chunk));
  a.new_kv[0] = p.k_new;
  a.new_kv[1] = p.v_new;
  a.new_stride = p.new_stride;
  a.append = p.append != 0;
  a.q = p.q;
  a.out = p.out;
  a.lse = p.lse;
  a.kv_lens = p.kv_lens;
  a.max_kv_len = p.max_kv_len;
  a.q_len = q_len;
  a.group = small_divisor(p.num_q_heads / heads);
  a.num_q_heads = p.num_q_heads;
  a.rows = q_len * a.group.d;  // below kSmallDividendLimit (kMaxPrefillQLen)
  a.row_tiles = small_divisor(sp.row_tiles);
  a.num_splits = sp.num_splits;
  a.split_tokens = sp.split_tokens;
  a.q_scale = p.softmax_scale * kLog2e;
  // The merge pass starts with the split pass at head_dim 64 and in CUDA graphs, else after the
  // tile loop: starting it at once made SmolLM2's calls 1-7% faster alone and 7-15% in graphs,
  // Llama-3-8B's 5-7% faster in graphs but up to 11% slower alone at batch 1
  // (docs/BENCHMARKS.md#why-a-split-pass-and-a-merge-pass).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &capture) != cudaSuccess)
    cudaGetLastError();  // (the legacy stream beside a global capture): taken as not capturing
  a.merge_at_start = d == 64 || capture == cudaStreamCaptureStatusActive;
  // A one-token step's append: in CTAs of the split pass, after the splits' (one per sequence and
  // KV head), where the splits and they take at most 3 of an SM's 4 CTA slots of 4 warps (at 1 x
  // 131,072, 3 split CTAs per SM, they made the call 24% slower), or all fit one wave beside
  // kWideWarps splits. Else in CTAs of the merge pass: beside batched splits they cost 3-4% less
  // than encoding in the splits (docs/BENCHMARKS.md#the-fused-append). (Taken where the split
  // pass's fit too, they ended short calls alone 1-1.6 us later where the merge pass starts late,
  // and made fused calls in graphs 1.7-3.4% slower at 1 x 16,384 and 1 x 131,072, SmolLM2's alone
  // 4% at 1 x 8,192, where it starts early.)
  const int64_t split_ctas = int64_t(sp.num_splits) * heads * batch * sp.cta_tiles;
  const int resident = ctas_per_sm(row_ntiles(a.rows), sp.warps);
  const int64_t free_slots = int64_t(plan->num_sms) * (sp.warps == kWideWarps ? resident : resident - 1) - split_ctas;
  const bool one_token = a.append && q_len == 1 && !sp.prefill;
  a.append_cta0 = one_token && int64_t(batch) * heads <= free_slots ? int(split_ctas) : kNoAppendCtas;
  a.merge_appends = one_token && a.append_cta0 == kNoAppendCtas;
  // [ws_o | chunk_o | ws_ml | chunk_ml]
  a.ws_o = static_cast<float*>(workspace);
  a.ws_ml = reinterpret_cast<float2*>(a.ws_o + (slots + chunk) * d);
  a.chunk_o = chunk ? a.ws_o + slots * d : nullptr;
  a.chunk_ml = chunk ? a.ws_ml + slots : nullptr;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  return dispatch(d, p.dtype, [&](auto dim, auto type) {
    return launch<decltype(dim)::value, typename decltype(type)::type>(a, sp, batch, s);
  });
}

}  // namespace
}  // namespace tq

extern "C" tq_status tq_attention_run(const tq_attention_plan_info* plan, const tq_attention_params* params,
                                      void* workspace, size_t workspace_bytes, tq_stream stream) {
  return tq::run(plan, params, workspace, workspace_bytes, stream);
}

extern "C" int32_t tq_abi_version(void) { return TQ_ABI_VERSION; }
