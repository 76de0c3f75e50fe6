// attention_params.cuh: the arguments every attention pass takes (AttnArgs, by value) and the
// workspace layout they index: what tq_attention_run fills from a plan and a call's parameters.
#pragma once

#include <cuda_runtime.h>

#include "attention_traits.h"
#include "cache.h"

namespace tq {

// A divisor known only at run time, with its reciprocal from the host: x / d by one float product
// and a correction instead of an integer division (about 20 instructions and a MUFU round trip,
// several of which sat on the split pass's prologue chain). For 0 <= x < kSmallDividendLimit,
// float(x) is exact and the product lies within 1 of x / d, which the remainder's sign corrects.
struct SmallDivisor {
  int d;
  float inv;  // 1 / d
};
inline SmallDivisor small_divisor(int d) { return {d, 1.0f / float(d)}; }
__host__ __device__ inline int quotient(int x, SmallDivisor s) {
  const int q = int(float(x) * s.inv), r = x - q * s.d;
  return r < 0 ? q - 1 : r >= s.d ? q + 1 : q;
}

// Query rows are the q_len x group query vectors that share one KV head: row = token * group +
// head in group.
struct AttnArgs {
  CacheView cache;
  PageShape tile[2];    // K and V laid out for a kTile-token staging tile (prefill pass)
  PageShape chunk[2];   // ... for a kChunk-token staging tile (split pass)
  const void* q;
  void* out;
  float* lse;           // [batch][q_len][num_q_heads] natural-log log-sum-exp, or null
  const int32_t* kv_lens;
  int max_kv_len, q_len, num_q_heads, rows;
  SmallDivisor group;      // query heads per KV head (rows < kSmallDividendLimit: kMaxPrefillQLen)
  SmallDivisor row_tiles;  // 16-row tiles per (sequence, KV head) in the workspace
  int num_splits, split_tokens;
  float q_scale;        // softmax_scale * log2(e)
  // The call's new keys and values, the rows of the last q_len positions (k_new, v_new), or null.
  // Given, each query row attends to the call's positions up to its own with them, exactly (the
  // chunk term: the merge pass, or the chunk pass for long calls), and the passes over the cache
  // stop before the call's first position (cache_end).
  const void* new_kv[2];
  int64_t new_stride;     // their token stride, elements
  bool append;            // the fused append: new_kv written into the pages
  // A one-token step's fused append runs in CTAs of its own, as no split reads that position
  // (cache_end): the split pass's from append_cta0 on (launched after every split's CTA), else
  // (kNoAppendCtas) the merge pass's after its query rows' (merge_appends). A longer step's: the
  // splits whose ranges hold the new positions encode them (none reads them).
  int append_cta0;
  bool merge_appends;
  // The split pass lets the merge pass start at once, not after its tile loop (tq_attention_run).
  bool merge_at_start;
  float* ws_o;          // [batch][Hkv][row_tiles * 16][splits][D]: unnormalized partial outputs
  float2* ws_ml;        // [batch][Hkv][row_tiles * 16][splits]: (running max, sum) in base 2
  // The chunk pass's states (calls with new_kv longer than kMaxMergeChunk), else null:
  // [batch][Hkv][row_tiles * 16] rows (chunk_slot), the output in original channels.
  float* chunk_o;
  float2* chunk_ml;     // (max, sum) in base 2, in units of q_scale q . k (the key mean left in)
};

// Query row r's slot among the chunk pass's states (AttnArgs::chunk_o, chunk_ml).
__host__ __device__ inline int64_t chunk_slot(const AttnArgs& a, int b, int kvh, int r) {
  return (int64_t(b) * a.cache.num_kv_heads + kvh) * a.row_tiles.d * kRows + r;
}

// The workspace slot of query row r's partial state in split `split` (AttnArgs::ws_o, ws_ml).
__host__ __device__ inline int64_t ws_slot(const AttnArgs& a, int b, int kvh, int r, int split) {
  return ((int64_t(b) * a.cache.num_kv_heads + kvh) * a.row_tiles.d * kRows + r) * a.num_splits + split;
}

}  // namespace tq
