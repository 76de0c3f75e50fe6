// attention_plan.h: the host plan of an attention call (tq_attention_plan; attention_plan.cpp):
// which pass runs, how the keys split over CTAs, the workspace, and the checks of a call against
// its plan. Host-only code: no kernel and no device query here, so that a CPU test
// (kernels/tests/attention_plan_test.cu) runs it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention_traits.h"
#include "cache.h"
#include "tq/tq_kernels.h"

namespace tq {

struct SplitPlan {
  bool prefill;   // the prefill pass (more than kPrefillMinRows rows per KV head), else the split pass
  int cta_tiles;  // CTA row tiles per (sequence, KV head): kPrefillRows or kRows rows each
  int row_tiles;  // 16-row tiles of the workspace per (sequence, KV head)
  int num_splits, split_tokens;
  int warps;      // per split-pass CTA: kWarps or kWideWarps
};

// The plan a call of `plan` runs where kWideWarps CTAs of its codecs fit (wide_fits) or not.
SplitPlan split_plan_of(const tq_attention_plan_info& plan, bool wide_fits);

// Workspace bytes of `slots` partial states at head_dim.
size_t workspace_bytes(size_t slots, int head_dim);
// Workspace slots (query rows x splits) of a plan, and the chunk pass's states of a call of q_len
// tokens with new rows (0 where the merge pass takes the chunk term).
size_t plan_slots(const SplitPlan& p, int batch, int num_kv_heads);
size_t chunk_rows(const SplitPlan& p, int batch, int num_kv_heads, int q_len);

// The checks of a call against its plan, in order: the cache (make_cache_view, into *view), the
// shape the plan was made for, the new rows, the pointers, lengths, dtype and scale. The
// workspace is checked once the pass is known (check_workspace).
tq_status check_call(const tq_attention_plan_info* plan, const tq_attention_params* params, CacheView* view);
// The workspace of a call of plan `sp` (new_rows: it has k_new, v_new): present, large enough
// and 16-byte aligned; *slots, *chunk: its split states and chunk-pass states.
tq_status check_workspace(const SplitPlan& sp, const tq_attention_params& params, int num_kv_heads, int head_dim,
                          const void* workspace, size_t workspace_bytes, size_t* slots, size_t* chunk);

// The SM count an H200 has, which the plan assumes where no device answers.
constexpr int kDefaultSms = 132;

}  // namespace tq
