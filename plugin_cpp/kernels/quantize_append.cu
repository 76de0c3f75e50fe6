// quantize_append.cu: tq_quantize_append. One warp encodes one (token, KV head, K or V) vector:
// mean, scale, permutation, signs, per-group norm, rotation, quantization, gain, packing, write
// (docs/FORMAT.md section 1, steps 1-4; the Python reference is tq_trtllm.core.quantizer).
#include "cache.h"
#include "device_common.cuh"
#include "errors.h"

namespace tq {
namespace {

struct AppendArgs {
  CacheView cache;
  const void* src[2];  // k, v
  int64_t token_stride;
  const int32_t* seq_idx;
  const int32_t* pos;
  int num_tokens;
  int batch;
};

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

template <int D, typename T>
__global__ void __launch_bounds__(32 * kVectorWarps) quantize_append_kernel(AppendArgs a) {
  constexpr int E = D / 32;  // permuted coordinates per lane
  const int lane = threadIdx.x & 31;
  VectorItem v;
  if (!vector_item(a.num_tokens, a.cache.num_kv_heads, v)) return;
  const int kv = v.kv, head = v.head, token = v.token;
  const int seq = a.seq_idx[token], pos = a.pos[token];
  if (seq < 0 || seq >= a.batch || pos < 0) return;
  const CodecLayout& l = a.cache.codec[kv];
  uint8_t* page = page_of(a.cache, seq, kv, pos / a.cache.tokens, head);
  if (!page) return;
  const int slot = pos % a.cache.tokens;

  // Steps 1-3: z = (x - mean) / scale, permuted, sign-flipped.
  const T* x = static_cast<const T*>(a.src[kv]) + token * a.token_stride + int64_t(head) * D;
  float p[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int j = lane * E + e;
    const int ch = channel_of(l, head, j);
    p[e] = (to_float(x[ch]) - mean_of(l, head, ch)) / scale_of(l, head, ch) *
           rotation_sign(l.seed, j);
  }
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
  // Pack: the low plane, then (3-bit codes) the high plane, then the gain in the norm field.
  const int i0 = lane * E - gl.start;  // this lane's first group coordinate
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = i0 + e;
    lo |= uint32_t(code[e] & ((1 << gl.lo_bits) - 1)) << ((i * gl.lo_bits) & 31);
    hi |= uint32_t(code[e] >> 2 & 1) << (i & 31);
  }
  // A group's lanes cover whole words: the first lane of each word stores it.
  const int lo_lanes = 32 / gl.lo_bits / E, hi_lanes = 32 / E;
  lo = gather_word(lo, lo_lanes);
  hi = gather_word(hi, hi_lanes);
  const int group_lane = lane - gl.start / E;
  if (group_lane % lo_lanes == 0)
    reinterpret_cast<uint32_t*>(page + gl.lo_off + slot * gl.lo_row_bytes)[group_lane / lo_lanes] = lo;
  if (gl.hi_off >= 0 && group_lane % hi_lanes == 0)
    reinterpret_cast<uint32_t*>(page + gl.hi_off + slot * gl.hi_row_bytes)[group_lane / hi_lanes] = hi;
  if (lane * E == gl.start) {  // fp16, saturated: a kernel cannot refuse an overflow
    __half* norms = reinterpret_cast<__half*>(page + l.norm_off);
    norms[g * l.tokens + slot] = __float2half_rn(fminf(gain, 65504.0f));
  }
}

}  // namespace
}  // namespace tq

extern "C" tq_status tq_quantize_append(const tq_paged_cache* cache, const void* k, const void* v,
                                        int64_t token_stride, tq_dtype dtype,
                                        const int32_t* seq_idx, const int32_t* pos,
                                        int32_t num_tokens, int32_t batch, tq_stream stream) {
  using namespace tq;
  AppendArgs a{};
  TQ_TRY(make_cache_view(cache, &a.cache));
  if (num_tokens < 0 || batch < 1)
    return fail(TQ_ERR_BAD_LENGTH, "quantize_append: num_tokens %d must be >= 0 and batch %d >= 1",
                num_tokens, batch);
  if (num_tokens == 0) return TQ_OK;
  if (!k || !v || !seq_idx || !pos)
    return fail(TQ_ERR_NULL_POINTER, "quantize_append: k, v, seq_idx and pos must not be NULL");
  const int d = a.cache.codec[0].head_dim;
  if (token_stride < int64_t(a.cache.num_kv_heads) * d)
    return fail(TQ_ERR_INVALID_ARGUMENT, "quantize_append: token_stride %lld is smaller than "
                "num_kv_heads x head_dim = %d", (long long)token_stride, a.cache.num_kv_heads * d);
  if (dtype != TQ_FP16 && dtype != TQ_BF16)
    return fail(TQ_ERR_INVALID_ARGUMENT, "quantize_append: dtype %d is neither TQ_FP16 nor TQ_BF16",
                int(dtype));
  if (reinterpret_cast<uintptr_t>(k) % 4 || reinterpret_cast<uintptr_t>(v) % 4)
    return fail(TQ_ERR_MISALIGNED, "quantize_append: k and v must be 4-byte aligned");
  a.src[0] = k;
  a.src[1] = v;
  a.token_stride = token_stride;
  a.seq_idx = seq_idx;
  a.pos = pos;
  a.num_tokens = num_tokens;
  a.batch = batch;
  const dim3 grid = vector_grid(num_tokens, a.cache.num_kv_heads);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  dispatch(d, dtype, [&](auto dim, auto type) {
    quantize_append_kernel<decltype(dim)::value, typename decltype(type)::type>
        <<<grid, 32 * kVectorWarps, 0, s>>>(a);
  });
  return check_launch("quantize_append");
}
