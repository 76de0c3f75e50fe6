// cache.cpp: validation of tq_paged_cache.
#include "cache.h"

#include "errors.h"

namespace tq {

tq_status make_cache_view(const tq_paged_cache* cache, CacheView* out) {
  if (!cache) return fail(TQ_ERR_NULL_POINTER, "the paged cache description is NULL");
  if (!cache->k_pool || !cache->v_pool || !cache->block_table)
    return fail(TQ_ERR_NULL_POINTER, "the paged cache needs k_pool, v_pool and block_table");
  if (cache->num_kv_heads < 1)
    return fail(TQ_ERR_INVALID_ARGUMENT, "num_kv_heads %d must be positive", cache->num_kv_heads);
  if (cache->max_blocks < 1 || cache->num_chunks < 1)
    return fail(TQ_ERR_INVALID_ARGUMENT, "max_blocks (%d) and num_chunks (%d) must be positive",
                cache->max_blocks, cache->num_chunks);
  CacheView v{};
  TQ_TRY(make_layout(&cache->key, cache->tokens_per_block, "key", &v.codec[0]));
  TQ_TRY(make_layout(&cache->value, cache->tokens_per_block, "value", &v.codec[1]));
  if (cache->value.rotary_pairs)
    return fail(TQ_ERR_INVALID_ARGUMENT, "the value codec has %d rotary pairs; the rotary mean is "
                "for keys only (set value.rotary_pairs to 0)", cache->value.rotary_pairs);
  if (cache->key.head_dim != cache->value.head_dim)
    return fail(TQ_ERR_INVALID_ARGUMENT, "keys (head_dim %d) and values (head_dim %d) must share "
                "head_dim", cache->key.head_dim, cache->value.head_dim);
  void* pools[2] = {cache->k_pool, cache->v_pool};
  const int64_t strides[2] = {cache->k_chunk_bytes, cache->v_chunk_bytes};
  const char* names[2] = {"k", "v"};
  for (int kv = 0; kv < 2; ++kv) {
    if (reinterpret_cast<uintptr_t>(pools[kv]) % 16)
      return fail(TQ_ERR_MISALIGNED, "%s_pool must be 16-byte aligned", names[kv]);
    const int64_t need = int64_t(cache->num_kv_heads) * v.codec[kv].page_bytes;
    if (strides[kv] < need || strides[kv] % 16)
      return fail(TQ_ERR_MISALIGNED, "%s_chunk_bytes %lld must be a multiple of 16 and at least "
                  "num_kv_heads x page bytes = %lld", names[kv], (long long)strides[kv],
                  (long long)need);
    if (strides[kv] > int64_t(UINT32_MAX))
      return fail(TQ_ERR_INVALID_ARGUMENT, "%s_chunk_bytes %lld must be below 4 GiB (one block's pages "
                  "of every head, or of every layer where the pool interleaves them)", names[kv],
                  (long long)strides[kv]);
    v.pool[kv] = static_cast<uint8_t*>(pools[kv]);
    v.chunk_bytes[kv] = uint32_t(strides[kv]);
  }
  if (reinterpret_cast<uintptr_t>(cache->page_lse_shift) % 4)
    return fail(TQ_ERR_MISALIGNED, "page_lse_shift must be 4-byte aligned");
  v.page_lse_shift = cache->page_lse_shift;
  v.block_table = cache->block_table;
  v.max_blocks = cache->max_blocks;
  v.tokens = cache->tokens_per_block;
  v.num_kv_heads = cache->num_kv_heads;
  v.num_chunks = cache->num_chunks;
  *out = v;
  return TQ_OK;
}

}  // namespace tq
