// attention_traits.h: the attention passes' shapes as plain constants (no CUDA), shared by the
// kernels and by the host plan (attention_plan.cpp, which a CPU test compiles without a GPU):
// tokens per tile, query rows per tile, warps and stages per CTA, CTAs per SM.
#pragma once

#include <cstdint>

#include "tq/tq_kernels.h"

namespace tq {

constexpr int kTile = 16;  // tokens per staged page tile of the prefill pass, per mma of the split pass
constexpr int kChunk = 32;  // tokens per staged tile (one warp iteration) of the split pass
constexpr int kRows = 16;  // query rows per row tile of the workspace
// Query rows per KV head above which a call runs the prefill pass (256-row CTAs that decode each
// tile once into shared memory) instead of the split pass (16-row CTAs).
constexpr int kPrefillMinRows = 64;
constexpr int kPrefillWarps = 16;  // four warpgroups
constexpr int kPrefillRows = 256;  // query rows per CTA of the prefill pass, 16 per warp
constexpr int kPrefillCtasPerSm = 1;

// Calls with new_kv of at most this many tokens take their chunk term in the merge pass (a loop
// over the call's positions per query row); longer ones in the chunk pass (tensor cores).
constexpr int kMaxMergeChunk = TQ_MAX_DECODE_Q_LEN;

// quotient() (attention_common.cuh) is exact below this dividend.
constexpr int kSmallDividendLimit = 1 << 24;
// The longest call; its rows stay quotient()'s exact range.
constexpr int kMaxPrefillQLen = TQ_MAX_Q_LEN;
static_assert(int64_t(kMaxPrefillQLen) * TQ_MAX_GQA_GROUP < kSmallDividendLimit);
// The largest q_len the split pass serves at a GQA group is kPrefillMinRows / group: more query
// rows per KV head go to the prefill pass. A call with the fused append stays in the split pass.
static_assert(kPrefillMinRows >= TQ_MAX_GQA_GROUP * TQ_MAX_DECODE_Q_LEN);

// Warps per split-pass CTA: kWarps, or kWideWarps for long splits of at most 8 query rows, where
// sharing one prologue (query rotation, tables) among more tiles pays (plan_splits).
constexpr int kWarps = 4, kWideWarps = 8;
constexpr int kStages = 3;   // cp.async stages per warp: kChunk-token tiles in flight while one is computed
// Query-row n tiles (8 rows each) of the split kernel: 1 when every row of the call fits in 8,
// else 2. Twice the query fragments and accumulators leave room for fewer CTAs per SM.
constexpr int row_ntiles(int rows) { return rows <= 8 ? 1 : 2; }
// CTAs of w warps per SM: 16 warps at 128 registers per thread (nr 1), 12 at 170 (nr 2).
constexpr int ctas_per_sm(int nr, int w) { return (nr == 1 ? 16 : 12) / w; }
// Warps per query row in the merge pass. 8 at head_dim 64: SmolLM2's 1 x 8,192 call (32 splits over
// 9 rows) 1-5% faster alone and 6-7% in a CUDA graph than with 4 (1 x 2,048: 0-2% slower); at
// head_dim 128, 8 were up to 3% slower alone and 6% in graphs; 2 were slower at both
// (docs/BENCHMARKS.md#why-a-split-pass-and-a-merge-pass).
template <int D>
constexpr int kMergeWarps = D == 64 ? 8 : 4;

constexpr int kNoAppendCtas = 0x7fffffff;  // AttnArgs::append_cta0: no append CTAs

}  // namespace tq
