// fixed_cost_floor.cu: the least a one-launch decode call can cost before its tile loop
// (docs/DECODE_BUDGET.md, "Measurements that decide it", step 1). Timing only: the values are
// meaningless. Each CTA stands for one (row, KV head, split) of the split pass at Llama-3-8B's
// shape: it reads in ONE round what the split pass's prologue reads in three (the sequence length,
// the codec's permutation, mean, scale and rotary arrays, the block-table window and the query
// rows of its GQA group), writes a partial output and log-sum-exp as the split pass's epilogue does,
// and the last CTA of each (row, KV head) to finish folds the splits' partials, so the merge pass
// needs no second launch. No query rotation (done once per step for all layers in that design)
// and no tile loop. Built by build_scripts/fixed_cost_floor.py with nvcc, loaded with ctypes.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kHeadDim = 128;
constexpr int kGroup = 4;          // query heads per KV head
constexpr int kThreads = 256;      // 8 warps, as the split pass
constexpr int kRotaryPairs = 16;   // the calibrated tables' rotary mean
constexpr int kWindow = 32;        // block-table entries a CTA reads before its first tile
constexpr int kMaxSplits = 32;     // the plans' splits at 1 x 131,072

struct FloorArgs {
  const int32_t* kv_lens;      // [batch]
  const int32_t* block_table;  // [batch][2][max_blocks]
  const int32_t* perm;         // [kv_heads][head_dim]
  const float* mean;           // [kv_heads][head_dim]
  const float* scale;          // [kv_heads][head_dim]
  const int32_t* rot_channel;  // [kv_heads][pairs]
  const float* rot_freq;       // [kv_heads][pairs]
  const float* rot_mean;       // [kv_heads][pairs][2]
  const __half* q;             // [batch][kv_heads * group][head_dim]
  float* partial_o;            // [batch][kv_heads][splits][group][head_dim]
  float* partial_lse;          // [batch][kv_heads][splits][group]
  int32_t* arrivals;           // [batch][kv_heads], zero between calls (the last CTA resets it)
  __half* out;                 // [batch][kv_heads * group][head_dim]
  int32_t kv_heads, splits, max_blocks;
};

__global__ void __launch_bounds__(kThreads) floor_kernel(FloorArgs a) {
  const int split = blockIdx.x, head = blockIdx.y, row = blockIdx.z, t = threadIdx.x;
  __shared__ float s_q[kGroup][kHeadDim];
  __shared__ float s_tab[3][kHeadDim];
  __shared__ float s_rot[kRotaryPairs * 4];
  __shared__ int32_t s_window[kWindow];
  __shared__ bool s_last;

  // One round: every load below is independent of the others.
  const int32_t len = __ldg(a.kv_lens + row);
  const int hd = head * kHeadDim;
  for (int i = t; i < kGroup * kHeadDim; i += kThreads)
    s_q[i / kHeadDim][i % kHeadDim] =
        __half2float(a.q[(size_t(row) * a.kv_heads * kGroup + head * kGroup) * kHeadDim + i]);
  if (t < kHeadDim) {
    s_tab[0][t] = float(__ldg(a.perm + hd + t));
    s_tab[1][t] = __ldg(a.mean + hd + t);
    s_tab[2][t] = __ldg(a.scale + hd + t);
  }
  if (t < kRotaryPairs) {
    const int r = head * kRotaryPairs + t;
    s_rot[t] = float(__ldg(a.rot_channel + r));
    s_rot[kRotaryPairs + t] = __ldg(a.rot_freq + r);
    s_rot[2 * kRotaryPairs + 2 * t] = __ldg(a.rot_mean + 2 * r);
    s_rot[2 * kRotaryPairs + 2 * t + 1] = __ldg(a.rot_mean + 2 * r + 1);
  }
  if (t < kWindow) {
    const int blk = min(split * kWindow + t, a.max_blocks - 1);
    s_window[t] = __ldg(a.block_table + (size_t(row) * 2) * a.max_blocks + blk);
  }
  __syncthreads();

  // The epilogue: a partial output per query row of the group (depending on what was read, so
  // that no load is dead) and its log-sum-exp.
  const size_t slot = (size_t(row) * a.kv_heads + head) * a.splits + split;
  for (int i = t; i < kGroup * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim, c = i % kHeadDim;
    a.partial_o[slot * kGroup * kHeadDim + i] =
        s_q[g][c] * s_tab[2][c] + s_tab[1][c] + s_tab[0][c] * 1e-9f +
        s_rot[c % (4 * kRotaryPairs)] * 1e-9f + float(s_window[c % kWindow] + len) * 1e-12f;
  }
  if (t < kGroup) a.partial_lse[slot * kGroup + t] = float(split) * 1e-3f + s_q[t][0];

  // One split: the CTA's output is the row's (no fold, no arrival count).
  const size_t out_at = (size_t(row) * a.kv_heads * kGroup + head * kGroup) * kHeadDim;
  if (a.splits == 1) {
    for (int i = t; i < kGroup * kHeadDim; i += kThreads)
      a.out[out_at + i] = __float2half(s_q[i / kHeadDim][i % kHeadDim] * s_tab[2][i % kHeadDim]);
    return;
  }
  // The last CTA of the (row, KV head) folds the splits: the log-sum-exps in one round into shared
  // memory, then every thread's partials in one round of independent loads.
  __threadfence();
  __syncthreads();
  int32_t* arrivals = a.arrivals + size_t(row) * a.kv_heads + head;
  if (t == 0) s_last = atomicAdd(arrivals, 1) == a.splits - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  __shared__ float s_w[kMaxSplits][kGroup];
  const size_t first = (size_t(row) * a.kv_heads + head) * a.splits;
  if (t < a.splits * kGroup) s_w[t / kGroup][t % kGroup] = __ldcg(a.partial_lse + first * kGroup + t);
  __syncthreads();
  if (t < kGroup) {  // weights of the splits: exp(lse - max) / sum
    float m = -INFINITY, den = 0.f;
    for (int s = 0; s < a.splits; ++s) m = fmaxf(m, s_w[s][t]);
    for (int s = 0; s < a.splits; ++s) den += (s_w[s][t] = __expf(s_w[s][t] - m));
    for (int s = 0; s < a.splits; ++s) s_w[s][t] /= den;
  }
  __syncthreads();
  for (int i = t; i < kGroup * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim;
    float o[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      o[s] = s < a.splits ? __ldcg(a.partial_o + (first + s) * kGroup * kHeadDim + i) : 0.f;
    float acc = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) acc += s < a.splits ? s_w[s][g] * o[s] : 0.f;
    a.out[out_at + i] = __float2half(acc);
  }
  if (t == 0) *arrivals = 0;
}

__global__ void empty_kernel() {}

}  // namespace

// The floor call: grid (splits, kv_heads, batch) of 8-warp CTAs. Returns a cudaError_t.
extern "C" int tq_floor_launch(const int32_t* kv_lens, const int32_t* block_table, const int32_t* perm,
                               const float* mean, const float* scale, const int32_t* rot_channel,
                               const float* rot_freq, const float* rot_mean, const void* q, float* partial_o,
                               float* partial_lse, int32_t* arrivals, void* out, int32_t batch, int32_t kv_heads,
                               int32_t splits, int32_t max_blocks, void* stream) {
  if (splits < 1 || splits > kMaxSplits) return int(cudaErrorInvalidValue);
  FloorArgs a{kv_lens, block_table, perm, mean, scale, rot_channel, rot_freq, rot_mean,
              static_cast<const __half*>(q), partial_o, partial_lse, arrivals, static_cast<__half*>(out),
              kv_heads, splits, max_blocks};
  floor_kernel<<<dim3(splits, kv_heads, batch), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return int(cudaGetLastError());
}

// One CTA that does nothing: the launch and the timer's own cost.
extern "C" int tq_floor_empty(void* stream) {
  empty_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>();
  return int(cudaGetLastError());
}
