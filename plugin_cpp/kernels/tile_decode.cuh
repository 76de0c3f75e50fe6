// tile_decode.cuh: fp16 centroids of a run of codes of one token, read from a staged tile (16 or
// 32 tokens in shared memory, laid out like any page: FORMAT.md section 5 with T = 16 or 32).
// A thread decodes CNT consecutive coordinates of one group, starting at group coordinate
// part * CNT: it loads the run's raw plane words (CodeRun::load), turns them into look-up
// selectors (slot_words), then into fp16 centroid pairs with register look-up tables
// (decode_pairs: pairs of one token; decode_token_pairs: pairs of two tokens): one byte permute
// per code plus, per 16 codes, a few masks and shifts (the format's high-plane order makes the
// 3-bit selectors with masks, FORMAT.md section 3).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include <type_traits>

#include "layout.h"

namespace tq {

// The NW 32-bit words holding the bits that start at bit `first_bit` of a plane row, shifted so
// that the first wanted bit is bit 0 of word 0. Runs of 2 or 4 words are 8 or 16-byte aligned by
// the format (whole rows of whole words, T a multiple of 16).
template <int NW>
__host__ __device__ inline void load_plane_bits(const uint8_t* row, int first_bit, uint32_t (&w)[NW]) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(row) + (first_bit >> 5);
  if constexpr (NW == 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(words);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  } else if constexpr (NW == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(words);
    w[0] = v.x; w[1] = v.y;
  } else {
    w[0] = words[0] >> (first_bit & 31);  // a run of at most one word
  }
}

template <int BITS, int CNT>
struct CodeRun {
  static constexpr int kLowBits = BITS == 3 ? 2 : BITS;  // 3-bit codes: 2-bit plane + 1-bit plane
  static constexpr int kLowWords = (CNT * kLowBits + 31) / 32;
  uint32_t lo[kLowWords];
  // 3-bit codes (CNT <= 32): the run's high-plane word, shifted so that run coordinate i sits at
  // hi_plane_bit(i), where coordinate i of a word sits (a run starts at a multiple of CNT).
  uint32_t hi[1];

  __host__ __device__ inline void load(const uint8_t* tile, const GroupLayout& g, int row, int part) {
    load_plane_bits<kLowWords>(tile + g.lo_off + row * g.lo_row_bytes, part * CNT * kLowBits, lo);
    if constexpr (BITS == 3) {
      const int first = part * CNT;
      const uint32_t w = reinterpret_cast<const uint32_t*>(tile + g.hi_off + row * g.hi_row_bytes)[first >> 5];
      hi[0] = (w << (2 * ((first >> 4) & 1))) >> (2 * (first & 15));
    }
  }
  // Code of run coordinate i (tests and reference paths; the kernels use slot_words).
  __host__ __device__ inline uint32_t code(int i) const {
    uint32_t c = (lo[i * kLowBits / 32] >> (i * kLowBits % 32)) & ((1u << kLowBits) - 1);
    if constexpr (BITS == 3) c |= ((hi[0] >> hi_plane_bit(i)) & 1u) << 2;
    return c;
  }
};

// --- Register look-up tables: codes -> fp16 centroids with byte permutes (prmt), no memory. ---
// A codebook of up to 16 fp16 centroids is held as two byte planes: lo[w] has the low bytes of
// centroids 4w..4w+3, hi[w] the high bytes. prmt picks 4 bytes out of 8 by 4 selector nibbles, so
// a selector whose nibbles are 4 codes (< 8) yields their 4 low bytes from (lo[0], lo[1]) and their
// 4 high bytes from (hi[0], hi[1]); two more prmt interleave them into 2 fp16 pairs.
struct ByteTables {
  uint32_t lo[4];
  uint32_t hi[4];
};

// Selector nibbles must be < 8 (bit 3 would select sign fill) and only the low 16 bits of `s`
// count. On the device this is a bare PRMT: __byte_perm would first mask the selector with 0x7777,
// one more instruction per look-up that every selector here (codes < 8) makes redundant.
__host__ __device__ inline uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#ifdef __CUDA_ARCH__
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
#else
  const uint64_t v = (uint64_t(b) << 32) | a;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= uint32_t((v >> (8 * ((s >> (4 * k)) & 7))) & 0xff) << (8 * k);
  return r;
#endif
}

// Centroids of the codes in the 4 low nibbles of `sel`, as fp16 pairs (code0, code1), (code2, code3).
template <int BITS>
__host__ __device__ inline void lookup4(uint32_t sel, const ByteTables& t, uint32_t& v01,
                                        uint32_t& v23) {
  uint32_t lo, hi;
  if constexpr (BITS == 4) {  // nibble bit 3 would mean "sign fill" to prmt: pick by it instead
    const uint32_t low3 = sel & 0x7777u;
    const uint32_t upper = byte_perm(0u, 0xffffffffu, (sel >> 1) & 0x4444u);  // 0xff: code >= 8
    lo = (byte_perm(t.lo[0], t.lo[1], low3) & ~upper) | (byte_perm(t.lo[2], t.lo[3], low3) & upper);
    hi = (byte_perm(t.hi[0], t.hi[1], low3) & ~upper) | (byte_perm(t.hi[2], t.hi[3], low3) & upper);
  } else {
    lo = byte_perm(t.lo[0], t.lo[1], sel);
    hi = byte_perm(t.hi[0], t.hi[1], sel);
  }
  v01 = byte_perm(lo, hi, 0x5140u);
  v23 = byte_perm(lo, hi, 0x7362u);
}

// Which run coordinate sits in slot k of a decoded run. 2- and 3-bit runs come out evens-then-odds
// per block of up to 16 codes (their nibble masks split even and odd codes); 1- and 4-bit runs in
// order. The query (keys) and the output (values) use the same map.
__host__ __device__ inline int run_slot_coord(int bits, int cnt, int k) {
  if (bits != 2 && bits != 3) return k;
  const int c = cnt < 16 ? cnt : 16;
  const int r = k % c;
  return k - r + (r < c / 2 ? 2 * r : 2 * (r - c / 2) + 1);
}

// The slot that run coordinate x comes out in: the inverse of run_slot_coord.
__host__ __device__ inline int run_coord_slot(int bits, int cnt, int x) {
  if (bits != 2 && bits != 3) return x;
  const int c = cnt < 16 ? cnt : 16;
  const int r = x % c;
  return x - r + (r % 2 ? c / 2 + r / 2 : r / 2);
}

// The run's look-up selectors: nibble k of word i is the code in slot 8i + k (each nibble < 16;
// a run of 4 codes fills the low 16 bits only).
template <int BITS, int CNT>
__host__ __device__ inline void slot_words(const CodeRun<BITS, CNT>& run, uint32_t (&w)[(CNT + 7) / 8]) {
  if constexpr (BITS == 4) {
#pragma unroll
    for (int i = 0; i < (CNT + 7) / 8; ++i) w[i] = run.lo[i];
  } else if constexpr (BITS == 1) {
#pragma unroll
    for (int i = 0; i < (CNT + 7) / 8; ++i) {  // 8 bits to 8 nibbles
      uint32_t x = (run.lo[0] >> (8 * i)) & 0xffu;
      x = (x | (x << 12)) & 0x000f000fu;
      x = (x | (x << 6)) & 0x03030303u;
      w[i] = (x | (x << 3)) & 0x11111111u;
    }
  } else {
    constexpr int C = CNT < 16 ? CNT : 16;  // codes per block (one 32-bit low-plane word at most)
    constexpr uint32_t kMask = C == 16 ? 0xffffffffu : (1u << (2 * C)) - 1u;
#pragma unroll
    for (int blk = 0; blk < CNT / C; ++blk) {
      const uint32_t lo = run.lo[blk];
      uint32_t even = lo & 0x33333333u & kMask;        // nibble n: low bits of code 2n
      uint32_t odd = (lo >> 2) & 0x33333333u & kMask;  // nibble n: low bits of code 2n + 1
      if constexpr (BITS == 3) {  // the block's high bits, where block 0's sit: beside its nibbles
        const uint32_t h = run.hi[0] << (2 * blk);
        even |= h & 0x44444444u & kMask;         // high bit of code 2n at nibble n bit 2
        odd |= (h >> 1) & 0x44444444u & kMask;   // high bit of code 2n + 1
      }
      if constexpr (C == 16) {
        w[2 * blk] = even;
        w[2 * blk + 1] = odd;
      } else {
        w[0] = even | (odd << (2 * C));  // C / 2 nibbles each
      }
    }
  }
}

// The run's CNT centroids as CNT / 2 fp16 pairs: out[j] holds slots 2j and 2j + 1.
template <int BITS, int CNT>
__host__ __device__ inline void decode_pairs(const CodeRun<BITS, CNT>& run, const ByteTables& t,
                                             uint32_t (&out)[CNT / 2]) {
  uint32_t w[(CNT + 7) / 8];
  slot_words(run, w);
#pragma unroll
  for (int q = 0; q < CNT / 4; ++q) lookup4<BITS>(w[q / 2] >> (16 * (q % 2)), t, out[2 * q], out[2 * q + 1]);
}

// Two tokens' runs at once, for mma fragments whose fp16 pairs are two tokens: out[k] holds slot k
// of token a (low half) and of token b (high half). The two tokens' selector words are
// interleaved nibble by nibble before the look-ups, so the pairs come straight out of them
// (4 logic instructions per 16 codes instead of a pairing permute per 2).
template <int BITS, int CNT>
__host__ __device__ inline void decode_token_pairs(const CodeRun<BITS, CNT>& a,
                                                   const CodeRun<BITS, CNT>& b, const ByteTables& t,
                                                   uint32_t (&out)[CNT]) {
  uint32_t wa[(CNT + 7) / 8], wb[(CNT + 7) / 8];
  slot_words(a, wa);
  slot_words(b, wb);
#pragma unroll
  for (int i = 0; i < (CNT + 7) / 8; ++i) {
    const uint32_t ev = (wa[i] & 0x0f0f0f0fu) | ((wb[i] << 4) & 0xf0f0f0f0u);  // slots 8i + 0, 2, 4, 6
    const uint32_t od = ((wa[i] >> 4) & 0x0f0f0f0fu) | (wb[i] & 0xf0f0f0f0u);  // slots 8i + 1, 3, 5, 7
    uint32_t* o = out + 8 * i;
    lookup4<BITS>(ev, t, o[0], o[2]);
    lookup4<BITS>(od, t, o[1], o[3]);
    if constexpr (CNT >= 8) {
      lookup4<BITS>(ev >> 16, t, o[4], o[6]);
      lookup4<BITS>(od >> 16, t, o[5], o[7]);
    }
  }
}

// Calls f(std::integral_constant<int, bits>) for a runtime width (uniform across the warp).
template <typename F>
__device__ inline void with_bits(int bits, F&& f) {
  switch (bits) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

}  // namespace tq
