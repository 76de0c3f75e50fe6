// encode_vector.cuh: one warp encodes one key or value vector into its slot of a page
// (docs/FORMAT.md section 1, steps 1-4; the Python reference is tq_trtllm.core.quantizer): mean,
// scale, permutation, signs, per-group norm, rotation, quantization, gain, packing, write. Used by
// tq_quantize_append and by the fused append of tq_decode_attention_append.
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
// float32 as the reference's are.
constexpr int kSearchScales = 32;
__device__ inline float search_scale(int k) { return __fdiv_rn(float(40 + k), 50.0f); }

// Candidates scored per round. A lane scores every candidate on its own E coordinates; a round's
// partial sums are then reduced and scattered over 8 lanes, so that lane r of each 8 ends holding
// candidate 8 h + (r & 7)'s sums: 7 shuffles per quantity instead of 8 full warp sums.
constexpr int kSearchRound = 8;

// Step 4.4's search for the group's y (E coordinates per lane, `lanes` lanes per group, every lane
// of the warp calling): the scale alpha whose nearest codes maximize <y, c>^2 / ||c||^2, the first
// on ties. Sums in double, as the reference's, so that scores tie only where the code sets do
// (same sums in the same order); scores compared by cross products (no division).
template <int E>
__device__ inline float search_alpha(const CodecLayout& l, int g, const float (&y)[E], int lanes) {
  const int lane = threadIdx.x & 31;
  const int top = (1 << l.group[g].bits) - 1;
  double yd[E];
#pragma unroll
  for (int e = 0; e < E; ++e) yd[e] = y[e];
  double best_num = -1.0, best_den = 1.0;  // below every score (scores are >= 0)
  int best_k = 0;
#pragma unroll 1
  for (int h = 0; h < kSearchScales; h += kSearchRound) {
    // The nearest level of alpha * y: each boundary passed moves it up one level. The loop index
    // is the same in every lane, so each table entry is one broadcast read.
    float v[kSearchRound][E], lev[kSearchRound][E];
#pragma unroll
    for (int j = 0; j < kSearchRound; ++j) {
      const float alpha = search_scale(h + j);
#pragma unroll
      for (int e = 0; e < E; ++e) v[j][e] = alpha * y[e], lev[j][e] = l.codebook[g][0];
    }
    for (int m = 0; m < top; ++m) {
      const float bound = l.boundary[g][m], above = l.codebook[g][m + 1];
#pragma unroll
      for (int j = 0; j < kSearchRound; ++j)
#pragma unroll
        for (int e = 0; e < E; ++e) lev[j][e] = bound < v[j][e] ? above : lev[j][e];
    }
    double dot[kSearchRound], cc[kSearchRound];
#pragma unroll
    for (int j = 0; j < kSearchRound; ++j) {
      dot[j] = cc[j] = 0.0;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const double c = lev[j][e];
        dot[j] += yd[e] * c;
        cc[j] += c * c;
      }
    }
    // Reduce-scatter over 8 lanes: at offset o a lane keeps the half of its o-candidate pairs on
    // its side of bit o and adds its partner's share of it.
#pragma unroll
    for (int o = kSearchRound / 2; o >= 1; o >>= 1) {
      const bool upper = lane & o;
#pragma unroll
      for (int i = 0; i < o; ++i) {
        const double send_dot = upper ? dot[i] : dot[i + o], send_cc = upper ? cc[i] : cc[i + o];
        dot[i] = (upper ? dot[i + o] : dot[i]) + __shfl_xor_sync(0xffffffffu, send_dot, o);
        cc[i] = (upper ? cc[i + o] : cc[i]) + __shfl_xor_sync(0xffffffffu, send_cc, o);
      }
    }
    double d = dot[0], c = cc[0];
    for (int o = kSearchRound; o < lanes; o <<= 1) {
      d += __shfl_xor_sync(0xffffffffu, d, o);
      c += __shfl_xor_sync(0xffffffffu, c, o);
    }
    const double num = d > 0.0 ? d * d : 0.0;
    if (num * best_den > best_num * c) best_num = num, best_den = c, best_k = h + (lane & 7);
  }
  // The best of the 8 lanes' candidates (every 8 lanes of a group hold the same ones).
#pragma unroll
  for (int o = 1; o < kSearchRound; o <<= 1) {
    const double num = __shfl_xor_sync(0xffffffffu, best_num, o);
    const double den = __shfl_xor_sync(0xffffffffu, best_den, o);
    const int k = __shfl_xor_sync(0xffffffffu, best_k, o);
    const double mine = best_num * den, theirs = num * best_den;
    if (theirs > mine || (theirs == mine && k < best_k)) best_num = num, best_den = den, best_k = k;
  }
  return search_scale(best_k);
}

// x: the vector's head_dim activations (head `head` of the codec's per-head tables) at packed
// position `pos`; the whole warp calls this with the same arguments. page: the slot's page, or null
// where the block table has none (nothing is written). Callers look the page up without waiting
// on it: its read then overlaps the codec's and x's instead of coming before them.
template <int D, typename T, bool Search>
__device__ inline void encode_vector(const CodecLayout& l, int head, const T* x, uint8_t* page,
                                     int pos) {
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
  const float alpha = Search ? search_alpha<E>(l, g, p, lanes) : 1.0f;
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
