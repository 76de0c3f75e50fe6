// attention_common.cuh: what the attention passes over the packed cache share (split_kernel.cuh:
// the split pass for decode and short chunks; merge_kernel.cuh: the merge pass; prefill_attention.cu:
// the pass for long chunks; chunk_attention.cu: the chunk term of long calls): the key range and
// causal limits of a CTA, staging of page tiles, the online-softmax step, the query rotation and the
// codebook look-up tables. Their arguments and workspace layout: attention_params.cuh.
#pragma once

#include <cuda_runtime.h>

#include <climits>

#include "attention_params.cuh"
#include "cache.h"
#include "device_common.cuh"
#include "encode_vector.cuh"
#include "errors.h"
#include "mma.cuh"
#include "tile_decode.cuh"

namespace tq {

constexpr float kLog2e = 1.4426950408889634f;

// Issues the 16-byte copies of `chunks` consecutive chunks, lane-strided, from byte `offset` of
// `src`. With a compile-time count (specialized kernels) the loop unrolls into a fixed set of
// predicated copies. The offset is unsigned 32-bit (pages are smaller than 4 GiB, make_cache_view):
// one 64-bit add per run of copies, no sign extension, the further copies at immediate offsets.
__device__ inline void copy_chunks(uint8_t* dst, const uint8_t* src, uint32_t offset, int chunks, int lane) {
  const uint8_t* from = src + (offset + 16u * lane);
#pragma unroll
  for (int i = 0; i < chunks; i += 32)
    if (i + lane < chunks) cp_async_16(dst + 16 * (i + lane), from + 16 * i);
}

// Copies `rows` tokens, slots [slot0, slot0 + rows) of a page of T tokens, into rows [row0, row0 +
// rows) of a staging tile of TT tokens with the same codec layout. Every plane
// and the norms are [tokens][row] arrays, so an array's offset in a page is its offset in the tile
// divided by TT, times T, and the row sizes are equal: only the tile shape `tl` (a compile-time
// constant in the specialized kernels) is needed, no page shape. rows, slot0 and row0 are multiples
// of 16, so every copy is a whole number of aligned 16-byte chunks.
template <int TT>
__device__ inline void stage_rows(uint8_t* tile, const uint8_t* page, const PageShape& tl, int T,
                                  int slot0, int row0, int rows) {
  const int lane = threadIdx.x & 31;
  const uint32_t t = T, slot = slot0;
#pragma unroll
  for (int g = 0; g < tl.num_groups; ++g) {
    const GroupLayout& tg = tl.group[g];
    copy_chunks(tile + tg.lo_off + row0 * tg.lo_row_bytes, page,
                uint32_t(tg.lo_off / TT) * t + slot * tg.lo_row_bytes, rows * tg.lo_row_bytes / 16, lane);
    if (tg.hi_row_bytes)
      copy_chunks(tile + tg.hi_off + row0 * tg.hi_row_bytes, page,
                  uint32_t(tg.hi_off / TT) * t + slot * tg.hi_row_bytes, rows * tg.hi_row_bytes / 16, lane);
    copy_chunks(tile + tl.norm_off + (g * TT + row0) * 2, page,
                uint32_t(tl.norm_off / TT) * t + (g * t + slot) * 2, rows * 2 / 16, lane);
  }
}

// 2^x by one MUFU.EX2 (ex2.approx.ftz): exp2f adds a denormal-range fix-up that softmax weights
// never need (x <= 0; results below 2^-126 flush to 0, exp2(-inf) = 0).
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// One online-softmax step of a query row (base 2) over a tile whose largest score is mx: the row's
// running maximum m_run moves to max(m_run, mx) and its running sum l_run is rescaled to it; the
// tile's probabilities are exp2(score - base), base the new maximum or 0 while the row has seen
// nothing (so that no -inf - -inf arises), and alpha rescales the row's output as l_run was. The
// split, chunk and prefill passes share it.
struct SoftmaxStep {
  float base, alpha;
};
__device__ __forceinline__ SoftmaxStep online_softmax_step(float& m_run, float& l_run, float mx) {
  const float m_new = fmaxf(m_run, mx);
  const float base = m_new == -INFINITY ? 0.0f : m_new;
  const float alpha = fast_exp2(m_run - base);
  m_run = m_new;
  l_run *= alpha;
  return {base, alpha};
}

// Sequence b's length as the kernels read it: kv_lens[b] clamped to [0, max_kv_len].
__device__ inline int seq_len(const AttnArgs& a, int b) { return max(0, min(a.kv_lens[b], a.max_kv_len)); }

// One past the last cached position that a query row of the call's token `token` reads: its own
// (causal), or with new_kv the call's first (the call's positions are the chunk term's).
__device__ inline int cache_end(const AttnArgs& a, int len, int token) {
  return len - a.q_len + (a.new_kv[0] ? 0 : token + 1);
}

// The keys a CTA of query rows [row0, row0 + cta_rows) reads in its split: [begin, end), cut at
// the sequence's length `len` and at the last row's cache_end; tokens before full_end are visible
// to every one of its rows (no mask needed there).
struct CtaKeys {
  int len, begin, end, full_end;
};
__device__ inline CtaKeys cta_keys(const AttnArgs& a, int b, int split, int row0, int cta_rows) {
  CtaKeys k;
  k.len = seq_len(a, b);
  const int last_row = min(a.rows, row0 + cta_rows) - 1;
  k.begin = split * a.split_tokens;
  k.end = min(min(k.len, cache_end(a, k.len, quotient(last_row, a.group))), k.begin + a.split_tokens);
  k.full_end = min(k.end, cache_end(a, k.len, quotient(row0, a.group)));
  return k;
}

// The last cached position query row r reads; padding rows (r >= rows) are never written out: no limit.
__device__ inline int causal_limit(const AttnArgs& a, int len, int r) {
  return r < a.rows ? cache_end(a, len, quotient(r, a.group)) - 1 : INT_MAX;
}

// The rotary mean in attention (FORMAT.md section 1.1): q . R(pos) m = sum_i Re(z_i e^{i pos f_i})
// over the key codec's pairs i. Both passes add it with one more mma k step per 8 pairs, the
// product of a cos | sin table of angles with a (Re, -Im) row per query row: pair i's cos at
// column rot_col(i), its sin 8 further.
__host__ __device__ inline int rot_col(int i) { return 16 * (i / 8) + i % 8; }

// Query row r of KV head kvh: its token of the call (r / group) and its query head
// (kvh * group + r % group).
struct QueryRow {
  int token, head;
};
__device__ inline QueryRow query_row_of(const AttnArgs& a, int kvh, int r) {
  const int token = quotient(r, a.group);
  return {token, kvh * a.group.d + r - token * a.group.d};
}

// That row in sequence b: its index among the call's [batch][q_len][num_q_heads] rows.
__device__ inline int64_t query_row_index(const AttnArgs& a, int b, int kvh, int r) {
  const QueryRow q = query_row_of(a, kvh, r);
  return (int64_t(b) * a.q_len + q.token) * a.num_q_heads + q.head;
}

// That row's vector; nullptr for a padding row (r >= rows).
template <int D, typename T>
__device__ inline const T* query_row(const AttnArgs& a, int b, int kvh, int r) {
  return r < a.rows ? static_cast<const T*>(a.q) + query_row_index(a, b, kvh, r) * D : nullptr;
}

// Pair i of the key codec's rotary mean for head kvh: its first channel (-1 beyond rotary_pairs),
// mean and frequency (zero beyond rotary_pairs: a zero angle).
struct RotaryPair {
  int ch;
  float m0, m1, freq;
};
__device__ inline RotaryPair rotary_pair(const CodecLayout& kc, int kvh, int i) {
  if (i >= kc.rotary_pairs) return {-1, 0.0f, 0.0f, 0.0f};
  const int k = kvh * kc.rotary_pairs + i;
  return {kc.rotary_channel[k], kc.rotary_mean[2 * k], kc.rotary_mean[2 * k + 1], kc.rotary_freq[k]};
}

// z of query row qv for pair p, times q_scale (zero for a padding row or an absent pair):
// Re z = q[a] m + q[a + D/2] m', Im z = q[a] m' - q[a + D/2] m for the pair (a, a + D/2).
template <int D, typename T>
__device__ inline float2 rotary_z(const RotaryPair& p, const T* qv, float q_scale) {
  if (p.ch < 0 || !qv) return make_float2(0.0f, 0.0f);
  const float qa = to_float(qv[p.ch]) * q_scale, qb = to_float(qv[p.ch + D / 2]) * q_scale;
  return make_float2(qa * p.m0 + qb * p.m1, qa * p.m1 - qb * p.m0);
}

// (cos, sin) of j * freq for a small offset j (a few hundred radians at most): one MUFU pair,
// whose error (~1e-5 there) lies far below the fp16 the tables hold.
__device__ inline float2 small_turn(int j, float freq) {
  float s, c;
  __sincosf(float(j) * freq, &s, &c);
  return make_float2(c, s);
}

// Pair i's (cos, sin) into its columns of a table row in fp16, hi and lo (the rounding remainder);
// at(column) is the element of the row's column in the hi and lo tables.
template <class At>
__device__ inline void store_turn_hi_lo(__half* hi, __half* lo, int i, float2 cs, At at) {
#pragma unroll
  for (int part = 0; part < 2; ++part) {
    const HiLo<__half> v = split_hi_lo(part ? cs.y : cs.x);
    hi[at(rot_col(i) + 8 * part)] = v.hi;
    lo[at(rot_col(i) + 8 * part)] = v.lo;
  }
}

// (cos, sin) of (base + j) * freq from base's exact turn and j's small one.
__device__ inline float2 turn_by(float2 base, float2 step) {
  return make_float2(base.x * step.x - base.y * step.y, base.x * step.y + base.y * step.x);
}

// A lane's share of the query rotation (FORMAT.md "Attention never needs step 5"): the channels of
// its permuted coordinates lane*E .. lane*E+E-1 and their factors (key scale x sign). They are the
// same for every query row, so a CTA reads them once and then every row's values at once, instead
// of a chain of dependent global reads per row (which sets the prologue's length at short contexts).
template <int D>
struct LaneRotation {
  int ch[D / 32];
  float factor[D / 32];
};
template <int D>
__device__ inline LaneRotation<D> lane_rotation(const CodecLayout& kl, int kvh) {
  const int lane = threadIdx.x & 31;
  LaneRotation<D> lr;
#pragma unroll
  for (int e = 0; e < D / 32; ++e) {
    const int pj = lane * (D / 32) + e;
    lr.ch[e] = channel_of(kl, kvh, pj);
    lr.factor[e] = scale_of(kl, kvh, lr.ch[e]) * rotation_sign(kl.seed, pj);
  }
  return lr;
}

// Query row r's values at the lane's channels; zeros for a padding row (r >= rows).
template <int D, typename T>
__device__ inline void load_query_row(const AttnArgs& a, int b, int kvh, int r, const LaneRotation<D>& lr,
                                      float (&x)[D / 32]) {
  const T* qv = query_row<D, T>(a, b, kvh, r);
#pragma unroll
  for (int e = 0; e < D / 32; ++e) x[e] = qv ? to_float(qv[lr.ch[e]]) : 0.0f;
}

// Those values rotated into the keys' domain: the factors, each of the KG groups' Hadamard
// transform, times q_scale; the warp holds the row.
template <int D, int KG>
__device__ inline void rotate_query_row(const AttnArgs& a, const LaneRotation<D>& lr, float (&x)[D / 32]) {
#pragma unroll
  for (int e = 0; e < D / 32; ++e) x[e] *= lr.factor[e];
  warp_fwht_n<D / 32, D / KG>(x);
#pragma unroll
  for (int e = 0; e < D / 32; ++e) x[e] *= a.q_scale;
}

// The K and V codebooks as byte-permute tables (tile_decode.cuh), two per codebook kv * 2 + group
// (code_tables); written by the CTA's first 64 threads, one word each. grid: the values' tables hold
// the low bytes of the grid values kGridBias + i_k (layout.h; for look-ups with kFixedHi), the keys'
// the signed grid indices i_k in their low plane (decode_bytes, for the 8-bit mma), 4- and 5-bit
// low planes in the paired form (tile_decode.cuh: bit 7 is a level's sign either way); else the
// grid indices i_k in fp16, which holds them exactly: the reader multiplies by grid_step in fp32
// (the levels themselves in fp16 rounded 5-bit keys by enough to leave 2.17e-3 in a prefill test).
constexpr int kByteTablesBytes = 2 * 2 * TQ_MAX_GROUPS * int(sizeof(ByteTables));
__device__ inline void fill_byte_tables(ByteTables* tables, const CacheView& cache, bool grid) {
  if (threadIdx.x >= 2 * 2 * TQ_MAX_GROUPS * 8) return;
  const int kv = threadIdx.x / 32, g = (threadIdx.x / 16) % 2, half = (threadIdx.x / 8) % 2;
  const int w = threadIdx.x % 8;  // lo[0..3], then hi[0..3]
  const CodecLayout& cl = cache.codec[kv];
  const uint32_t to_signed = kv == 0 ? 0x80808080u : 0u;  // i_k + 128 -> i_k, byte by byte
  // (entries 0..7 of a paired plane are XORs of two bytes: no offset in them to take away)
  const uint32_t flip = w < 2 && cl.group[g].bits >= 4 ? 0u : to_signed;
  uint32_t word = grid ? (w < 4 ? cl.grid_lookup[g][4 * half + w] ^ flip : kGridHiBytes) : 0u;
  for (int k = 16 * half + 4 * (w % 4); !grid && k < 16 * half + 4 * (w % 4) + 4; ++k) {
    const bool used = g < cl.num_groups && k < (1 << cl.group[g].bits);
    const int index = used ? int((cl.grid_low[g][k / 4] >> (8 * (k % 4))) & 0xffu) - 128 : 0;
    const uint32_t bits = __half_as_ushort(__int2half_rn(index));
    word |= ((w < 4 ? bits : bits >> 8) & 0xffu) << (8 * (k % 4));
  }
  reinterpret_cast<uint32_t*>(tables + 2 * (kv * 2 + g) + half)[w] = word;
}

__device__ inline float tile_norm(const uint8_t* tile, const PageShape& tl, int g, int token) {
  return __half2float(reinterpret_cast<const __half*>(tile + tl.norm_off)[g * tl.tokens + token]);
}

// Whether a group of K or V has 5-bit codes (group 0 is the wider): such codecs get the kernels
// instantiated with MAXB 5, the others kernels without the 5-bit path.
inline bool has_5bit_codes(const CacheView& c) {
  return c.codec[0].group[0].bits == 5 || c.codec[1].group[0].bits == 5;
}

// Launches one of the attention passes' kernels on `threads` threads per CTA with `smem` bytes of
// dynamic shared memory, raising the kernel's limit first where that exceeds the default 48 KB;
// `pass` names it in errors.
inline tq_status launch_pass(void (*kernel)(AttnArgs), const char* pass, dim3 grid, int threads, int smem,
                             const AttnArgs& a, cudaStream_t stream) {
  if (smem > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
    return fail(TQ_ERR_CUDA, "%s: cannot raise the shared memory limit to %d bytes", pass, smem);
  kernel<<<grid, threads, smem, stream>>>(a);
  return check_launch(pass);
}

// The prefill pass (prefill_attention.cu) writes one partial state per split of every query row,
// like the split pass; the merge pass finishes both. grid: (splits, KV heads, batch x CTA row tiles).
template <int D, typename T>
tq_status launch_prefill_pass(const AttnArgs& a, dim3 grid, cudaStream_t stream);

// The chunk pass (chunk_attention.cu): each query row's attention over the call's new keys and
// values up to its own token, exactly, into AttnArgs::chunk_o / chunk_ml, for the merge pass.
template <int D, typename T>
tq_status launch_chunk_pass(const AttnArgs& a, int batch, cudaStream_t stream);

}  // namespace tq
