// Host-side checks of the attention plan and of a call's checks against it (attention_plan.cpp),
// run on the CPU without a GPU: the plan is deterministic, its workspace serves both of its CTA
// shapes and every smaller call, the grid limit and every bad shape are refused with their
// status, and tq_attention_run's checks (check_call, check_workspace) refuse each bad argument
// before anything would be launched. Built with attention_plan.cpp, cache.cpp, layout.cpp,
// errors.cpp, codec.cpp and last_error.cpp (tests/test_kernel_host_checks.py).
#include <cmath>
#include <cstdio>
#include <cstring>

#include "../attention_plan.h"

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL %s (last error: %s)\n", what, tq_last_error());
  }
}

tq_attention_plan_info plan_of(int batch, int q_len, int hq, int hkv, int d, int n, int sms = 132) {
  tq_attention_plan_info p{};
  const tq_status s = tq_attention_plan(batch, q_len, hq, hkv, d, n, sms, &p);
  if (s != TQ_OK) std::printf("plan(%d, %d, %d, %d, %d, %d) failed: %s\n", batch, q_len, hq, hkv, d, n, tq_last_error());
  return p;
}

size_t need(const tq_attention_plan_info& p, bool wide, bool new_rows) {
  const tq::SplitPlan sp = tq::split_plan_of(p, wide);
  const size_t chunk = new_rows ? tq::chunk_rows(sp, p.batch, p.num_kv_heads, p.q_len) : 0;
  return tq::workspace_bytes(tq::plan_slots(sp, p.batch, p.num_kv_heads) + chunk, p.head_dim);
}

void test_plans() {
  const tq_attention_plan_info a = plan_of(1, 1, 32, 8, 128, 131072), b = plan_of(1, 1, 32, 8, 128, 131072);
  expect(std::memcmp(&a, &b, sizeof(a)) == 0, "the same inputs give the same plan");
  // the measured plans on 132 SMs (docs/BENCHMARKS.md#the-split-length-a-cost-model;
  // tests/test_kernels_binding.py pins the rest
  // through the library): 1 x 131,072 at q_len 1 runs 32 splits of 8-warp CTAs, 49 of 4 warps
  expect(a.num_splits == 49 && a.wide_num_splits == 32 && !a.prefill, "1 x 131,072: 49 splits, 32 wide");
  const tq_attention_plan_info c = plan_of(1, 1, 32, 8, 128, 1024);
  expect(c.num_splits == 8 && c.wide_num_splits == 0, "1 x 1,024: 8 splits of 4-warp CTAs only");
  expect(plan_of(1, 100, 32, 8, 128, 4096).prefill == 1, "a 100-token chunk at group 4 runs the prefill pass");
  expect(plan_of(1, 1, 32, 8, 128, 131072, 66).num_sms == 66, "the plan records its SM count");
  // split_plan_of takes the 8-warp plan only where the codecs fit and the plan has one
  expect(tq::split_plan_of(a, true).warps == tq::kWideWarps && tq::split_plan_of(a, false).warps == tq::kWarps &&
             tq::split_plan_of(c, true).warps == tq::kWarps,
         "split_plan_of: 8 warps only where planned and fitting");
  for (int i = 0; i < 2; ++i) {
    const tq::SplitPlan sp = tq::split_plan_of(a, i == 0);
    expect(int64_t(sp.num_splits) * sp.split_tokens >= a.max_kv_len &&
               int64_t(sp.num_splits - 1) * sp.split_tokens < a.max_kv_len,
           "the splits cover max_kv_len, none of them empty");
  }
}

void test_workspace_bounds() {
  const int batches[] = {1, 2, 8, 32}, q_lens[] = {1, 4, 8, 9, 100}, lens[] = {0, 1, 300, 4096, 32768, 131072};
  const int heads[][3] = {{32, 8, 128}, {9, 3, 64}, {8, 8, 64}};
  for (const auto& h : heads)
    for (int batch : batches)
      for (int q : q_lens)
        for (int n : lens) {
          const tq_attention_plan_info p = plan_of(batch, q, h[0], h[1], h[2], n);
          for (int wide = 0; wide < 2; ++wide)
            for (int rows = 0; rows < 2; ++rows)
              if (need(p, wide, rows) > p.workspace_bytes) {
                std::printf("  batch %d, q_len %d, %d tokens, heads %d/%d: needs %zu > %zu\n", batch, q, n, h[0],
                            h[1], need(p, wide, rows), p.workspace_bytes);
                expect(false, "workspace_bytes bounds the call's need, either CTA shape, with or without new rows");
              }
          // the plugin sizes its workspace once for its profile's largest call
          const tq_attention_plan_info larger = plan_of(batch * 2, q + 3, h[0], h[1], h[2], n * 2 + 1);
          if (larger.workspace_bytes < p.workspace_bytes) expect(false, "a larger call's workspace serves a smaller");
        }
}

void test_bad_plans() {
  tq_attention_plan_info p{};
  expect(tq_attention_plan(1, 1, 8, 8, 128, 10, 0, nullptr) == TQ_ERR_NULL_POINTER, "plan NULL");
  expect(tq_attention_plan(1, 1, 8, 8, 96, 10, 0, &p) == TQ_ERR_UNSUPPORTED_HEAD_DIM &&
             std::strstr(tq_last_error(), "head_dim 96"), "head_dim 96");
  expect(tq_attention_plan(0, 1, 8, 8, 128, 10, 0, &p) == TQ_ERR_BAD_LENGTH, "batch 0");
  expect(tq_attention_plan(1, 0, 8, 8, 128, 10, 0, &p) == TQ_ERR_BAD_LENGTH, "q_len 0");
  expect(tq_attention_plan(1, TQ_MAX_Q_LEN + 1, 8, 8, 128, 10, 0, &p) == TQ_ERR_BAD_LENGTH, "q_len too long");
  expect(tq_attention_plan(1, 1, 8, 8, 128, -1, 0, &p) == TQ_ERR_BAD_LENGTH, "max_kv_len -1");
  expect(tq_attention_plan(1, 1, 12, 8, 128, 10, 0, &p) == TQ_ERR_INVALID_ARGUMENT, "12 query heads over 8");
  expect(tq_attention_plan(1, 1, 72, 8, 128, 10, 0, &p) == TQ_ERR_INVALID_ARGUMENT, "group 9");
  expect(tq_attention_plan(1, 1, 8, 0, 128, 10, 0, &p) == TQ_ERR_INVALID_ARGUMENT, "0 KV heads");
  expect(tq_attention_plan(1, 1, 8, 8, 128, 10, -1, &p) == TQ_ERR_INVALID_ARGUMENT, "num_sms -1");
  expect(tq_attention_plan(65536, 1, 8, 8, 128, 10, 0, &p) == TQ_ERR_BAD_LENGTH &&
             std::strstr(tq_last_error(), "grid limit"), "65,536 sequences");
  expect(tq_attention_plan(65535, 1, 8, 8, 128, 10, 0, &p) == TQ_OK, "65,535 sequences");
  expect(tq_attention_plan(1, 1, 8, 8, 128, 10, 0, &p) == TQ_OK && p.num_sms > 0, "num_sms 0: a device's or 132");
}

// A 3-bit head_dim 128 cache of 2 KV heads at fake (aligned, never read) addresses.
tq_paged_cache fake_cache() {
  tq_codec c{};
  c.head_dim = 128;
  c.num_groups = 1;
  c.group_dim[0] = 128;
  c.group_bits[0] = 3;
  const float levels[8] = {-0.19f, -0.118f, -0.067f, -0.022f, 0.022f, 0.067f, 0.118f, 0.19f};
  for (int i = 0; i < 8; ++i) c.codebook[0][i] = levels[i];
  tq_paged_cache cache{};
  cache.k_pool = reinterpret_cast<void*>(uintptr_t(1) << 20);
  cache.v_pool = reinterpret_cast<void*>(uintptr_t(1) << 21);
  cache.block_table = reinterpret_cast<const int32_t*>(uintptr_t(1) << 22);
  cache.max_blocks = 4;
  cache.tokens_per_block = 16;
  cache.num_kv_heads = 2;
  cache.num_chunks = 8;
  cache.key = cache.value = c;
  cache.k_chunk_bytes = cache.v_chunk_bytes = 2 * tq_page_bytes(&c, 16);
  return cache;
}

void test_call_checks() {
  const tq_paged_cache cache = fake_cache();
  const tq_attention_plan_info plan = plan_of(1, 2, 8, 2, 128, 40);
  tq_attention_params good{};
  good.cache = &cache;
  good.q = reinterpret_cast<const void*>(uintptr_t(1) << 23);
  good.out = reinterpret_cast<void*>(uintptr_t(1) << 24);
  good.kv_lens = reinterpret_cast<const int32_t*>(uintptr_t(1) << 25);
  good.k_new = reinterpret_cast<const void*>(uintptr_t(1) << 26);
  good.v_new = reinterpret_cast<const void*>(uintptr_t(1) << 27);
  good.new_stride = 2 * 128;
  good.max_kv_len = 40;
  good.batch = 1;
  good.q_len = 2;
  good.num_q_heads = 8;
  good.softmax_scale = 0.088f;
  good.dtype = TQ_FP16;
  good.append = 1;
  tq::CacheView view{};
  expect(tq::check_call(&plan, &good, &view) == TQ_OK, "a good call passes");
  expect(tq::check_call(nullptr, &good, &view) == TQ_ERR_NULL_POINTER, "no plan");
  expect(tq::check_call(&plan, nullptr, &view) == TQ_ERR_NULL_POINTER, "no params");
  struct Case {
    const char* what;
    tq_status status;
    const char* message;
    void (*edit)(tq_attention_params&);
  };
  static tq_paged_cache no_pool = cache;
  no_pool.k_pool = nullptr;
  const Case cases[] = {
      {"no cache", TQ_ERR_NULL_POINTER, "cache description is NULL", [](tq_attention_params& p) { p.cache = nullptr; }},
      {"a bad cache", TQ_ERR_NULL_POINTER, "k_pool", [](tq_attention_params& p) { p.cache = &no_pool; }},
      {"another batch", TQ_ERR_INVALID_ARGUMENT, "not the shape its plan", [](tq_attention_params& p) { p.batch = 2; }},
      {"another q_len", TQ_ERR_INVALID_ARGUMENT, "not the shape its plan", [](tq_attention_params& p) { p.q_len = 1; }},
      {"other heads", TQ_ERR_INVALID_ARGUMENT, "not the shape its plan", [](tq_attention_params& p) { p.num_q_heads = 4; }},
      {"another length", TQ_ERR_INVALID_ARGUMENT, "not the shape its plan", [](tq_attention_params& p) { p.max_kv_len = 39; }},
      {"k_new alone", TQ_ERR_NULL_POINTER, "given together", [](tq_attention_params& p) { p.v_new = nullptr; }},
      {"append 2", TQ_ERR_INVALID_ARGUMENT, "append 2 must be 0 or 1", [](tq_attention_params& p) { p.append = 2; }},
      {"append without rows", TQ_ERR_NULL_POINTER, "append needs k_new and v_new",
       [](tq_attention_params& p) { p.k_new = p.v_new = nullptr; }},
      {"misaligned rows", TQ_ERR_MISALIGNED, "4-byte aligned", [](tq_attention_params& p) { p.v_new = (const char*)p.v_new + 2; }},
      {"odd stride", TQ_ERR_MISALIGNED, "new_stride 257 must be even", [](tq_attention_params& p) { p.new_stride = 257; }},
      {"short stride", TQ_ERR_INVALID_ARGUMENT, "new_stride 128 is smaller", [](tq_attention_params& p) { p.new_stride = 128; }},
      {"no q", TQ_ERR_NULL_POINTER, "q, out and kv_lens", [](tq_attention_params& p) { p.q = nullptr; }},
      {"no out", TQ_ERR_NULL_POINTER, "q, out and kv_lens", [](tq_attention_params& p) { p.out = nullptr; }},
      {"no kv_lens", TQ_ERR_NULL_POINTER, "q, out and kv_lens", [](tq_attention_params& p) { p.kv_lens = nullptr; }},
      {"misaligned lse", TQ_ERR_MISALIGNED, "lse must be 4-byte aligned",
       [](tq_attention_params& p) { p.lse = reinterpret_cast<float*>((uintptr_t(1) << 28) + 2); }},
      {"dtype 2", TQ_ERR_INVALID_ARGUMENT, "dtype 2", [](tq_attention_params& p) { p.dtype = tq_dtype(2); }},
      {"scale 0", TQ_ERR_INVALID_ARGUMENT, "softmax_scale", [](tq_attention_params& p) { p.softmax_scale = 0.0f; }},
      {"scale NaN", TQ_ERR_INVALID_ARGUMENT, "softmax_scale", [](tq_attention_params& p) { p.softmax_scale = NAN; }},
  };
  for (const Case& c : cases) {
    tq_attention_params p = good;
    c.edit(p);
    const tq_status s = tq::check_call(&plan, &p, &view);
    if (s != c.status || !std::strstr(tq_last_error(), c.message)) {
      std::printf("  %s: status %d, want %d\n", c.what, int(s), int(c.status));
      expect(false, c.what);
    }
  }
  // beyond the block table (4 blocks of 16 tokens), with a plan of that length
  tq_attention_plan_info longer = plan_of(1, 2, 8, 2, 128, 65);
  tq_attention_params p = good;
  p.max_kv_len = 65;
  expect(tq::check_call(&longer, &p, &view) == TQ_ERR_BAD_LENGTH && std::strstr(tq_last_error(), "beyond the block table"),
         "max_kv_len beyond the block table");
  // a fused append is a decode step: at most TQ_MAX_DECODE_Q_LEN tokens
  const tq_attention_plan_info nine = plan_of(1, 9, 8, 2, 128, 40);
  p = good;
  p.q_len = 9;
  expect(tq::check_call(&nine, &p, &view) == TQ_ERR_BAD_LENGTH && std::strstr(tq_last_error(), "append takes q_len"),
         "append over 9 tokens");
  p.append = 0;
  expect(tq::check_call(&nine, &p, &view) == TQ_OK, "9 tokens without the append");

  // the workspace: the need of the pass the call runs, present and 16-byte aligned
  const tq::SplitPlan sp = tq::split_plan_of(plan, true);
  size_t slots = 0, chunk = 0;
  const size_t bytes = need(plan, true, true);
  void* ws = reinterpret_cast<void*>(uintptr_t(1) << 29);
  expect(tq::check_workspace(sp, good, 2, 128, ws, bytes, &slots, &chunk) == TQ_OK, "workspace of the need");
  expect(tq::check_workspace(sp, good, 2, 128, ws, bytes - 1, &slots, &chunk) == TQ_ERR_WORKSPACE &&
             std::strstr(tq_last_error(), "needs"), "a byte short");
  expect(tq::check_workspace(sp, good, 2, 128, nullptr, bytes, &slots, &chunk) == TQ_ERR_WORKSPACE &&
             std::strstr(tq_last_error(), "(NULL)"), "no workspace");
  expect(tq::check_workspace(sp, good, 2, 128, (char*)ws + 8, bytes, &slots, &chunk) == TQ_ERR_MISALIGNED,
         "a misaligned workspace");
  expect(bytes <= plan.workspace_bytes, "the need lies within the plan's workspace_bytes");
}

}  // namespace

int main() {
  test_plans();
  test_workspace_bounds();
  test_bad_plans();
  test_call_checks();
  std::printf(failures ? "attention_plan_test: FAILED\n" : "attention_plan_test: ok\n");
  return failures ? 1 : 0;
}
