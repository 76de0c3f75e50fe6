// cache.h: a validated tq_paged_cache as the kernels take it by value, and where a page lives.
#pragma once

#include <cstdint>

#include "layout.h"

namespace tq {

struct CacheView {
  uint8_t* pool[2];         // 0: K, 1: V
  uint32_t chunk_bytes[2];  // below 4 GiB (make_cache_view): a chunk's offset is one 32 x 32-bit product
  const int32_t* block_table;  // [batch][2][max_blocks]
  int max_blocks;
  int tokens;               // T
  int num_kv_heads;
  int num_chunks;
  CodecLayout codec[2];     // 0: key, 1: value
  const float* page_lse_shift;  // [num_q_heads] or nullptr (tq_paged_cache::page_lse_shift)
};

// Checks the cache description (null pointers, head dims, widths, alignment, chunk strides).
tq_status make_cache_view(const tq_paged_cache* cache, CacheView* out);

// The chunk holding `block` of (seq, kv), or -1 when the block lies beyond the table or the table
// names a chunk outside the pool (bad device input is skipped, never dereferenced).
__host__ __device__ inline int chunk_of(const CacheView& c, int seq, int kv, int block) {
  if (block < 0 || block >= c.max_blocks) return -1;
  const int chunk = c.block_table[(int64_t(seq) * 2 + kv) * c.max_blocks + block];
  return chunk >= 0 && chunk < c.num_chunks ? chunk : -1;
}

// The page of `head` in a valid chunk.
__host__ __device__ inline uint8_t* page_in_chunk(const CacheView& c, int kv, int chunk, int head) {
  return c.pool[kv] + uint64_t(uint32_t(chunk)) * c.chunk_bytes[kv] + uint32_t(head) * uint32_t(c.codec[kv].page_bytes);
}

// The page of (seq, kv, block, head), or nullptr (see chunk_of).
__host__ __device__ inline uint8_t* page_of(const CacheView& c, int seq, int kv, int block,
                                            int head) {
  const int chunk = chunk_of(c, seq, kv, block);
  return chunk < 0 ? nullptr : page_in_chunk(c, kv, chunk, head);
}

}  // namespace tq
