// rope.cu: rotary embedding fused with the split of the QKV projection (tq_rope.h).
// Memory-bound and tiny next to attention, so it favours clarity: one block per token, angles in
// double so that positions up to 10^6 keep full fp32 accuracy after the range reduction.
#include "tq/tq_rope.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>

namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;

// Inverse frequency of channel pair `pair` after the configured scaling (HF transformers semantics).
__device__ double inverse_frequency(int pair, int head_dim, tq_rope_params rope) {
  double inv = pow((double)rope.base, -2.0 * pair / head_dim);
  if (rope.scaling == TQ_ROPE_SCALING_LINEAR) return inv / rope.factor;
  if (rope.scaling != TQ_ROPE_SCALING_LLAMA3) return inv;
  double low_wavelen = rope.original_max_positions / (double)rope.low_freq_factor;
  double high_wavelen = rope.original_max_positions / (double)rope.high_freq_factor;
  double wavelen = kTwoPi / inv;
  if (wavelen < high_wavelen) return inv;
  if (wavelen > low_wavelen) return inv / rope.factor;
  double smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) /
                  ((double)rope.high_freq_factor - rope.low_freq_factor);
  return (1.0 - smooth) * inv / rope.factor + smooth * inv;
}

template <typename T> __device__ float to_float(T x);
template <> __device__ float to_float(__half x) { return __half2float(x); }
template <> __device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ T from_float(float x);
template <> __device__ __half from_float(float x) { return __float2half_rn(x); }
template <> __device__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }

template <typename T>
__global__ void rope_split_kernel(const T* qkv, int64_t qkv_stride, const int32_t* pos, int hq,
                                  int hkv, int head_dim, tq_rope_params rope, T* q_out, T* kv_out) {
  const int token = blockIdx.x;
  const int half = head_dim / 2;
  const int heads = hq + 2 * hkv;
  const T* row = qkv + token * qkv_stride;
  const double position = pos[token];
  for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
    const int head = i / half, pair = i % half;
    const T* src = row + head * head_dim;
    T* dst = head < hq ? q_out + ((int64_t)token * hq + head) * head_dim
                       : kv_out + ((int64_t)token * 2 * hkv + (head - hq)) * head_dim;
    if (head >= hq + hkv) {  // values are not rotated
      dst[pair] = src[pair];
      dst[pair + half] = src[pair + half];
      continue;
    }
    double s, c;
    sincos(position * inverse_frequency(pair, head_dim, rope), &s, &c);
    const float x0 = to_float(src[pair]), x1 = to_float(src[pair + half]);
    dst[pair] = from_float<T>(x0 * (float)c - x1 * (float)s);
    dst[pair + half] = from_float<T>(x1 * (float)c + x0 * (float)s);
  }
}

bool rope_params_valid(const tq_rope_params* r) {
  if (!(r->base > 0.f)) return false;
  if (r->scaling == TQ_ROPE_SCALING_NONE) return true;
  if (!(r->factor > 0.f)) return false;
  if (r->scaling == TQ_ROPE_SCALING_LINEAR) return true;
  return r->scaling == TQ_ROPE_SCALING_LLAMA3 && r->low_freq_factor > 0.f &&
         r->high_freq_factor > r->low_freq_factor && r->original_max_positions > 0;
}

}  // namespace

extern "C" tq_status tq_rope_split_qkv(const void* qkv, int64_t qkv_stride, tq_dtype dtype,
                                       const int32_t* pos, int32_t num_tokens, int32_t num_q_heads,
                                       int32_t num_kv_heads, int32_t head_dim,
                                       const tq_rope_params* rope, void* q_out, void* kv_out,
                                       tq_stream stream) {
  if (!qkv || !pos || !rope || !q_out || !kv_out) return TQ_ERR_NULL_POINTER;
  if (head_dim <= 0 || head_dim % 2) return TQ_ERR_UNSUPPORTED_HEAD_DIM;
  if (num_tokens < 0 || num_q_heads <= 0 || num_kv_heads <= 0 ||
      qkv_stride < (int64_t)(num_q_heads + 2 * num_kv_heads) * head_dim || !rope_params_valid(rope))
    return TQ_ERR_INVALID_ARGUMENT;
  if (num_tokens == 0) return TQ_OK;
  const int threads = 256;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (dtype == TQ_FP16)
    rope_split_kernel<__half><<<num_tokens, threads, 0, s>>>(
        static_cast<const __half*>(qkv), qkv_stride, pos, num_q_heads, num_kv_heads, head_dim,
        *rope, static_cast<__half*>(q_out), static_cast<__half*>(kv_out));
  else if (dtype == TQ_BF16)
    rope_split_kernel<__nv_bfloat16><<<num_tokens, threads, 0, s>>>(
        static_cast<const __nv_bfloat16*>(qkv), qkv_stride, pos, num_q_heads, num_kv_heads,
        head_dim, *rope, static_cast<__nv_bfloat16*>(q_out), static_cast<__nv_bfloat16*>(kv_out));
  else
    return TQ_ERR_INVALID_ARGUMENT;
  return cudaGetLastError() == cudaSuccess ? TQ_OK : TQ_ERR_CUDA;
}
