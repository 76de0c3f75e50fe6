// tile_decode.cuh: the levels of a run of codes of one token, read from a staged tile (16 or 32
// tokens in shared memory, laid out like any page: FORMAT.md section 5 with T = 16 or 32).
// A thread decodes CNT consecutive coordinates of one group, starting at group coordinate
// part * CNT: it loads the run's raw plane words (CodeRun::load), turns them into look-up
// selectors (slot_words), then into levels with register look-up tables (decode_pairs: fp16
// pairs of one token; decode_token_pairs: fp16 pairs of two tokens; decode_bytes: 8-bit levels,
// four per word): one byte permute per code, three per four with grid tables (kFixedHi,
// layout.h), one per four for 8-bit levels, plus, per 16 codes, a few masks and shifts (the
// format's high-plane order makes the 3-bit selectors with masks, FORMAT.md section 3). 4- and
// 5-bit codes take about two and three times those permutes, and a few selections: they serve the
// few layers the allocator makes wide; with grid tables their 16-entry look-ups are paired (two
// permutes and an XOR per four codes, paired_word).
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
  static constexpr int kLowBits = low_plane_bits(BITS);  // 3- and 5-bit codes: + a 1-bit plane
  static constexpr int kLowWords = (CNT * kLowBits + 31) / 32;
  uint32_t lo[kLowWords];
  // 3- and 5-bit codes (CNT <= 32): the run's high-plane word, shifted so that run coordinate i
  // sits at hi_plane_bit(BITS, i), where coordinate i of a word sits (a run starts at a multiple
  // of CNT).
  uint32_t hi[1];

  __host__ __device__ inline void load(const uint8_t* tile, const GroupLayout& g, int row, int part) {
    load_plane_bits<kLowWords>(tile + g.lo_off + row * g.lo_row_bytes, part * CNT * kLowBits, lo);
    if constexpr (kLowBits != BITS) {
      const int first = part * CNT;
      const uint32_t w = reinterpret_cast<const uint32_t*>(tile + g.hi_off + row * g.hi_row_bytes)[first >> 5];
      if constexpr (BITS == 3) hi[0] = (w << (2 * ((first >> 4) & 1))) >> (2 * (first & 15));
      else hi[0] = w >> (first & 31);
    }
  }
  // Code of run coordinate i (tests and reference paths; the kernels use slot_words).
  __host__ __device__ inline uint32_t code(int i) const {
    uint32_t c = (lo[i * kLowBits / 32] >> (i * kLowBits % 32)) & ((1u << kLowBits) - 1);
    if constexpr (kLowBits != BITS) c |= ((hi[0] >> hi_plane_bit(BITS, i)) & 1u) << kLowBits;
    return c;
  }
};

// --- Register look-up tables: codes -> fp16 centroids with byte permutes (prmt), no memory. ---
// 16 fp16 centroids are held as two byte planes: lo[w] has the low bytes of centroids 4w..4w+3,
// hi[w] the high bytes. prmt picks 4 bytes out of 8 by 4 selector nibbles, so a selector whose
// nibbles are 4 codes (< 8) yields their 4 low bytes from (lo[0], lo[1]) and their 4 high bytes
// from (hi[0], hi[1]); two more prmt interleave them into 2 fp16 pairs.
struct ByteTables {
  uint32_t lo[4];
  uint32_t hi[4];
};

// A codebook of BITS-bit codes: one ByteTables, two for 5-bit codes (part[1]: codes 16..31), so
// that narrower codes carry no registers for entries they cannot name.
template <int BITS>
struct CodeTables {
  ByteTables part[BITS == 5 ? 2 : 1];
};

// Codebook i of an array that holds two ByteTables per codebook (entries 0..15, then 16..31).
template <int BITS>
__host__ __device__ inline const CodeTables<BITS>& code_tables(const ByteTables* tables, int i) {
  return *reinterpret_cast<const CodeTables<BITS>*>(tables + 2 * i);
}

// Byte k of the result is byte (nibble k of s) & 7 of (a, b), or, where the nibble's bit 3 is set,
// that byte's sign bit repeated (prmt's default mode; only the paired look-up uses it). Only the
// low 16 bits of `s` count. On the device this is a bare PRMT: __byte_perm would first mask the
// selector with 0x7777, one more instruction per look-up that the selectors here make redundant.
__host__ __device__ inline uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#ifdef __CUDA_ARCH__
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
#else
  const uint64_t v = (uint64_t(b) << 32) | a;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) {
    const uint32_t nib = (s >> (4 * k)) & 0xf, byte = uint32_t(v >> (8 * (nib & 7))) & 0xff;
    r |= (nib & 8 ? (byte & 0x80 ? 0xffu : 0u) : byte) << (8 * k);
  }
  return r;
#endif
}

// The bits of a where m is set, of b elsewhere: one LOP3.
__host__ __device__ inline uint32_t bit_select(uint32_t a, uint32_t b, uint32_t m) {
#ifdef __CUDA_ARCH__
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xe4;" : "=r"(r) : "r"(a), "r"(b), "r"(m));  // (a & m) | (b & ~m)
  return r;
#else
  return (a & m) | (b & ~m);
#endif
}

// The paired form of 16-entry look-ups (4- and 5-bit codes, grid tables: bit 7 of a level's byte
// is its sign). A selector nibble is the code rotated right by one bit (r = rotate_nibbles), so
// that r and r ^ 8 name codes 2j and 2j + 1 (j = r & 7), neighbours, of one sign wherever the
// codebook has an even number of negative levels (make_layout checks it). Entry j of the plane
// holds L(2j) ^ L(2j + 1), entry 8 + j holds L(2j + 1). A permute by r itself gives entry j where
// bit 3 of r is clear and, where it is set, that entry's sign fill: zero, as the two levels share
// bit 7; XORed with the permute by r & 7 of entries 8..15, that is L(2j) or L(2j + 1). Two
// permutes, a mask and an XOR per four codes instead of seven instructions, for a rotation (three
// per eight codes) in slot_words.
__host__ __device__ inline uint32_t rotate_nibbles(uint32_t w) { return bit_select(w >> 1, w << 3, 0x77777777u); }

// Word w (entries 4w .. 4w + 3) of the paired form of a 16-entry byte plane (entry k in byte k % 4
// of plane[k / 4]).
__host__ __device__ inline uint32_t paired_word(const uint32_t (&plane)[4], int w) {
  const auto entry = [&](int k) { return (plane[k / 4] >> (8 * (k % 4))) & 0xffu; };
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const int e = 4 * w + i, j = e & 7;
    r |= (e < 8 ? entry(2 * j) ^ entry(2 * j + 1) : entry(2 * j + 1)) << (8 * i);
  }
  return r;
}

// Byte k of the result is 0xff where nibble k of `sel` has bit `bit` set, else 0.
__host__ __device__ inline uint32_t nibble_bit_mask(uint32_t sel, int bit) {
  const uint32_t at2 = bit >= 2 ? sel >> (bit - 2) : sel << (2 - bit);  // the bit to nibble bit 2
  return byte_perm(0u, 0xffffffffu, at2 & 0x4444u);
}

// The bytes that 4 codes below 16 (the nibbles of `sel`) select from the 16-entry plane p[0..3].
// Plain: nibble bit 3 would mean "sign fill" to prmt, so both halves are looked up and bit 3
// picks. kPaired: sel holds rotated codes and p the paired form (rotate_nibbles).
template <bool kPaired>
__host__ __device__ inline uint32_t lookup_bytes16(uint32_t sel, const uint32_t* p) {
  if constexpr (kPaired) return byte_perm(p[0], p[1], sel) ^ byte_perm(p[2], p[3], sel & 0x7777u);
  const uint32_t low3 = sel & 0x7777u, upper = nibble_bit_mask(sel, 3);  // 0xff: code >= 8
  return (byte_perm(p[0], p[1], low3) & ~upper) | (byte_perm(p[2], p[3], low3) & upper);
}

// The bytes of the 4 codes in the low nibbles of `sel` from one byte plane of a codebook's tables:
// p0 for codes below 16, p1 for 5-bit codes 16..31 (`top`: their bit 4 at bit 0 of the nibbles).
template <int BITS, bool kPaired>
__host__ __device__ inline uint32_t lookup_plane(uint32_t sel, const uint32_t* p0, const uint32_t* p1, uint32_t top) {
  if constexpr (BITS == 5) {
    const uint32_t upper = nibble_bit_mask(top, 0);  // 0xff: code >= 16
    return (lookup_bytes16<kPaired>(sel, p0) & ~upper) | (lookup_bytes16<kPaired>(sel, p1) & upper);
  } else if constexpr (BITS == 4) {
    return lookup_bytes16<kPaired>(sel, p0);
  } else {
    return byte_perm(p0[0], p0[1], sel);
  }
}

// Centroids of the codes in the 4 low nibbles of `sel`, as fp16 pairs (code0, code1), (code2, code3).
// kFixedHi: grid tables, whose low planes are paired (sel from slot_words<..., true>).
template <int BITS, bool kFixedHi = false>
__host__ __device__ inline void lookup4(uint32_t sel, const CodeTables<BITS>& ct, uint32_t& v01,
                                        uint32_t& v23, uint32_t top = 0) {
  const ByteTables &t = ct.part[0], &u = ct.part[BITS == 5 ? 1 : 0];
  const uint32_t lo = lookup_plane<BITS, kFixedHi>(sel, t.lo, u.lo, top);
  const uint32_t hi = kFixedHi ? kGridHiBytes : lookup_plane<BITS, false>(sel, t.hi, u.hi, top);
  v01 = byte_perm(lo, hi, 0x5140u);
  v23 = byte_perm(lo, hi, 0x7362u);
}

// Which run coordinate sits in slot k of a decoded run. 2- and 3-bit runs come out evens-then-odds
// per block of up to 16 codes (their nibble masks split even and odd codes); 1-, 4- and 5-bit runs
// in order. The query (keys) and the output (values) use the same map.
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

// Bits 8i .. 8i + 7 of a 1-bit plane word, one to bit 0 of each of 8 nibbles.
__host__ __device__ inline uint32_t bits_to_nibbles(uint32_t word, int i) {
  uint32_t x = (word >> (8 * i)) & 0xffu;
  x = (x | (x << 12)) & 0x000f000fu;
  x = (x | (x << 6)) & 0x03030303u;
  return (x | (x << 3)) & 0x11111111u;
}

// The run's look-up selectors: nibble k of word i is the code in slot 8i + k (each nibble < 16;
// a run of 4 codes fills the low 16 bits only); of 5-bit codes the low 4 bits (top_words: bit 4),
// rotated for paired tables (kPaired).
template <int BITS, int CNT, bool kPaired = false>
__host__ __device__ inline void slot_words(const CodeRun<BITS, CNT>& run, uint32_t (&w)[(CNT + 7) / 8]) {
  if constexpr (BITS == 4 || BITS == 5) {
#pragma unroll
    for (int i = 0; i < (CNT + 7) / 8; ++i) w[i] = kPaired ? rotate_nibbles(run.lo[i]) : run.lo[i];
  } else if constexpr (BITS == 1) {
#pragma unroll
    for (int i = 0; i < (CNT + 7) / 8; ++i) w[i] = bits_to_nibbles(run.lo[0], i);
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

// 5-bit codes: bit 4 of the code in slot 8i + k at bit 0 of nibble k of word i (else zeros).
template <int BITS, int CNT>
__host__ __device__ inline void top_words(const CodeRun<BITS, CNT>& run, uint32_t (&w)[(CNT + 7) / 8]) {
#pragma unroll
  for (int i = 0; i < (CNT + 7) / 8; ++i) w[i] = BITS == 5 ? bits_to_nibbles(run.hi[0], i) : 0u;
}

// Calls f(q, sel, top) for each quad q of the run's slots (4q .. 4q + 3): their selectors in the
// low nibbles of sel, of 5-bit codes bit 4 in top's.
template <bool kPaired, int BITS, int CNT, typename F>
__host__ __device__ inline void for_each_quad(const CodeRun<BITS, CNT>& run, F&& f) {
  uint32_t w[(CNT + 7) / 8], top[(CNT + 7) / 8];
  slot_words<BITS, CNT, kPaired>(run, w);
  top_words(run, top);
#pragma unroll
  for (int q = 0; q < CNT / 4; ++q) f(q, w[q / 2] >> (16 * (q % 2)), top[q / 2] >> (16 * (q % 2)));
}

// The run's CNT centroids as CNT / 2 fp16 pairs: out[j] holds slots 2j and 2j + 1.
template <int BITS, int CNT>
__host__ __device__ inline void decode_pairs(const CodeRun<BITS, CNT>& run, const CodeTables<BITS>& t,
                                             uint32_t (&out)[CNT / 2]) {
  for_each_quad<false>(run, [&](int q, uint32_t sel, uint32_t top) {
    lookup4<BITS>(sel, t, out[2 * q], out[2 * q + 1], top);
  });
}

// The run's CNT codes as the bytes of the tables' low plane, four per word: out[q] holds slots
// 4q .. 4q + 3 (byte k: slot 4q + k), as an 8-bit mma fragment holds 4 consecutive k. With tables
// of signed grid levels (fill_byte_tables, paired) one byte permute per 4 codes, no interleave.
template <int BITS, int CNT>
__host__ __device__ inline void decode_bytes(const CodeRun<BITS, CNT>& run, const CodeTables<BITS>& t,
                                             uint32_t (&out)[CNT / 4]) {
  for_each_quad<true>(run, [&](int q, uint32_t sel, uint32_t top) {
    out[q] = lookup_plane<BITS, true>(sel, t.part[0].lo, t.part[BITS == 5 ? 1 : 0].lo, top);
  });
}

// Nibbles of slots 8i + 0, 2, 4, 6 (interleave_even) or 8i + 1, 3, 5, 7 (interleave_odd) of two
// tokens' selector words of BITS-bit codes, token a's in the even nibbles. From 3 bits on, one
// bit_select: written out, ptxas narrows the masks to 3-bit selectors' clear bit 3 and then needs
// two LOP3. 1- and 2-bit selectors stay written out, which ptxas folds into their masks.
template <int BITS>
__host__ __device__ inline uint32_t interleave_even(uint32_t a, uint32_t b) {
  if constexpr (BITS >= 3) return bit_select(a, b << 4, 0x0f0f0f0fu);
  else return (a & 0x0f0f0f0fu) | ((b << 4) & 0xf0f0f0f0u);
}
template <int BITS>
__host__ __device__ inline uint32_t interleave_odd(uint32_t a, uint32_t b) {
  if constexpr (BITS >= 3) return bit_select(a >> 4, b, 0x0f0f0f0fu);
  else return ((a >> 4) & 0x0f0f0f0fu) | (b & 0xf0f0f0f0u);
}

// Two tokens' runs at once, for mma fragments whose fp16 pairs are two tokens: out[k] holds slot k
// of token a (low half) and of token b (high half). The two tokens' selector words are
// interleaved nibble by nibble before the look-ups, so the pairs come straight out of them
// (4 logic instructions per 16 codes instead of a pairing permute per 2).
template <bool kFixedHi = false, int BITS, int CNT>
__host__ __device__ inline void decode_token_pairs(const CodeRun<BITS, CNT>& a,
                                                   const CodeRun<BITS, CNT>& b, const CodeTables<BITS>& t,
                                                   uint32_t (&out)[CNT]) {
  uint32_t wa[(CNT + 7) / 8], wb[(CNT + 7) / 8], ta[(CNT + 7) / 8], tb[(CNT + 7) / 8];
  slot_words<BITS, CNT, kFixedHi>(a, wa);
  slot_words<BITS, CNT, kFixedHi>(b, wb);
  top_words(a, ta);
  top_words(b, tb);
#pragma unroll
  for (int i = 0; i < (CNT + 7) / 8; ++i) {
    const uint32_t ev = interleave_even<BITS>(wa[i], wb[i]), od = interleave_odd<BITS>(wa[i], wb[i]);
    const uint32_t tev = interleave_even<BITS>(ta[i], tb[i]), tod = interleave_odd<BITS>(ta[i], tb[i]);
    uint32_t* o = out + 8 * i;
    lookup4<BITS, kFixedHi>(ev, t, o[0], o[2], tev);
    lookup4<BITS, kFixedHi>(od, t, o[1], o[3], tod);
    if constexpr (CNT >= 8) {
      lookup4<BITS, kFixedHi>(ev >> 16, t, o[4], o[6], tev >> 16);
      lookup4<BITS, kFixedHi>(od >> 16, t, o[5], o[7], tod >> 16);
    }
  }
}

// Calls f(std::integral_constant<int, bits>) for a runtime width (uniform across the warp) of at
// most MAXB bits. A kernel that never meets 5-bit codes leaves their path (and its registers) out.
template <int MAXB, typename F>
__device__ inline void with_bits(int bits, F&& f) {
  if constexpr (MAXB == 5)
    if (bits == 5) return f(std::integral_constant<int, 5>{});
  switch (bits) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

}  // namespace tq
