// tq_pipe_rates: issue rates of the instructions a code look-up could be built from, on the GPU it
// runs on (docs/BENCHMARKS.md#why-look-ups-on-the-integer-pipe). The decode loop is bound by the
// integer pipe's byte permutes; this measures whether an fp8 route would move that work elsewhere
// (the e4m3 -> fp16x2 conversion, alone and mixed with permutes, and mma.sync with e4m3 operands
// against f16 ones), and whether shifts could leave that pipe as IMAD.HI. Alternating
// two instructions tells whether they share a pipe. Every thread runs kChains independent dependency
// chains, so the figures are throughput, not latency. Run: build/plugin_cpp/kernels/tq_pipe_rates
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

constexpr int kChains = 8;
constexpr int kIters = 4096;
constexpr int kBlocksPerSm = 8, kThreads = 256;

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Two e4m3 bytes (the low half of x) to an fp16 pair.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
  uint32_t r;
  asm volatile("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(r) : "r"(x));
  return r;
}

__device__ __forceinline__ uint32_t lop3_xor(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm volatile("lop3.b32 %0, %1, %2, %3, 0x96;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// A right shift as the high word of a product: IMAD.HI on the FMA pipe instead of SHF. `m` must be
// opaque to ptxas (not a constant), or it folds the product back into a shift.
__device__ __forceinline__ uint32_t mul_hi(uint32_t a, uint32_t m) {
  uint32_t r;
  asm volatile("mul.hi.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(m));
  return r;
}

// A funnel shift (SHF, as the decode's shifts), of (b:a) by 13: a plain shift chain would fold to 0.
__device__ __forceinline__ uint32_t shf13(uint32_t a, uint32_t b) {
  uint32_t r;
  asm volatile("shf.r.clamp.b32 %0, %1, %2, 13;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

enum class Op { kPrmt, kCvt, kLop3, kShf, kMulHi };

// One step of a chain of OP.
template <Op OP>
__device__ __forceinline__ uint32_t step(uint32_t x, uint32_t t0, uint32_t t1, uint32_t m) {
  if constexpr (OP == Op::kPrmt) return prmt(t0, t1, x);
  else if constexpr (OP == Op::kCvt) return e4m3x2_to_f16x2(x);
  else if constexpr (OP == Op::kLop3) return lop3_xor(x, t0, t1);
  else if constexpr (OP == Op::kShf) return shf13(x, t0);
  else return mul_hi(x, m);
}

// Even chains run EVEN, odd ones ODD: with two instructions, whether they share a pipe.
template <Op EVEN, Op ODD = EVEN>
__global__ void scalar_ops(uint32_t* sink, uint32_t seed) {
  uint32_t x[kChains];
  for (int i = 0; i < kChains; ++i) x[i] = seed * (threadIdx.x + i + 1);
  const uint32_t t0 = seed ^ 0x1234u, t1 = seed ^ 0x9876u, m = seed << 14;  // a run-time multiplier
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int i = 0; i < kChains; ++i) x[i] = (i & 1) ? step<ODD>(x[i], t0, t1, m) : step<EVEN>(x[i], t0, t1, m);
  }
  uint32_t s = 0;
  for (int i = 0; i < kChains; ++i) s ^= x[i];
  if (s == 0x12345678u) sink[0] = s;  // keeps the chains alive
}

// 4 independent accumulator chains of m16n8k32 e4m3 or m16n8k16 f16 mma.sync per warp.
template <bool kE4m3>
__global__ void mma_ops(uint32_t* sink, uint32_t seed) {
  const uint32_t a0 = seed, a1 = seed * 3, a2 = seed * 5, a3 = seed * 7, b0 = seed * 11, b1 = seed * 13;
  float c[4][4] = {};
  for (int it = 0; it < kIters / 2; ++it) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (kE4m3)
        asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
      else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
  float s = 0.0f;
  for (int j = 0; j < 4; ++j)
    for (int e = 0; e < 4; ++e) s += c[j][e];
  if (s == 1.2345f) sink[0] = 1;
}

struct Device {
  int sms = 0;
  double clock_hz = 0.0;  // under load: the SM clock the launch ran at is not queryable, the boost clock is
};

// Milliseconds of `reps` launches after one warm-up.
template <typename K>
float time_launches(K kernel, uint32_t* sink, const Device& dev, int reps) {
  const dim3 grid(dev.sms * kBlocksPerSm), block(kThreads);
  kernel<<<grid, block>>>(sink, 3u);
  cudaDeviceSynchronize();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int r = 0; r < reps; ++r) kernel<<<grid, block>>>(sink, 3u);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / reps;
}

template <typename K>
void report(const char* name, K kernel, uint32_t* sink, const Device& dev, double per_thread_ops, const char* unit) {
  const float ms = time_launches(kernel, sink, dev, 5);
  const double threads = double(dev.sms) * kBlocksPerSm * kThreads;
  const double rate = threads * per_thread_ops / (ms * 1e-3) / dev.sms / dev.clock_hz;
  std::printf("%-34s %8.3f ms  %7.2f %s per SM per clock\n", name, ms, rate, unit);
}

}  // namespace

int main() {
  Device dev;
  int khz = 0;
  if (cudaDeviceGetAttribute(&dev.sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) != cudaSuccess) {
    std::fprintf(stderr, "tq_pipe_rates: no CUDA device\n");
    return 1;
  }
  dev.clock_hz = khz * 1e3;
  uint32_t* sink = nullptr;
  cudaMalloc(&sink, sizeof(uint32_t));
  std::printf("%d SMs, rates at the %.0f MHz boost clock\n", dev.sms, khz / 1e3);
  const double scalar = double(kIters) * kChains;
  report("prmt", scalar_ops<Op::kPrmt>, sink, dev, scalar, "thread ops");
  report("lop3", scalar_ops<Op::kLop3>, sink, dev, scalar, "thread ops");
  report("cvt.rn.f16x2.e4m3x2", scalar_ops<Op::kCvt>, sink, dev, scalar, "thread ops");
  report("prmt and cvt, alternating", scalar_ops<Op::kPrmt, Op::kCvt>, sink, dev, scalar, "thread ops");
  report("shf.r.clamp.b32 (SHF)", scalar_ops<Op::kShf>, sink, dev, scalar, "thread ops");
  report("mul.hi.u32 (IMAD.HI)", scalar_ops<Op::kMulHi>, sink, dev, scalar, "thread ops");
  report("prmt and lop3, alternating", scalar_ops<Op::kPrmt, Op::kLop3>, sink, dev, scalar, "thread ops");
  report("prmt and mul.hi, alternating", scalar_ops<Op::kPrmt, Op::kMulHi>, sink, dev, scalar, "thread ops");
  const double warp_mmas = double(kIters / 2) * 4 / 32;  // per thread: a warp's mma counted once
  report("mma.sync m16n8k16 f16", mma_ops<false>, sink, dev, warp_mmas, "warp mma");
  report("mma.sync m16n8k32 e4m3", mma_ops<true>, sink, dev, warp_mmas, "warp mma");
  const cudaError_t err = cudaDeviceSynchronize();
  cudaFree(sink);
  if (err != cudaSuccess) {
    std::fprintf(stderr, "tq_pipe_rates: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
