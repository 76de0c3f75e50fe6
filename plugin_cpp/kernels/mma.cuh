// mma.cuh: the warp-level tensor-core product (mma.sync m16n8k16, fp16 or bf16 in, fp32
// accumulate), the 8x8 fragment transpose, ldmatrix and cp.async, as the attention kernels use
// them. Fragment layouts: PTX ISA, "Matrix Fragments for mma.m16n8k16": lane = 4 * groupID + tig;
// A a0 (row groupID, cols 2tig..+1), a1 (row +8), a2 (cols +8), a3 (both); B b0 (k 2tig..+1,
// n groupID), b1 (k +8); C c0,c1 (row groupID, cols 2tig..+1), c2,c3 (row +8). The 8-bit form
// (m16n8k32, s8 in, s32 accumulate) holds 4 consecutive k per register: A a0 (row groupID, cols
// 4tig..+3), a1 (row +8), a2 (cols +16), a3 (both); B b0 (k 4tig..+3), b1 (k +16); C as above.
#pragma once

#include <cstdint>
#include <type_traits>

#include "device_common.cuh"

namespace tq {

// T: the operands' type, __half or __nv_bfloat16.
template <typename T = __half>
__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "mma_16816 takes fp16 or bf16 operands");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ inline void mma_16832_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The transpose of an 8x8 16-bit matrix held like an mma fragment (lane l: row l / 4, columns
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
// The same four matrices transposed (a K-major tile as the B fragment of its columns).
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// A 16-bit pair as one operand register, lo in the low half.
template <typename T>
__device__ inline uint32_t pack_pair(T lo, T hi) {
  return uint32_t(bits_of(lo)) | (uint32_t(bits_of(hi)) << 16);
}
template <typename T = __half>
__device__ inline uint32_t pack_float2(float lo, float hi) {
  return pack_pair(from_float<T>(lo), from_float<T>(hi));
}

// v as T hi + lo, lo the rounding remainder: about twice T's significant bits in two mma.
template <typename T>
struct HiLo {
  T hi, lo;
};
template <typename T = __half>
__device__ inline HiLo<T> split_hi_lo(float v) {
  const T hi = from_float<T>(v);
  return {hi, from_float<T>(v - to_float(hi))};
}
// (a, b) as such pairs hi and lo.
template <typename T = __half>
__device__ inline void split_float2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const HiLo<T> x = split_hi_lo<T>(a), y = split_hi_lo<T>(b);
  hi = pack_pair(x.hi, y.hi);
  lo = pack_pair(x.lo, y.lo);
}

__device__ inline void cp_async_16(void* smem, const void* gmem) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
// A BYTES-byte cp.async (16 or 4) that zero-fills where !valid (src is then not read).
template <int BYTES>
__device__ inline void cp_async_fill(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? BYTES : 0;
  if constexpr (BYTES == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

}  // namespace tq
