// mma.cuh: the warp-level tensor-core product (mma.sync m16n8k16, fp16 in, fp32 accumulate), the
// 8x8 fragment transpose, ldmatrix and cp.async, as the attention kernels use them. Fragment
// layouts: PTX ISA, "Matrix Fragments for mma.m16n8k16": lane = 4 * groupID + tig; A a0 (row
// groupID, cols 2tig..+1), a1 (row +8), a2 (cols +8), a3 (both); B b0 (k 2tig..+1, n groupID),
// b1 (k +8); C c0,c1 (row groupID, cols 2tig..+1), c2,c3 (row +8). The 8-bit form (mma.sync
// m16n8k32, s8 in, s32 accumulate) holds 4 consecutive k per register: A a0 (row groupID, cols
// 4tig..+3), a1 (row +8), a2 (cols +16), a3 (both); B b0 (k 4tig..+3), b1 (k +16); C as above.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace tq {

__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline void mma_16832_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The transpose of an 8x8 fp16 matrix held like an mma fragment (lane l: row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 as one fp16 pair): a C fragment's rows become a B fragment's columns.
__device__ inline uint32_t transpose_8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Four 8x8 fp16 matrices from shared memory as mma fragments: lanes 8i .. 8i+7 give the 16-byte
// rows of matrix i, r[i] receives it.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ inline uint32_t pack_half2(__half lo, __half hi) {
  return uint32_t(__half_as_ushort(lo)) | (uint32_t(__half_as_ushort(hi)) << 16);
}
__device__ inline uint32_t pack_float2(float lo, float hi) {
  return pack_half2(__float2half_rn(lo), __float2half_rn(hi));
}

// v as fp16 hi + lo, lo the rounding remainder: about 22 significant bits in two mma.
struct HalfHiLo {
  __half hi, lo;
};
__device__ inline HalfHiLo split_half(float v) {
  const __half hi = __float2half_rn(v);
  return {hi, __float2half_rn(v - __half2float(hi))};
}
// (a, b) as such fp16 pairs hi and lo.
__device__ inline void split_half2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const HalfHiLo x = split_half(a), y = split_half(b);
  hi = pack_half2(x.hi, y.hi);
  lo = pack_half2(x.lo, y.lo);
}

__device__ inline void cp_async_16(void* smem, const void* gmem) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

}  // namespace tq
