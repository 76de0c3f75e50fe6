// wgmma.cuh: Hopper's warpgroup tensor-core product (wgmma.mma_async, sm_90a) as the prefill pass
// uses it: fp16 operands, fp32 accumulators. B, and A for the "ss" form, come from shared memory
// through matrix descriptors over the blocked layout below; A of the "rs" form comes from registers
// as the mma.m16n8k16 A fragment of the warp's 16 rows (mma.cuh). Accumulators: warp w of the
// warpgroup holds rows 16 (w % 4) + groupID and + 8, n8 chunk j in d[4j .. 4j + 3] laid out as an
// mma.m16n8 C fragment. The product runs asynchronously: wgmma_fence before the first product of a
// batch (and after other code wrote its registers), wgmma_commit, then wgmma_wait before the
// accumulators are read, and fence_regs on them so that the compiler moves no read above the wait.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace tq {

// The element index of (r, c) in an fp16 matrix of COLS columns stored as 8 x 8 core matrices of
// 128 contiguous bytes (PTX ISA, wgmma's canonical layout without swizzle): the core matrices of an
// 8-row block one after the other, the blocks COLS * 16 bytes apart.
template <int COLS>
__host__ __device__ constexpr int blocked(int r, int c) {
  return (r >> 3) * (8 * COLS) + (c >> 3) * 64 + (r & 7) * 8 + (c & 7);
}

__device__ inline uint64_t wgmma_desc(const __half* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return uint64_t((a >> 4) & 0x3fff) | uint64_t((lbo >> 4) & 0x3fff) << 16 | uint64_t((sbo >> 4) & 0x3fff) << 32;
}
// A blocked matrix (from element p) read with the product's reduction along its columns ("K-major":
// the query rows, or the key rows of Q K^T): the two 8-column halves of a k16 step 128 bytes apart,
// 8-row blocks 16 COLS apart.
template <int COLS>
__device__ inline uint64_t k_major_desc(const __half* p) { return wgmma_desc(p, 128, 16 * COLS); }
// ... read with the reduction along its rows ("MN-major", the value rows of P V): 8-row blocks
// (the reduction) 16 COLS bytes apart, 8-column blocks (the product's N) 128.
template <int COLS>
__device__ inline uint64_t mn_major_desc(const __half* p) { return wgmma_desc(p, 16 * COLS, 128); }

// The descriptor of the matrix that starts `elements` fp16 further (a multiple of 8): its start
// address moves, in 16-byte units.
__device__ inline uint64_t desc_at(uint64_t desc, int elements) { return desc + uint64_t(elements >> 3); }

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ inline void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ inline void fence_regs(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ inline void fence_regs(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
template <typename T, int N>
__device__ inline void fence_regs(T (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_regs(a[i]);
}
// Shared memory written by ordinary stores that a product reads next: each writer fences, then a
// barrier.
__device__ inline void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// D (64 x 32) += A (64 x 16) B (16 x 32), both from shared memory, K-major; D is zeroed first
// unless `accumulate`.
__device__ inline void wgmma_ss_n32(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(int(accumulate)));
}

// D (64 x N) += A (64 x 16, registers) B (16 x N, shared memory, MN-major).
template <int N>
__device__ inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b);

template <>
__device__ inline void wgmma_rs<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

template <>
__device__ inline void wgmma_rs<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

template <>
__device__ inline void wgmma_rs<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

}  // namespace tq
