// encode_vector.cuh: one warp encodes one key or value vector into its slot of a page
// (docs/FORMAT.md section 1, steps 1-4; the Python reference is tq_trtllm.core.quantizer): mean,
// scale, permutation, signs, per-group norm, rotation, quantization, gain, packing, write. Used by
// tq_quantize_append and by the fused append of tq_attention_run (tq_attention_params::append).
#pragma once

#include "device_common.cuh"

namespace tq {

// ORs together the bits of the lanes_per_word lanes that share one 32-bit word. Every lane runs
// every shuffle (the two groups of a fractional width may have different word sizes).
__device__ inline uint32_t gather_word(uint32_t bits, int lanes_per_word) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t other = __shfl_xor_sync(0xffffffffu, bits, o);
    if (o < lanes_per_word) bits |= other;
  }
  return bits;
}

// Step 4.4's candidate scales (FORMAT.md): alpha_k = (40 + k) / 50, k < 32, correctly rounded to
// float32 as the reference's are. Lane k of a warp scores candidate k.
constexpr int kSearchScales = 32;
__device__ inline float search_scale(int k) { return __fdiv_rn(float(40 + k), 50.0f); }

// A candidate's sums <y, c> and ||c||^2 in fixed point: each coordinate's term y_i c_i or c_i^2
// (exact in double) rounded to a multiple of 2^-40. Integer sums do not depend on their order, so
// two candidates with the same codes get the same sums however they were summed, and tie as the
// reference's do; the rounding (1e-10 over 256 terms) is far below any real difference of scores.
__device__ inline long long search_fixed(double v) { return __double2ll_rn(v * 0x1p40); }

// One warp's shared scratch for the search: per group, the candidates' sum increments, and the
// codebook copied where lanes can index it.
struct SearchScratch {
  unsigned long long dot[TQ_MAX_GROUPS][kSearchScales], cc[TQ_MAX_GROUPS][kSearchScales];
  float level[TQ_MAX_GROUPS][1 << TQ_MAX_BITS];
  float bound[TQ_MAX_GROUPS][(1 << TQ_MAX_BITS) - 1];
};

// Step 4.4's search for the group's y (E coordinates per lane, `lanes` lanes per group, the whole
// warp calling): the scale alpha whose nearest codes maximize <y, c>^2 / ||c||^2, the first on ties.
// A coordinate's code moves only where alpha * y crosses a decision boundary, and over the 32 scales
// (0.80 to 1.42) it crosses few (0 to 2 at 3 bits). So each lane finds its coordinates' codes at the
// first and last scale, adds their terms at the first, and for each boundary in between adds the
// term's change at the first candidate past it (shared atomics into 32 bins); a prefix sum over the
// bins, lane k holding bin k, then gives every candidate's sums, and a warp arg-max the best: a bulk
// append 2.7x (3 bits) to 4x (5 bits) faster than scoring every candidate on every coordinate
// (docs/BENCHMARKS.md#the-fused-append).
template <int E>
__device__ inline float search_alpha(const CodecLayout& l, int g, const float (&y)[E], int lanes,
                                     SearchScratch& s) {
  const int lane = threadIdx.x & 31;
  const int top = (1 << l.group[g].bits) - 1;
  const bool writer = lane * E == l.group[g].start;  // copies its group's codebook
#pragma unroll
  for (int i = 0; i < TQ_MAX_GROUPS; ++i) s.dot[i][lane] = s.cc[i][lane] = 0;
  const float a0 = search_scale(0), a1 = search_scale(kSearchScales - 1);
  float v0[E], v1[E], lev[E];
  int c0[E], c1[E];
#pragma unroll
  for (int e = 0; e < E; ++e)
    v0[e] = a0 * y[e], v1[e] = a1 * y[e], c0[e] = c1[e] = 0, lev[e] = l.codebook[g][0];
  if (writer) s.level[g][0] = l.codebook[g][0];
  for (int m = 0; m < top; ++m) {
    const float bound = l.boundary[g][m], above = l.codebook[g][m + 1];
    if (writer) s.bound[g][m] = bound, s.level[g][m + 1] = above;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      c0[e] += bound < v0[e];
      c1[e] += bound < v1[e];
      lev[e] = bound < v0[e] ? above : lev[e];
    }
  }
  // The first candidate's sums over the group.
  long long dot = 0, cc = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    dot += search_fixed(double(y[e]) * lev[e]);
    cc += search_fixed(double(lev[e]) * lev[e]);
  }
  for (int o = 1; o < lanes; o <<= 1) {
    dot += __shfl_xor_sync(0xffffffffu, dot, o);
    cc += __shfl_xor_sync(0xffffffffu, cc, o);
  }
  __syncwarp();  // the codebook copied, the bins zeroed
  // Each boundary crossed between the first and last scale: the code moves one level (up where
  // y > 0) at the first candidate k whose alpha_k * y is past it, alpha_k >= boundary / y.
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int n = abs(c1[e] - c0[e]);
    const int rounds = __reduce_max_sync(0xffffffffu, unsigned(n));
    for (int r = 0; r < rounds; ++r) {
      if (r >= n) continue;
      const bool up = y[e] > 0.0f;
      const int j = up ? c0[e] + r : c0[e] - 1 - r;  // the boundary between levels j and j + 1
      const float from = s.level[g][up ? j : j + 1], to = s.level[g][up ? j + 1 : j];
      const float first = ceilf(fmaf(50.0f, __fdividef(s.bound[g][j], y[e]), -40.0f));
      const int k = min(max(int(first), 1), kSearchScales - 1);
      atomicAdd(&s.dot[g][k], search_fixed(double(y[e]) * to) - search_fixed(double(y[e]) * from));
      atomicAdd(&s.cc[g][k], search_fixed(double(to) * to) - search_fixed(double(from) * from));
    }
  }
  __syncwarp();
  float alpha = 1.0f;
  for (int gg = 0; gg < l.num_groups; ++gg) {
    long long d = s.dot[gg][lane], c = s.cc[gg][lane];
#pragma unroll
    for (int o = 1; o < kSearchScales; o <<= 1) {  // inclusive prefix sum over the candidates
      const long long pd = __shfl_up_sync(0xffffffffu, d, o), pc = __shfl_up_sync(0xffffffffu, c, o);
      if (lane >= o) d += pd, c += pc;
    }
    const int src = l.group[gg].start / E;  // a lane of group gg: it holds the group's first sums
    d += __shfl_sync(0xffffffffu, dot, src);
    c += __shfl_sync(0xffffffffu, cc, src);
    // The best candidate: scores compared by cross products (no division), the lowest k on ties.
    double num = d > 0 ? double(d) * double(d) : 0.0, den = double(c);
    int best = lane;
#pragma unroll
    for (int o = 1; o < kSearchScales; o <<= 1) {
      const double n2 = __shfl_xor_sync(0xffffffffu, num, o), d2 = __shfl_xor_sync(0xffffffffu, den, o);
      const int k2 = __shfl_xor_sync(0xffffffffu, best, o);
      const double mine = num * d2, theirs = n2 * den;
      if (theirs > mine || (theirs == mine && k2 < best)) num = n2, den = d2, best = k2;
    }
    if (gg == g) alpha = search_scale(best);
  }
  return alpha;
}

// x: the vector's head_dim activations (head `head` of the codec's per-head tables) at packed
// position `pos`; the whole warp calls this with the same arguments. page: the slot's page, or null
// where the block table has none (nothing is written). Callers look the page up without waiting
// on it: its read then overlaps the codec's and x's instead of coming before them. Search: step
// 4.4's scale search, in the warp's `search` scratch; without it y itself is rounded.
template <int D, typename T, bool Search>
__device__ inline void encode_vector(const CodecLayout& l, int head, const T* x, uint8_t* page,
                                     int pos, SearchScratch* search = nullptr) {
  constexpr int E = D / 32;  // permuted coordinates per lane
  const int lane = threadIdx.x & 31;
  const int slot = pos % l.tokens;
  // Steps 1-3: z = (x - rot(pos) - mean) / scale, permuted, sign-flipped.
  int ch[E];
  float rot[E];
  lane_channels<E>(l, head, pos, ch, rot);
  float p[E];
#pragma unroll
  for (int e = 0; e < E; ++e)
    p[e] = (to_float(x[ch[e]]) - rot[e] - mean_of(l, head, ch[e])) / scale_of(l, head, ch[e]) *
           rotation_sign(l.seed, lane * E + e);
  const int g = group_index(l, lane * E);
  const GroupLayout& gl = l.group[g];
  const int lanes = gl.dim / E;  // the lanes of this lane's group
  // Step 4.1-4.2: the group's norm.
  float sq = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) sq += p[e] * p[e];
  const float norm = sqrtf(group_sum(sq, lanes));
  const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) p[e] *= inv;
  // Step 4.3: rotate.
  warp_fwht<E>(p, gl.dim);
  // Step 4.4: the codes of alpha * y, the number of decision boundaries below each coordinate, and
  // their levels (the loop index is the same in every lane: broadcast reads of the tables).
  float alpha = 1.0f;
  if constexpr (Search) alpha = search_alpha<E>(l, g, p, lanes, *search);
  int code[E];
  float level[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const float v = alpha * p[e];
    int c = 0;
    float lev = l.codebook[g][0];
    for (int k = 0; k < (1 << gl.bits) - 1; ++k) {
      const bool up = l.boundary[g][k] < v;
      c += up;
      lev = up ? l.codebook[g][k + 1] : lev;
    }
    code[e] = c;
    level[e] = lev;
  }
  // Step 4.5: the gain norm / <y, c[code]> makes <x, x_hat> = ||x||^2, so the reconstruction is not
  // shrunk by the quantizer's distortion (unbiased attention logits); the norm itself when dot <= 0.
  float dot = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) dot += p[e] * level[e];
  dot = group_sum(dot, lanes);
  const float gain = dot > 0.0f ? norm / dot : norm;
  // Pack: the low plane, then (3- and 5-bit codes) the high plane, then the gain in the norm field.
  const int i0 = lane * E - gl.start;  // this lane's first group coordinate
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = i0 + e;
    lo |= uint32_t(code[e] & ((1 << gl.lo_bits) - 1)) << ((i * gl.lo_bits) & 31);
    hi |= uint32_t(code[e] >> gl.lo_bits & 1) << hi_plane_bit(gl.bits, i & 31);
  }
  // A group's lanes cover whole words: the first lane of each word stores it.
  const int lo_lanes = 32 / gl.lo_bits / E, hi_lanes = 32 / E;
  lo = gather_word(lo, lo_lanes);
  hi = gather_word(hi, hi_lanes);
  const int group_lane = lane - gl.start / E;
  if (!page) return;
  if (group_lane % lo_lanes == 0)
    reinterpret_cast<uint32_t*>(page + gl.lo_off + slot * gl.lo_row_bytes)[group_lane / lo_lanes] = lo;
  if (gl.hi_off >= 0 && group_lane % hi_lanes == 0)
    reinterpret_cast<uint32_t*>(page + gl.hi_off + slot * gl.hi_row_bytes)[group_lane / hi_lanes] = hi;
  // fp16, saturated: a kernel cannot refuse an overflow. A group with a NaN or Inf activation
  // (its norm is not finite) stores a NaN gain, so that everything that reads the vector is NaN,
  // as with an fp16 cache; saturating it (fminf drops a NaN) would store a finite wrong vector.
  if (lane * E == gl.start) {
    __half* norms = reinterpret_cast<__half*>(page + l.norm_off);
    norms[g * l.tokens + slot] = __float2half_rn(isfinite(norm) ? fminf(gain, 65504.0f) : __int_as_float(0x7fc00000));
  }
}

}  // namespace tq
