// merge_kernel.cuh: the merge pass (merge_kernel), included by attention.cu only.
//
// One CTA per query row merges the splits' partial states (the split or prefill pass) and, where
// the call has the new rows, the chunk term, a query row's attention over the call's positions up
// to its own with the new rows, exactly (here for calls of at most kMaxMergeChunk tokens, else from
// the chunk pass, chunk_attention.cu); rotates the output back (inverse Hadamard, signs,
// un-permutation, value scale), adds the value mean and, if asked, writes the row's log-sum-exp.
// With merge_appends, further CTAs encode a one-token step's new rows (the fused append).
#pragma once

#include "split_kernel.cuh"  // encode_new_rows

namespace tq {
namespace {  // (one translation unit: attention.cu)

constexpr float kLn2 = 0.6931471805599453f;

// E consecutive floats from a 4*E-byte aligned address, in one vector load.
template <int E>
__device__ inline void load_floats(const float* p, float (&v)[E]) {
  if constexpr (E == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
  } else {
    const float2 x = *reinterpret_cast<const float2*>(p);
    v[0] = x.x; v[1] = x.y;
  }
}

// q . x over one query row's D channels, x(ch) a channel's value: each lane sums its E channels,
// then the warp; every lane gets the result.
template <int D, typename T, typename X>
__device__ inline float warp_q_dot(const T* qv, X x) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31;
  float dot = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) dot += to_float(qv[lane * E + e]) * x(lane * E + e);
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  return dot;
}

// A query row's chunk term (AttnArgs::new_kv): its softmax state over the call's positions up to
// its own, exactly, in the splits' units (q_scale (q . k - q . mean) in base 2): maximum m (-inf
// where it sees none; NaN where a score is NaN, so that the row's output is), sum l, and the
// output unnormalized at a lane's output channels (vr.ch).
template <int E>
struct ChunkTerm {
  float m = -INFINITY, l = 0.0f, o[E] = {};
};

// The chunk term of a query row of the call's token j, in a call of at most N (<= kMaxMergeChunk)
// tokens, from the new rows. Every key and value a lane needs is read first, in one round of
// independent loads (the call's tokens up to j exist whether or not they have a position, so no
// read waits for the sequence length): a loop that read row by row behind each score's shuffles
// made a 4-token call 15% slower (docs/BENCHMARKS.md#the-calls-own-tokens-read-exactly).
// qm: q . key mean.
template <int D, int N, typename T>
__device__ inline ChunkTerm<D / 32> merged_chunk_term(const AttnArgs& a, int b, int kvh, int j, const T* qv,
                                                      float qm, const LaneRotation<D>& vr) {
  static_assert(N <= kMaxMergeChunk);
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31;
  auto new_row = [&](int kind, int i) {
    return static_cast<const T*>(a.new_kv[kind]) + (int64_t(b) * a.q_len + i) * a.new_stride + int64_t(kvh) * D;
  };
  float q[E], k[N][E], v[N][E];
#pragma unroll
  for (int e = 0; e < E; ++e) q[e] = to_float(qv[lane * E + e]);
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (i <= j)
#pragma unroll
      for (int e = 0; e < E; ++e) {
        k[i][e] = to_float(new_row(0, i)[lane * E + e]);
        v[i][e] = to_float(new_row(1, i)[vr.ch[e]]);
      }
  const int first = max(0, a.q_len - seq_len(a, b));  // the call's tokens before it have no position
  ChunkTerm<E> t;
  float s[N];
  bool nan = false;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    s[i] = -INFINITY;
    if (i <= j) {  // warp-uniform
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) dot += q[e] * k[i][e];
      dot = group_sum(dot, 32);
      if (i >= first) s[i] = a.q_scale * (dot - qm);
    }
    t.m = fmaxf(t.m, s[i]);  // (fmaxf drops a NaN)
    nan |= isnan(s[i]);
  }
  if (nan) t.m = NAN;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (s[i] != -INFINITY) {
      const float w = exp2f(s[i] - t.m);
      t.l += w;
#pragma unroll
      for (int e = 0; e < E; ++e) t.o[e] += w * v[i][e];
    }
  return t;
}

// The chunk pass's term of query row r (longer calls), in the same units.
template <int D>
__device__ inline ChunkTerm<D / 32> passed_chunk_term(const AttnArgs& a, int b, int kvh, int r, float qm,
                                                      const LaneRotation<D>& vr) {
  ChunkTerm<D / 32> t;
  const int64_t slot = chunk_slot(a, b, kvh, r);
  const float2 ml = a.chunk_ml[slot];
  t.m = isnan(ml.y) ? NAN : ml.x == -INFINITY ? -INFINITY : ml.x - a.q_scale * qm;
  t.l = ml.y;
#pragma unroll
  for (int e = 0; e < D / 32; ++e) t.o[e] = a.chunk_o[slot * D + vr.ch[e]];
  return t;
}

// APPENDS: the kernel of calls with merge_appends (the encoding's registers stay out of the others,
// whose CTAs wait beside the splits where the merge pass starts early).
template <int D, typename T, bool APPENDS>
__global__ void __launch_bounds__(32 * kMergeWarps<D>) merge_kernel(AttnArgs a, int batch) {
  constexpr int E = D / 32;
  __shared__ float acc_s[kMergeWarps<D>][D];
  __shared__ float m_s[kMergeWarps<D>], l_s[kMergeWarps<D>];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  // (b, kvh, row): one CTA per query row. 32-bit arithmetic: a grid has fewer than 2^31 CTAs, and
  // 64-bit divisions are calls of dozens of instructions.
  const int item = int(blockIdx.x);
  const int heads = a.cache.num_kv_heads;
  // Then, with merge_appends, one CTA per (b, kvh) encodes a one-token step's new key and value
  // (the fused append). No split reads that position, so it does not wait for the split pass.
  const int64_t merge_ctas = int64_t(batch) * heads * a.rows;
  if (APPENDS && item >= merge_ctas) {
    const int i = int(item - merge_ctas), b = i / heads, L = seq_len(a, b);
    encode_new_rows<D, kMergeWarps<D>, T>(a, b, i % heads, L, L - 1, L);
    return;
  }
  const int row_item = item / a.rows, r = item - row_item * a.rows;
  const int b = row_item / heads, kvh = row_item - b * heads;
  const int64_t base = ws_slot(a, b, kvh, r, 0);
  const QueryRow qr = query_row_of(a, kvh, r);
  const int j = qr.token, hq = qr.head;
  const int64_t row = query_row_index(a, b, kvh, r);
  const T* qv = static_cast<const T*>(a.q) + row * D;
  // Warp 0 finishes the row, so only it reads the value codec's channels, factors and means at its
  // lanes' dims (the output's inverse rotation), q . key mean (original channels: the splits' scores
  // leave it out; the chunk term and the log-sum-exp need it) and a short call's chunk term, all
  // before the wait: after it, only the workspace reads stand between the split pass's end and the
  // output.
  const CodecLayout& kl = a.cache.codec[0];
  const CodecLayout& vl = a.cache.codec[1];
  LaneRotation<D> vr{};
  float v_mean[E] = {}, qm = 0.0f;
  ChunkTerm<E> chunk;
  if (warp == 0) {
    vr = lane_rotation<D>(vl, kvh);
#pragma unroll
    for (int e = 0; e < E; ++e) v_mean[e] = mean_of(vl, kvh, vr.ch[e]);
    if (kl.mean && (a.lse || a.new_kv[0])) qm = warp_q_dot<D>(qv, [&](int ch) { return mean_of(kl, kvh, ch); });
    // (A merge that appends serves one-token steps only: room for one token's rows keeps the
    // encoding's registers and these within the limit without a spill.)
    if (a.new_kv[0] && !a.chunk_ml)
      chunk = merged_chunk_term<D, APPENDS ? 1 : kMaxMergeChunk, T>(a, b, kvh, j, qv, qm, vr);
  }
  // The table's page shift lowers every split's state (the cached positions) against the chunk term.
  const float shift = a.cache.page_lse_shift ? a.cache.page_lse_shift[hq] * kLog2e : 0.0f;
  // Launched early (programmatic dependent launch): wait until the split pass's writes are visible.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // Warp w folds splits w, w + kMergeWarps<D>, ... into a running state of its own (maximum, sum,
  // weighted output), as the online softmax does: no pass over the splits' maxima comes first, so
  // after the wait the workspace is read in one round of independent loads (one warp walking every
  // split was latency-bound: 30 us at 64 splits). Each lane holds E consecutive rotated dims.
  float m_w = -INFINITY, l_w = 0.0f, acc[E] = {};
#pragma unroll 4
  for (int s = warp; s < a.num_splits; s += kMergeWarps<D>) {
    const float2 ml = a.ws_ml[base + s];
    float part[E];
    load_floats<E>(a.ws_o + (base + s) * D + lane * E, part);
    const float m = ml.x - shift;  // -inf: the split saw no key
    if (m > m_w) {
      const float r = exp2f(m_w - m);  // 0 while m_w is -inf
      l_w *= r;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] *= r;
      m_w = m;
    }
    const float w = m == -INFINITY ? 0.0f : exp2f(m - m_w);
    l_w += w * ml.y;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += w * part[e];
  }
#pragma unroll
  for (int e = 0; e < E; ++e) acc_s[warp][lane * E + e] = acc[e];
  if (lane == 0) m_s[warp] = m_w, l_s[warp] = l_w;
  __syncthreads();
  if (warp != 0) return;
  // Warp 0 weighs the warps' states and the chunk term against their common maximum and finishes
  // the row.
  if (a.chunk_ml) chunk = passed_chunk_term<D>(a, b, kvh, r, qm, vr);
  float m_all = chunk.m;
#pragma unroll
  for (int w = 0; w < kMergeWarps<D>; ++w) m_all = fmaxf(m_all, m_s[w]);
  float l_all = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.0f;
#pragma unroll
  for (int w = 0; w < kMergeWarps<D>; ++w) {
    const float r = m_s[w] == -INFINITY ? 0.0f : exp2f(m_s[w] - m_all);
    l_all += r * l_s[w];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += r * acc_s[w][lane * E + e];
  }
  const float w_chunk = chunk.m == -INFINITY ? 0.0f : exp2f(chunk.m - m_all);
  const float l_sum = l_all + w_chunk * chunk.l;
  // The log-sum-exp with q . mean added back, in base 2 (NaN where the sum is: a NaN score).
  if (a.lse && lane == 0)
    a.lse[row] = l_sum > 0.0f ? (m_all + log2f(l_sum) + a.q_scale * qm) * kLn2 : l_sum == 0.0f ? -INFINITY : NAN;
  // out = (R^-1(acc) * value scale + l_all * value mean + w_chunk * chunk output) / l_sum: the
  // cached tokens' decoded values each carry the value mean; a row that sees nothing gets the mean.
  const float inv = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;
  const float mean_w = l_sum > 0.0f ? l_all * inv : 1.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] *= inv;
  warp_fwht<E>(acc, D / vl.num_groups);
  T* out = static_cast<T*>(a.out) + row * D;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    float y = acc[e] * vr.factor[e] + mean_w * v_mean[e];
    if (w_chunk != 0.0f) y += w_chunk * inv * chunk.o[e];  // (NaN: a NaN score)
    out[vr.ch[e]] = from_float<T>(y);
  }
}

}  // namespace
}  // namespace tq
