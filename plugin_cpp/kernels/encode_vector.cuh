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

// x: the vector's head_dim activations (head `head` of the codec's per-head tables) at packed
// position `pos`; the whole warp calls this with the same arguments. page: the slot's page, or null
// where the block table has none (nothing is written). Callers look the page up without waiting
// on it: its read then overlaps the codec's and x's instead of coming before them.
template <int D, typename T>
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
  // Step 4.1-4.2: the group's norm.
  float sq = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) sq += p[e] * p[e];
  const float norm = sqrtf(group_sum(sq, gl.dim / E));
  const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) p[e] *= inv;
  // Step 4.3-4.4: rotate, then count the decision boundaries below each coordinate.
  warp_fwht<E>(p, gl.dim);
  int code[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    int c = 0;
    for (int k = 0; k < (1 << gl.bits) - 1; ++k) c += l.boundary[g][k] < p[e];
    code[e] = c;
  }
  // Step 4.5: the gain norm / <y, c[code]> makes <x, x_hat> = ||x||^2, so the reconstruction is not
  // shrunk by the quantizer's distortion (unbiased attention logits); the norm itself when dot <= 0.
  float dot = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) dot += p[e] * l.codebook[g][code[e]];
  dot = group_sum(dot, gl.dim / E);
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
