// attention_plan.cpp: tq_attention_plan, the split of a call's keys over CTAs and its workspace,
// and the checks of a call against its plan (tq_attention_run, attention.cu, runs them first).
// Host only; the one device query is the SM count where the caller gives none.
#include "attention_plan.h"

#include <algorithm>
#include <cmath>

#include "errors.h"

namespace tq {
namespace {

// The largest q_len the split pass serves at a GQA group: more than kPrefillMinRows query rows per
// KV head go to the prefill pass.
int split_pass_max_q_len(int group) { return kPrefillMinRows / group; }

// The pass a call runs and its row tiles, before the split.
SplitPlan pass_of(int q_len, int group) {
  SplitPlan p{};
  const int rows = q_len * group;
  p.prefill = q_len > split_pass_max_q_len(group);
  p.row_tiles = (rows + kRows - 1) / kRows;
  p.cta_tiles = p.prefill ? (rows + kPrefillRows - 1) / kPrefillRows : p.row_tiles;
  return p;
}

// A split is a whole number of steps of both passes: kWarps x 32 tokens (the split pass: one tile
// per warp; twice that with kWideWarps), 128 tokens (the prefill pass).
constexpr int kSplitStep = kWarps * kChunk;
static_assert(kSplitStep % kTile == 0);
// Split CTAs never exceed kMaxWaves waves of the pass (or one per sequence, KV head and CTA row
// tile), which bounds the workspace (tq_attention_plan_info::workspace_bytes).
constexpr int kMaxWaves = 4;
int64_t max_split_ctas(int64_t ctas, int resident, int sms) {
  return std::max<int64_t>(ctas, int64_t(kMaxWaves) * sms * resident);
}

// The split pass's cost model (docs/BENCHMARKS.md#the-split-length-a-cost-model), in units of one
// warp's 32-token tile, fitted to H200 timings of 3-bit d 128 decode (1 x 1,024 to 32 x 32,768
// tokens, q_len 1 and 4, splits of 128 to 8,192 tokens, CTAs of 4 warps): with t tiles per warp,
// the busiest SM's w CTAs of W warps cost w (kPrologueTiles + W t (1 + kFewCtas / r)), r of them
// resident at once (each CTA's prologue, the query rotation and the tables, costs as much as 9
// tiles; fewer resident warps hide less latency), and no less than one CTA's latency alone,
// kLonePrologue + kLoneTile t.
constexpr double kPrologueTiles = 9.0, kFewCtas = 0.2, kLonePrologue = 4.5, kLoneTile = 5.5;
// Where the 4-warp plan's splits are at least kWideMinTiles tiles per warp long, the call runs on
// kWideWarps CTAs instead if they fit one wave and the model rates them at most kWideMaxCost
// times the 4-warp plan: on the H200 they were 1.5-5% faster from 1 x 16,384 to 32 x 32,768
// tokens (the model, fitted to 4-warp CTAs, rated them up to 4% dearer there), even at 1 x 8,192
// (4 tiles), 2-4% slower at 1 x 4,096 (2 tiles), and 8% slower over 1.45 waves (SmolLM2 16 x
// 8,192; docs/BENCHMARKS.md#the-split-length-a-cost-model).
constexpr int kWideMinTiles = 8;
constexpr double kWideMaxCost = 1.05;

// Split pass: steps per split of least modelled time (the most splits among equals). The cost
// grows with the steps per split at a given count w of CTAs on the busiest SM, so the candidates
// are the most splits that keep each w: a handful of plans, not one per split count.
struct SplitSteps {
  int per;      // steps per split
  double cost;  // modelled
};
SplitSteps split_pass_steps(int64_t ctas, int steps, int resident, int64_t cap, int warps, int sms) {
  int best = steps;
  double best_cost = INFINITY;
  for (int64_t w = (cap + sms - 1) / sms; w >= 1; --w) {
    const int64_t s = std::min<int64_t>({steps, w * sms / ctas, cap / ctas});
    if (s < 1) continue;
    const int per = int((steps + s - 1) / s);
    const int64_t n = ctas * ((steps + per - 1) / per);
    const int64_t on_sm = (n + sms - 1) / sms;  // CTAs on the busiest SM: w or fewer
    const double tile = 1.0 + kFewCtas / double(std::min<int64_t>(on_sm, resident));
    const double cost =
        std::max(double(on_sm) * (kPrologueTiles + warps * per * tile), kLonePrologue + kLoneTile * per);
    if (cost < best_cost) best = per, best_cost = cost;
  }
  return {best, best_cost};
}

// Prefill pass: as many splits as fill whole waves of its CTAs (a long history at batch 1 fills the
// GPU), each at least kPrefillMinSplitTokens long; steps per split. (The split pass's cost model
// does not describe it: 256-row CTAs, one per SM.)
constexpr int kPrefillMinSplitTokens = 256;
int prefill_pass_steps(int64_t ctas, int len, int64_t cap, int sms) {
  const int64_t slots = int64_t(sms) * kPrefillCtasPerSm;
  const int max_splits = std::max(1, len / kPrefillMinSplitTokens);
  int best = 1;
  double best_eff = 0.0;
  for (int s = 1; s <= std::min(max_splits, 1024); ++s) {
    const int64_t n = ctas * s;
    if (n > cap) break;
    const double eff = double(n) / double((n + slots - 1) / slots * slots);
    if (eff > best_eff + 0.02) { best = s; best_eff = eff; }  // fewer splits unless clearly better
  }
  return ((len + best - 1) / best + kSplitStep - 1) / kSplitStep;
}

// wide_fits: kWideWarps CTAs of the call's codecs fit ctas_per_sm(1, kWideWarps) per SM.
SplitPlan plan_splits(int batch, int q_len, int group, int num_kv_heads, int max_kv_len, bool wide_fits, int sms) {
  SplitPlan p = pass_of(q_len, group);
  const int64_t ctas = int64_t(batch) * num_kv_heads * p.cta_tiles;
  const int len = std::max(1, max_kv_len), nr = row_ntiles(q_len * group);
  // The plan of CTAs of w warps (steps of w x kChunk tokens); its modelled cost.
  auto plan = [&](SplitPlan& q, int w) {
    q.warps = w;
    const int steps = (len + w * kChunk - 1) / (w * kChunk);
    const int resident = q.prefill ? kPrefillCtasPerSm : ctas_per_sm(nr, w);
    const int64_t cap = max_split_ctas(ctas, resident, sms);
    const SplitSteps s = q.prefill ? SplitSteps{prefill_pass_steps(ctas, len, cap, sms), 0.0}
                                   : split_pass_steps(ctas, steps, resident, cap, w, sms);
    q.split_tokens = s.per * w * kChunk;
    q.num_splits = (steps + s.per - 1) / s.per;
    return s;
  };
  const SplitSteps narrow = plan(p, kWarps);
  if (p.prefill || nr != 1 || !wide_fits || narrow.per < kWideMinTiles) return p;
  SplitPlan wide = p;
  const SplitSteps w = plan(wide, kWideWarps);
  const bool one_wave = ctas * wide.num_splits <= int64_t(sms) * ctas_per_sm(1, kWideWarps);
  return one_wave && w.cost <= kWideMaxCost * narrow.cost ? wide : p;
}

// Slots enough for every call whose batch, q_len and max_kv_len are at most these (the TensorRT
// plugin sizes its workspace once, for its profile's maxima), from the bounds on split CTAs: a
// pass's CTAs n <= max_split_ctas, each split at least one step; a split-pass CTA keeps kRows
// rows per split, a prefill CTA at most kPrefillRows. (kWideWarps CTAs: fewer resident per SM and
// longer steps, so fewer CTAs and splits than these bounds.)
size_t slots_bound(int batch, int q_len, int group, int num_kv_heads, int max_kv_len, int sms) {
  const int steps = (std::max(1, max_kv_len) + kSplitStep - 1) / kSplitStep;
  const SplitPlan sp = pass_of(std::min(q_len, split_pass_max_q_len(group)), group);  // its largest
  int64_t bound = int64_t(kRows) * max_split_ctas(int64_t(batch) * num_kv_heads * sp.cta_tiles, ctas_per_sm(1, kWarps), sms);
  const SplitPlan pp = pass_of(q_len, group);
  if (pp.prefill)
    bound = std::max(bound, int64_t(kPrefillRows) *
                                max_split_ctas(int64_t(batch) * num_kv_heads * pp.cta_tiles, kPrefillCtasPerSm, sms));
  return size_t(std::min(bound, int64_t(batch) * num_kv_heads * pp.row_tiles * kRows * steps)) +
         chunk_rows(pp, batch, num_kv_heads, q_len);
}

// The current device's SM count, or kDefaultSms where no device answers.
int current_sms() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1) {
    cudaGetLastError();  // leave no stale error for the next check_launch
    return kDefaultSms;
  }
  return sms;
}

}  // namespace

size_t workspace_bytes(size_t slots, int head_dim) {
  return slots * head_dim * sizeof(float) + slots * sizeof(float2) + 16;
}

// Workspace slots (query rows x splits) of a plan.
size_t plan_slots(const SplitPlan& p, int batch, int num_kv_heads) {
  return size_t(batch) * num_kv_heads * p.row_tiles * kRows * p.num_splits;
}

// The chunk pass's states of a call of q_len tokens (one per query row, counted as workspace slots),
// needed where it has new rows (counted in the bound below whether or not it has).
size_t chunk_rows(const SplitPlan& p, int batch, int num_kv_heads, int q_len) {
  return q_len > kMaxMergeChunk ? size_t(batch) * num_kv_heads * p.row_tiles * kRows : 0;
}

SplitPlan split_plan_of(const tq_attention_plan_info& plan, bool wide_fits) {
  SplitPlan p = pass_of(plan.q_len, plan.num_q_heads / plan.num_kv_heads);
  const bool wide = wide_fits && plan.wide_num_splits > 0;
  p.warps = wide ? kWideWarps : kWarps;
  p.num_splits = wide ? plan.wide_num_splits : plan.num_splits;
  p.split_tokens = wide ? plan.wide_split_tokens : plan.split_tokens;
  return p;
}

tq_status check_call(const tq_attention_plan_info* plan, const tq_attention_params* params, CacheView* view) {
  if (!plan || !params)
    return fail(TQ_ERR_NULL_POINTER, "attention_run: plan and params must not be NULL");
  const tq_attention_params& p = *params;
  TQ_TRY(make_cache_view(p.cache, view));
  const int heads = view->num_kv_heads, d = view->codec[0].head_dim;
  if (p.batch != plan->batch || p.q_len != plan->q_len || p.num_q_heads != plan->num_q_heads ||
      p.max_kv_len != plan->max_kv_len || heads != plan->num_kv_heads || d != plan->head_dim)
    return fail(TQ_ERR_INVALID_ARGUMENT, "attention_run: the call (batch %d, q_len %d, %d query heads, %d KV "
                "heads, head_dim %d, max_kv_len %d) is not the shape its plan was made for (batch %d, q_len "
                "%d, %d, %d, %d, %d); make a plan for it with tq_attention_plan", p.batch, p.q_len,
                p.num_q_heads, heads, d, p.max_kv_len, plan->batch, plan->q_len, plan->num_q_heads,
                plan->num_kv_heads, plan->head_dim, plan->max_kv_len);
  if (!p.k_new != !p.v_new)
    return fail(TQ_ERR_NULL_POINTER, "attention_run: k_new and v_new must be given together (or both NULL)");
  if (p.append != 0 && p.append != 1)
    return fail(TQ_ERR_INVALID_ARGUMENT, "attention_run: append %d must be 0 or 1", p.append);
  if (p.append && !p.k_new)
    return fail(TQ_ERR_NULL_POINTER, "attention_run: append needs k_new and v_new (the rows it writes); "
                "they must not be NULL");
  if (p.append && p.q_len > TQ_MAX_DECODE_Q_LEN)
    return fail(TQ_ERR_BAD_LENGTH, "attention_run: append takes q_len 1..%d (a decode step), got %d; "
                "write a longer chunk with tq_quantize_append first", TQ_MAX_DECODE_Q_LEN, p.q_len);
  if (p.k_new) {
    if (reinterpret_cast<uintptr_t>(p.k_new) % 4 || reinterpret_cast<uintptr_t>(p.v_new) % 4)
      return fail(TQ_ERR_MISALIGNED, "attention_run: k_new and v_new must be 4-byte aligned");
    if (p.new_stride % 2)
      return fail(TQ_ERR_MISALIGNED, "attention_run: new_stride %lld must be even (4-byte aligned rows)",
                  (long long)p.new_stride);
    if (p.new_stride < int64_t(heads) * d)
      return fail(TQ_ERR_INVALID_ARGUMENT, "attention_run: new_stride %lld is smaller than num_kv_heads x "
                  "head_dim = %d", (long long)p.new_stride, heads * d);
  }
  if (!p.q || !p.out || !p.kv_lens)
    return fail(TQ_ERR_NULL_POINTER, "attention_run: q, out and kv_lens must not be NULL");
  if (reinterpret_cast<uintptr_t>(p.lse) % alignof(float))
    return fail(TQ_ERR_MISALIGNED, "attention_run: lse must be 4-byte aligned");
  if (int64_t(p.max_kv_len) > int64_t(view->max_blocks) * view->tokens)
    return fail(TQ_ERR_BAD_LENGTH, "attention_run: max_kv_len %d lies beyond the block table (%d blocks of "
                "%d tokens)", p.max_kv_len, view->max_blocks, view->tokens);
  if (p.dtype != TQ_FP16 && p.dtype != TQ_BF16)
    return fail(TQ_ERR_INVALID_ARGUMENT, "attention_run: dtype %d is neither TQ_FP16 nor TQ_BF16", int(p.dtype));
  if (!(p.softmax_scale > 0.0f) || !std::isfinite(p.softmax_scale))
    return fail(TQ_ERR_INVALID_ARGUMENT, "attention_run: softmax_scale must be positive and finite");
  return TQ_OK;
}

tq_status check_workspace(const SplitPlan& sp, const tq_attention_params& params, int num_kv_heads, int head_dim,
                          const void* workspace, size_t ws_bytes, size_t* slots, size_t* chunk) {
  *slots = plan_slots(sp, params.batch, num_kv_heads);
  *chunk = params.k_new ? chunk_rows(sp, params.batch, num_kv_heads, params.q_len) : 0;
  const size_t need = workspace_bytes(*slots + *chunk, head_dim);
  if (!workspace || ws_bytes < need)
    return fail(TQ_ERR_WORKSPACE, "attention_run: the workspace needs %zu bytes, got %zu%s", need, ws_bytes,
                workspace ? "" : " (NULL)");
  if (reinterpret_cast<uintptr_t>(workspace) % 16)
    return fail(TQ_ERR_MISALIGNED, "attention_run: the workspace must be 16-byte aligned");
  return TQ_OK;
}

}  // namespace tq

extern "C" tq_status tq_attention_plan(int32_t batch, int32_t q_len, int32_t num_q_heads, int32_t num_kv_heads,
                                       int32_t head_dim, int32_t max_kv_len, int32_t num_sms,
                                       tq_attention_plan_info* plan) {
  using namespace tq;
  if (!plan) return fail(TQ_ERR_NULL_POINTER, "attention_plan: plan must not be NULL");
  *plan = tq_attention_plan_info{};
  if (head_dim != 64 && head_dim != 128)
    return fail(TQ_ERR_UNSUPPORTED_HEAD_DIM, "attention_plan: head_dim %d is not supported (64 or 128)", head_dim);
  if (batch < 1 || q_len < 1 || q_len > kMaxPrefillQLen)
    return fail(TQ_ERR_BAD_LENGTH, "attention_plan: batch %d must be >= 1 and q_len %d in 1..%d", batch, q_len,
                kMaxPrefillQLen);
  if (num_kv_heads < 1 || num_q_heads < num_kv_heads || num_q_heads % num_kv_heads ||
      num_q_heads / num_kv_heads > TQ_MAX_GQA_GROUP)
    return fail(TQ_ERR_INVALID_ARGUMENT, "attention_plan: num_q_heads %d must be 1 to %d times num_kv_heads %d "
                "(>= 1)", num_q_heads, TQ_MAX_GQA_GROUP, num_kv_heads);
  if (max_kv_len < 0)
    return fail(TQ_ERR_BAD_LENGTH, "attention_plan: max_kv_len %d must be >= 0", max_kv_len);
  if (num_sms < 0)
    return fail(TQ_ERR_INVALID_ARGUMENT, "attention_plan: num_sms %d must be >= 0 (0: the current device's)",
                num_sms);
  const int sms = num_sms ? num_sms : current_sms();
  const int group = num_q_heads / num_kv_heads;
  const SplitPlan narrow = plan_splits(batch, q_len, group, num_kv_heads, max_kv_len, false, sms);
  if (int64_t(batch) * narrow.cta_tiles > 65535)
    return fail(TQ_ERR_BAD_LENGTH, "attention_plan: batch %d x %d tiles of %d query rows exceeds the grid limit "
                "(65535); split the batch or the chunk", batch, narrow.cta_tiles,
                narrow.prefill ? kPrefillRows : kRows);
  const SplitPlan best = plan_splits(batch, q_len, group, num_kv_heads, max_kv_len, true, sms);
  const bool wide = best.warps == kWideWarps;
  *plan = tq_attention_plan_info{batch, q_len, num_q_heads, num_kv_heads, head_dim, max_kv_len, sms,
                                 narrow.prefill ? 1 : 0, narrow.num_splits, narrow.split_tokens,
                                 wide ? best.num_splits : 0, wide ? best.split_tokens : 0,
                                 workspace_bytes(slots_bound(batch, q_len, group, num_kv_heads, max_kv_len, sms),
                                                 head_dim)};
  return TQ_OK;
}
