// decode_step: the kernel library embedded in a C++ program, through its C ABI only
// (plugin_cpp/include/tq/tq_kernels.h): a 3-bit paged cache for one sequence at Llama-3-8B's
// attention shape, filled with random keys and values, then one decode step (the new token's key
// and value appended inside the attention launch). It checks the output against attention over
// the cache read back with tq_dequantize and prints the cache's bytes against fp16.
//
//   build/examples/cpp/tq_decode_step [context]      (default 4096 tokens; needs a Hopper GPU)
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <tq/tq_kernels.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

constexpr int kHeadDim = 128, kKvHeads = 8, kQHeads = 32, kTokensPerBlock = 64;

// Exits with the library's message on an error status, or CUDA's on a failed runtime call.
void check(tq_status s, const char* what) {
  if (s != TQ_OK) {
    std::fprintf(stderr, "%s failed: %s\n", what, tq_last_error());
    std::exit(1);
  }
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// A device copy of a host vector.
template <typename V>
typename V::value_type* to_device(const V& host) {
  typename V::value_type* dev = nullptr;
  check(cudaMalloc(&dev, host.size() * sizeof(host[0])), "cudaMalloc");
  check(cudaMemcpy(dev, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice), "cudaMemcpy");
  return dev;
}

// An uncalibrated 3-bit codec (width_x2 6: one group, built by tq_codec_init). Its codebook: the
// 8-level Lloyd-Max quantizer of a standard normal (Max, 1960), in units of a random unit vector's
// coordinate (standard deviation 1/sqrt(head_dim)); the library puts it on the format's 8-bit grid.
// The Python package computes the exact codebook for the coordinate's Beta distribution and
// per-layer tables (tq-build).
tq_codec three_bit_codec(uint32_t seed) {
  const float half[4] = {0.2451f, 0.7560f, 1.3440f, 2.1520f};
  float levels[8];
  for (int i = 0; i < 4; ++i) {
    levels[4 + i] = half[i] / std::sqrt(float(kHeadDim));
    levels[3 - i] = -levels[4 + i];
  }
  tq_codec c;
  if (tq_codec_init(&c, kHeadDim, 6, seed, levels, 8) != TQ_OK) {
    std::fprintf(stderr, "tq_codec_init failed: %s\n", tq_last_error());
    std::exit(1);
  }
  return c;
}

std::vector<__half> random_halves(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<__half> x(n);
  for (auto& e : x) e = __float2half(normal(rng));
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  const int context = argc > 1 ? std::atoi(argv[1]) : 4096;  // cached tokens before the step
  if (context < 1 || context > (1 << 20)) {
    std::fprintf(stderr, "context must be 1 to %d tokens, got %s\n", 1 << 20, argv[1]);
    return 2;
  }
  const int kv_len = context + 1;  // with the step's token
  const int blocks = (kv_len + kTokensPerBlock - 1) / kTokensPerBlock;
  std::mt19937 rng(2504);

  // One layer's cache: chunk c of each pool holds one block of tokens for every KV head.
  tq_paged_cache cache{};
  cache.key = three_bit_codec(1234);
  cache.value = three_bit_codec(99);
  const int64_t page = tq_page_bytes(&cache.key, kTokensPerBlock);
  if (page < 0) check(TQ_ERR_INVALID_ARGUMENT, "tq_page_bytes");
  const int64_t chunk_bytes = (kKvHeads * page + 15) / 16 * 16;
  cache.k_chunk_bytes = cache.v_chunk_bytes = chunk_bytes;
  check(cudaMalloc(&cache.k_pool, chunk_bytes * blocks), "cudaMalloc");
  check(cudaMalloc(&cache.v_pool, chunk_bytes * blocks), "cudaMalloc");
  std::vector<int32_t> table(2 * blocks);  // [batch 1][K, V][blocks]: block i in chunk i of each
  for (int i = 0; i < blocks; ++i) table[i] = table[blocks + i] = i;
  cache.block_table = to_device(table);
  cache.max_blocks = blocks;
  cache.tokens_per_block = kTokensPerBlock;
  cache.num_kv_heads = kKvHeads;
  cache.num_chunks = blocks;

  // The history: `context` random keys and values, quantized and packed in one call.
  const size_t row = size_t(kKvHeads) * kHeadDim;
  const std::vector<__half> k_hist = random_halves(context * row, rng), v_hist = random_halves(context * row, rng);
  std::vector<int32_t> seq(context, 0), pos(context);
  for (int i = 0; i < context; ++i) pos[i] = i;
  __half *k_dev = to_device(k_hist), *v_dev = to_device(v_hist);
  int32_t *seq_dev = to_device(seq), *pos_dev = to_device(pos);
  check(tq_quantize_append(&cache, k_dev, v_dev, int64_t(row), TQ_FP16, seq_dev, pos_dev, context, 1, nullptr),
        "tq_quantize_append");

  // The decode step: one new token's query, key and value; the key and value are appended at
  // position `context` inside the attention launch and attended to exactly.
  const std::vector<__half> q = random_halves(size_t(kQHeads) * kHeadDim, rng);
  const std::vector<__half> k_new = random_halves(row, rng), v_new = random_halves(row, rng);
  __half *q_dev = to_device(q), *k_new_dev = to_device(k_new), *v_new_dev = to_device(v_new);
  __half* out_dev = nullptr;
  check(cudaMalloc(&out_dev, q.size() * sizeof(__half)), "cudaMalloc");
  int32_t* kv_len_dev = to_device(std::vector<int32_t>{kv_len});
  // A plan for the step's shape (one per step: every layer's call reuses it), its workspace, then
  // the call with the append fused in.
  tq_attention_plan_info plan{};
  check(tq_attention_plan(1, 1, kQHeads, kKvHeads, kHeadDim, kv_len, 0, &plan), "tq_attention_plan");
  void* workspace = nullptr;
  check(cudaMalloc(&workspace, plan.workspace_bytes), "cudaMalloc");
  tq_attention_params params{};
  params.cache = &cache;
  params.q = q_dev;
  params.out = out_dev;
  params.k_new = k_new_dev;
  params.v_new = v_new_dev;
  params.new_stride = int64_t(row);
  params.append = 1;
  params.kv_lens = kv_len_dev;
  params.max_kv_len = kv_len;
  params.batch = 1;
  params.q_len = 1;
  params.num_q_heads = kQHeads;
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  params.softmax_scale = scale;
  params.dtype = TQ_FP16;
  check(tq_attention_run(&plan, &params, workspace, plan.workspace_bytes, nullptr), "tq_attention_run");

  // The check: fp32 attention over the history as the library decodes it (tq_dequantize) and the
  // new token's exact key and value.
  __half *k_deq_dev = nullptr, *v_deq_dev = nullptr;
  check(cudaMalloc(&k_deq_dev, context * row * sizeof(__half)), "cudaMalloc");
  check(cudaMalloc(&v_deq_dev, context * row * sizeof(__half)), "cudaMalloc");
  check(tq_dequantize(&cache, 0, 0, context, k_deq_dev, v_deq_dev, TQ_FP16, nullptr), "tq_dequantize");
  std::vector<__half> out(q.size()), k_deq(context * row), v_deq(context * row);
  check(cudaMemcpy(out.data(), out_dev, out.size() * sizeof(__half), cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(k_deq.data(), k_deq_dev, k_deq.size() * sizeof(__half), cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(v_deq.data(), v_deq_dev, v_deq.size() * sizeof(__half), cudaMemcpyDeviceToHost), "cudaMemcpy");
  auto key_at = [&](int t, int h, int c) {
    return __half2float(t < context ? k_deq[t * row + h * kHeadDim + c] : k_new[h * kHeadDim + c]);
  };
  auto value_at = [&](int t, int h, int c) {
    return __half2float(t < context ? v_deq[t * row + h * kHeadDim + c] : v_new[h * kHeadDim + c]);
  };
  float worst = 0.0f;
  std::vector<float> logit(kv_len);
  for (int hq = 0; hq < kQHeads; ++hq) {
    const int h = hq / (kQHeads / kKvHeads);
    for (int t = 0; t < kv_len; ++t) {
      float dot = 0.0f;
      for (int c = 0; c < kHeadDim; ++c) dot += __half2float(q[hq * kHeadDim + c]) * key_at(t, h, c);
      logit[t] = dot * scale;
    }
    const float top = *std::max_element(logit.begin(), logit.end());
    float sum = 0.0f;
    for (auto& l : logit) sum += (l = std::exp(l - top));
    for (int c = 0; c < kHeadDim; ++c) {
      float want = 0.0f;
      for (int t = 0; t < kv_len; ++t) want += logit[t] * value_at(t, h, c);
      worst = std::max(worst, std::fabs(want / sum - __half2float(out[hq * kHeadDim + c])));
    }
  }
  std::printf("context %d, %d query heads over %d KV heads, head_dim %d, 3-bit keys and values\n",
              context, kQHeads, kKvHeads, kHeadDim);
  std::printf("packed cache: %lld bytes per token and KV head for K and V each (fp16: %d)\n",
              (long long)(page / kTokensPerBlock), 2 * kHeadDim);
  std::printf("decode step against attention over the dequantized cache: max abs error %.2e\n", worst);
  // The dequantized copy is fp16, so the comparison carries its rounding on top of the kernels'
  // 2e-3 bound (tests/gpu pin the bound against the Python reference).
  return worst < 5e-3f ? 0 : 1;
}
