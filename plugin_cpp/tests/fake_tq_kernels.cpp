// fake_tq_kernels.cpp: a host-only test double of the kernel library's device entry points, so the
// plugin's build-time methods are tested on a machine without a GPU or a built kernel library.
// The library's host-only part (tq_codec_init, tq_last_error: target tq_codec_host) is linked as
// it is. Every device entry point fails; the plan's workspace size is a fixed formula the test
// checks for.
#include "tq/tq_kernels.h"
#include "tq/tq_rope.h"

extern "C" {

tq_status tq_attention_plan(int32_t batch, int32_t q_len, int32_t num_q_heads, int32_t num_kv_heads,
                            int32_t head_dim, int32_t max_kv_len, int32_t num_sms, tq_attention_plan_info* plan) {
  *plan = tq_attention_plan_info{batch, q_len, num_q_heads, num_kv_heads, head_dim, max_kv_len, num_sms};
  plan->workspace_bytes =
      size_t(batch) * q_len * num_q_heads * 8 + size_t(num_kv_heads) * head_dim + size_t(max_kv_len);
  return TQ_OK;
}

tq_status tq_quantize_append(const tq_paged_cache*, const void*, const void*, int64_t, tq_dtype, const int32_t*,
                             const int32_t*, int32_t, int32_t, tq_stream) {
  return TQ_ERR_CUDA;
}

tq_status tq_attention_run(const tq_attention_plan_info*, const tq_attention_params*, void*, size_t, tq_stream) {
  return TQ_ERR_CUDA;
}

tq_status tq_rope_split_qkv(const void*, int64_t, tq_dtype, const int32_t*, int32_t, int32_t, int32_t, int32_t,
                            const tq_rope_params*, void*, void*, tq_stream) {
  return TQ_ERR_CUDA;
}

}  // extern "C"
