// quantize_append.cu: tq_quantize_append. One warp encodes one (token, KV head, K or V) vector
// (encode_vector.cuh) into the slot its sequence and position name.
#include "cache.h"
#include "encode_vector.cuh"
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

template <int D, typename T>
__global__ void __launch_bounds__(32 * kVectorWarps) quantize_append_kernel(AppendArgs a) {
  __shared__ SearchScratch scratch[kVectorWarps];
  VectorItem v;
  if (!vector_item(a.num_tokens, a.cache.num_kv_heads, v)) return;
  const int kv = v.kv, head = v.head, token = v.token;
  const int seq = a.seq_idx[token], pos = a.pos[token];
  if (seq < 0 || seq >= a.batch || pos < 0) return;
  const CodecLayout& l = a.cache.codec[kv];
  uint8_t* page = page_of(a.cache, seq, kv, pos / a.cache.tokens, head);
  const T* x = static_cast<const T*>(a.src[kv]) + token * a.token_stride + int64_t(head) * D;
  encode_vector<D, T, true>(l, head, x, page, pos, &scratch[threadIdx.x / 32]);
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
