// dequantize.cu: tq_dequantize. One warp decodes one (position, KV head, K or V) vector
// (docs/FORMAT.md section 1, step 5): centroids, inverse rotation, norm, signs, un-permutation,
// scale, mean and rotary mean. For tests and export; attention never materializes these vectors.
#include "cache.h"
#include "device_common.cuh"
#include "errors.h"

namespace tq {
namespace {

struct DequantArgs {
  CacheView cache;
  void* dst[2];  // k_out, v_out (either may be null)
  int seq, start, len;
};

template <int D, typename T>
__global__ void __launch_bounds__(32 * kVectorWarps) dequantize_kernel(DequantArgs a) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31;
  const int heads = a.cache.num_kv_heads;
  VectorItem v;
  if (!vector_item(a.len, heads, v)) return;
  const int kv = v.kv, head = v.head, t = v.token;
  if (!a.dst[kv]) return;
  const int pos = a.start + t;
  const CodecLayout& l = a.cache.codec[kv];
  T* out = static_cast<T*>(a.dst[kv]) + (int64_t(t) * heads + head) * D;
  const uint8_t* page = page_of(a.cache, a.seq, kv, pos / a.cache.tokens, head);
  if (!page) {  // a block-table entry outside the pool: report NaN rather than read it
    for (int e = 0; e < E; ++e) out[lane * E + e] = from_float<T>(__int_as_float(0x7fc00000));
    return;
  }
  const int slot = pos % a.cache.tokens;
  const int g = group_index(l, lane * E);
  const GroupLayout& gl = l.group[g];
  float y[E];
#pragma unroll
  for (int e = 0; e < E; ++e) y[e] = l.codebook[g][code_at(page, l, g, slot, lane * E + e - gl.start)];
  warp_fwht<E>(y, gl.dim);  // the orthonormal Hadamard transform is its own inverse
  const float norm = norm_at(page, l, g, slot);
  int ch[E];
  float rot[E];
  lane_channels<E>(l, head, pos, ch, rot);
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const float z = y[e] * norm * rotation_sign(l.seed, lane * E + e);
    out[ch[e]] = from_float<T>(z * scale_of(l, head, ch[e]) + mean_of(l, head, ch[e]) + rot[e]);
  }
}

}  // namespace
}  // namespace tq

extern "C" tq_status tq_dequantize(const tq_paged_cache* cache, int32_t seq, int32_t start,
                                   int32_t len, void* k_out, void* v_out, tq_dtype dtype,
                                   tq_stream stream) {
  using namespace tq;
  DequantArgs a{};
  TQ_TRY(make_cache_view(cache, &a.cache));
  if (seq < 0 || start < 0 || len < 0 ||
      int64_t(start) + len > int64_t(a.cache.max_blocks) * a.cache.tokens)
    return fail(TQ_ERR_BAD_LENGTH, "dequantize: seq %d, positions [%d, %d) must be non-negative "
                "and within the block table (%d blocks of %d tokens)", seq, start, start + len,
                a.cache.max_blocks, a.cache.tokens);
  if (!k_out && !v_out)
    return fail(TQ_ERR_NULL_POINTER, "dequantize: k_out and v_out are both NULL");
  if (dtype != TQ_FP16 && dtype != TQ_BF16)
    return fail(TQ_ERR_INVALID_ARGUMENT, "dequantize: dtype %d is neither TQ_FP16 nor TQ_BF16",
                int(dtype));
  if (len == 0) return TQ_OK;
  a.dst[0] = k_out;
  a.dst[1] = v_out;
  a.seq = seq;
  a.start = start;
  a.len = len;
  const dim3 grid = vector_grid(len, a.cache.num_kv_heads);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  dispatch(a.cache.codec[0].head_dim, dtype, [&](auto dim, auto type) {
    dequantize_kernel<decltype(dim)::value, typename decltype(type)::type>
        <<<grid, 32 * kVectorWarps, 0, s>>>(a);
  });
  return check_launch("dequantize");
}
