// device_common.cuh: small device helpers shared by every kernel: the rotation sign hash,
// activation loads/stores, code extraction from a page, the warp-level Walsh-Hadamard transform,
// and the host-side dispatch of kernels over (head_dim, dtype).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "layout.h"

namespace tq {

// FORMAT.md section 4: sign of permuted coordinate j is -1 when mix32(seed, j) is odd.
__host__ __device__ inline uint32_t mix32(uint32_t seed, uint32_t j) {
  uint32_t h = seed * 0x9E3779B9u + j * 0x85EBCA6Bu + 0x27D4EB2Fu;
  h ^= h >> 16;
  h *= 0x7FEB352Du;
  h ^= h >> 15;
  h *= 0x846CA68Bu;
  h ^= h >> 16;
  return h;
}

__device__ inline float rotation_sign(uint32_t seed, int j) {
  return (mix32(seed, j) & 1u) ? -1.0f : 1.0f;
}

__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline uint16_t bits_of(__half x) { return __half_as_ushort(x); }
__device__ inline uint16_t bits_of(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
template <typename T> __device__ inline T from_float(float x);
template <> __device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// The channel that permuted coordinate j reads (perm may be null: identity).
__device__ inline int channel_of(const CodecLayout& l, int head, int j) {
  return l.perm ? l.perm[head * l.head_dim + j] : j;
}
__device__ inline float mean_of(const CodecLayout& l, int head, int ch) {
  return l.mean ? l.mean[head * l.head_dim + ch] : 0.0f;
}
__device__ inline float scale_of(const CodecLayout& l, int head, int ch) {
  return l.scale ? l.scale[head * l.head_dim + ch] : 1.0f;
}

// (cos, sin) of pos * freq (FORMAT.md section 1.1): the angle formed and reduced modulo 2 pi in
// double, so that positions up to 2^31 keep float accuracy, then one MUFU pair on [-pi, pi].
__device__ inline float2 rotary_turn(int pos, float freq) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  constexpr double kInvTwoPi = 0.15915494309189533576888376337251;
  const double angle = double(pos) * double(freq);
  float s, c;
  __sincosf(float(fma(-kTwoPi, rint(angle * kInvTwoPi), angle)), &s, &c);
  return make_float2(c, s);
}

// This lane's E coordinates of the permuted vector (FORMAT.md steps 1-2): their channels ch[e] and
// the rotary mean R(pos) m of `head` on them (0 outside its pairs, or without one). The whole warp
// calls this: lane i < rotary_pairs turns pair i, the others read it by shuffles.
template <int E>
__device__ inline void lane_channels(const CodecLayout& l, int head, int pos, int (&ch)[E], float (&rot)[E]) {
  const int lane = threadIdx.x & 31, half = l.head_dim / 2;
#pragma unroll
  for (int e = 0; e < E; ++e) ch[e] = channel_of(l, head, lane * E + e), rot[e] = 0.0f;
  if (!l.rotary_pairs) return;
  int a = -1;
  float ra = 0.0f, rb = 0.0f;
  if (lane < l.rotary_pairs) {
    const int k = head * l.rotary_pairs + lane;
    const float2 cs = rotary_turn(pos, l.rotary_freq[k]);
    const float m0 = l.rotary_mean[2 * k], m1 = l.rotary_mean[2 * k + 1];
    a = l.rotary_channel[k];
    ra = m0 * cs.x - m1 * cs.y;
    rb = m1 * cs.x + m0 * cs.y;
  }
  for (int i = 0; i < l.rotary_pairs; ++i) {
    const int ai = __shfl_sync(0xffffffffu, a, i);
    const float rai = __shfl_sync(0xffffffffu, ra, i), rbi = __shfl_sync(0xffffffffu, rb, i);
#pragma unroll
    for (int e = 0; e < E; ++e) rot[e] = ch[e] == ai ? rai : ch[e] == ai + half ? rbi : rot[e];
  }
}

// The group holding permuted coordinate j.
__device__ inline int group_index(const CodecLayout& l, int j) {
  return (l.num_groups == 2 && j >= l.group[1].start) ? 1 : 0;
}

// Code of group coordinate i (0-based in the group) of the token in slot `slot` of `page`, laid
// out by `l` (FORMAT.md section 3: plane words little-endian, low plane first).
__device__ inline int code_at(const uint8_t* page, const CodecLayout& l, int g, int slot, int i) {
  const GroupLayout& gl = l.group[g];
  const uint32_t* lo =
      reinterpret_cast<const uint32_t*>(page + gl.lo_off + slot * gl.lo_row_bytes);
  const int bit = i * gl.lo_bits;
  int code = (lo[bit >> 5] >> (bit & 31)) & ((1u << gl.lo_bits) - 1);
  if (gl.hi_off >= 0) {
    const uint32_t* hi =
        reinterpret_cast<const uint32_t*>(page + gl.hi_off + slot * gl.hi_row_bytes);
    code |= ((hi[i >> 5] >> hi_plane_bit(gl.bits, i & 31)) & 1u) << gl.lo_bits;
  }
  return code;
}

__device__ inline float norm_at(const uint8_t* page, const CodecLayout& l, int g, int slot) {
  return __half2float(reinterpret_cast<const __half*>(page + l.norm_off)[g * l.tokens + slot]);
}

// In-place H x / sqrt(N) (Sylvester order) over N consecutive coordinates held by a warp, E per
// lane (lane L holds coordinates L*E .. L*E+E-1). Groups of N coordinates occupy aligned runs of
// N/E lanes, so every group of the vector is transformed at once and independently. N is a
// compile-time constant so that the shuffle rounds unroll and 1/sqrt(N) is a constant: a runtime
// size cost a loop and a reciprocal square root on the prologue's dependent chain.
template <int E, int N>
__device__ inline void warp_fwht_n(float (&x)[E]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 1; h < E; h <<= 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (!(e & h)) {
        const float a = x[e], b = x[e + h];
        x[e] = a + b;
        x[e + h] = a - b;
      }
    }
  }
#pragma unroll
  for (int h = E; h < N; h <<= 1) {
    const int lanes = h / E;
    const bool upper = lane & lanes;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float other = __shfl_xor_sync(0xffffffffu, x[e], lanes);
      x[e] = upper ? other - x[e] : x[e] + other;
    }
  }
  const float inv = 1.0f / sqrtf(float(N));  // folded at compile time, rounded as before
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] *= inv;
}

// The same over groups of n coordinates, n the whole vector (32 E) or its half (the two groups of
// a fractional width: FORMAT.md section 2), which are the only group sizes.
template <int E>
__device__ inline void warp_fwht(float (&x)[E], int n) {
  if (n == 32 * E) warp_fwht_n<E, 32 * E>(x);
  else warp_fwht_n<E, 16 * E>(x);
}

// Sum over the n/E lanes of one group (n coordinates, E per lane).
__device__ inline float group_sum(float v, int lanes_per_group) {
  for (int o = 1; o < lanes_per_group; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The per-vector kernels (quantize-append, dequantize) run one warp per (token, KV head, K or V)
// vector, kVectorWarps warps per block, vector index (token * heads + head) * 2 + kv.
constexpr int kVectorWarps = 4;

struct VectorItem {
  int token, head, kv;
};

// This warp's vector among tokens x heads x 2; false for a warp past the last one.
__device__ inline bool vector_item(int tokens, int heads, VectorItem& v) {
  const int64_t item = int64_t(blockIdx.x) * kVectorWarps + threadIdx.x / 32;
  if (item >= int64_t(tokens) * heads * 2) return false;
  v.kv = int(item % 2);
  v.head = int((item / 2) % heads);
  v.token = int(item / (2 * heads));
  return true;
}

// Blocks covering every vector of `tokens` tokens (blocks of 32 * kVectorWarps threads).
inline dim3 vector_grid(int tokens, int heads) {
  return dim3(unsigned((int64_t(tokens) * heads * 2 + kVectorWarps - 1) / kVectorWarps));
}

template <typename T> struct TypeTag { using type = T; };

// Calls f(std::integral_constant<int, D>{}, TypeTag<T>{}) for a validated runtime head_dim (64 or
// 128) and dtype, and returns what f returns: the one place that maps them to kernel instances.
template <typename F>
inline auto dispatch(int head_dim, tq_dtype dtype, F&& f) {
  auto with_dim = [&](auto type) {
    return head_dim == 128 ? f(std::integral_constant<int, 128>{}, type)
                           : f(std::integral_constant<int, 64>{}, type);
  };
  return dtype == TQ_FP16 ? with_dim(TypeTag<__half>{}) : with_dim(TypeTag<__nv_bfloat16>{});
}

}  // namespace tq
