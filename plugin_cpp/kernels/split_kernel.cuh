// split_kernel.cuh: the split pass (attention_split_kernel), included by attention.cu only.
//
// One CTA per (KV split, KV head, sequence, tile of 16 query rows). Query rows are the q_len x
// group query vectors that share one KV head (row = token * group + head in group), so every KV
// byte loaded serves the whole GQA group. The rows are rotated once into the keys' domain
// (FORMAT.md "Attention never needs step 5"), softmax scale and log2(e) folded in, and held in
// registers as mma B fragments (fp16, or 8-bit hi + lo against 8-bit key levels). Each warp streams
// 32-token tiles of the split (cp.async into shared memory, kStages deep), decodes codes to levels
// in registers with byte-permute look-up tables (tile_decode.cuh), and computes the transposed
// products S^T = K Q^T and O^T += V^T P^T on tensor cores, 16 tokens per mma, with one online
// softmax step in base 2 per 32 tokens: tokens and value dims are the mma's M (16), query rows its
// N (8 per row tile), so a decode step of up to 8 rows (GQA group x q_len) wastes no tensor-core
// rows, and the decoded codes, as A fragments, serve every row tile. Norms multiply the scores
// (keys) and the probabilities (values), so centroids are decoded unscaled. The warps' states are
// combined and written as one partial state per split.
// The kernel's stages, each a function of its own: the prologue (query fragments, tables, the
// rotary mean's state), per tile stage_tile (cp.async), tile_scores and tile_rotary_scores (S^T),
// tile_softmax (mask, maxima, rescale), tile_values (O^T), then write_split_state (the epilogue).
// The fused append (AttnArgs::append) encodes the call's new keys and values: a one-token step's
// in CTAs of its own, beside the splits or in the merge pass (AttnArgs::append_cta0), a longer
// step's in the splits that hold the new positions. No split reads them: with the new rows every
// query row stops its cache reads before the call's first position (cache_end).
// The key mean is not needed: q . mu is the same for every key of a query row and softmax is
// invariant to a per-row shift; only the log-sum-exp adds it back (merge pass).
#pragma once

#include "attention_common.cuh"

namespace tq {
namespace {  // (one translation unit: attention.cu)

// Rows of the rotary mean's tables in the split pass: 40 fp16 columns put the 8 rows that one
// fragment or ldmatrix reads on distinct banks.
constexpr int kRotLd = 2 * TQ_MAX_ROTARY_PAIRS + 8;
// The rotary mean's tables, where the query rows were (they are in registers by then): the cos |
// sin of the angles j f_i, j = 0 .. kChunk - 1, as fp16 hi [kChunk][kRotLd] and lo (the
// remainder) [kChunk][kRotLd]; then float2 [TQ_MAX_ROTARY_PAIRS]: each pair's turn over a warp's
// stride between tiles. (At head_dim 128 the query rows' region nearly holds them: 4-bit tiles
// keep 4 CTAs per SM.)
constexpr int kRotTableBytes = 2 * kChunk * kRotLd * 2;
constexpr int kRotBytes = kRotTableBytes + TQ_MAX_ROTARY_PAIRS * 8;

// The combine buffer's rows (the epilogue): a run of 16 dims takes 17 floats and rows lie 4 mod 8
// floats apart, so that each store of the accumulator fragments (8 runs x 4 rows) spreads over the
// banks (all 32 at head_dim 128). Unpadded, its 16-way conflicts took 5% of the split pass's stall
// samples at 1 x 4,096.
__host__ __device__ constexpr int combine_ld(int D) {
  return D + D / 16 + (D / 16 % 8 == 4 ? 0 : (12 - D / 16 % 8) % 8);
}
__host__ __device__ constexpr int combine_at(int D, int row, int dim) {
  return row * combine_ld(D) + dim + dim / 16;
}
static_assert(combine_ld(128) % 8 == 4 && combine_ld(64) % 8 == 4);

struct SmemPlan {
  int q_half, tables, stages, stage_bytes, combine, total;
};

// Of a CTA of `warps` warps at head_dim D; rotary: the key codec has a rotary mean (its tables
// share the query rows' region). (Inlined with constants in the kernel.)
__host__ __device__ inline SmemPlan smem_plan(int D, int warps, const PageShape& kt, const PageShape& vt,
                                              bool rotary) {
  SmemPlan p{};
  p.q_half = 0;                                      // __half[16][D + 8], then the rotary tables
  const int q_bytes = kRows * (D + 8) * 2;
  p.tables = (rotary && kRotBytes > q_bytes ? kRotBytes : q_bytes + 15) / 16 * 16;  // ByteTables[2][4] (fill_byte_tables)
  p.stages = p.tables + kByteTablesBytes;  // per warp: kStages x (K, V chunk)
  p.stage_bytes = kt.page_bytes + vt.page_bytes;
  const int loop_bytes = p.stages + warps * kStages * p.stage_bytes;
  p.combine = 0;                     // float O[warps][16] rows of combine_ld(D), float2 ml[warps][16]
  const int combine_bytes = warps * kRows * combine_ld(D) * 4 + warps * kRows * 8;
  p.total = loop_bytes > combine_bytes ? loop_bytes : combine_bytes;
  return p;
}

// The kChunk-token tile shape of a codec: computed at compile time when the kernel is specialized
// for the width (B = bits of group 0), so that every offset and width below is a constant; else
// the runtime shape.
template <int D, int G, int B>
__device__ inline PageShape tile_shape(const PageShape& runtime) {
  if constexpr (B > 0) return page_shape(D, G, B, G == 2 ? B - 1 : B, kChunk);
  else return runtime;
}

// The fused append's work in one CTA: the call's new keys and values (AttnArgs::new_kv) of
// sequence b, KV head kvh whose positions lie in [first, last), L the sequence's length; one warp
// per vector, of the CTA's W. It rounds y itself (step 4.4 without the scale search, a valid
// encoding for every reader): with the search's code in them, the split kernels ran calls without
// an append up to 31% slower (docs/BENCHMARKS.md#the-fused-append).
template <int D, int W, typename T>
__device__ inline void encode_new_rows(const AttnArgs& a, int b, int kvh, int L, int first, int last) {
  for (int item = threadIdx.x / 32; item < 2 * a.q_len; item += W) {
    const int j = item / 2, kind = item % 2, pos = L - a.q_len + j;
    if (pos < 0 || pos < first || pos >= last) continue;
    uint8_t* page = page_of(a.cache, b, kind, pos / a.cache.tokens, kvh);
    const T* x = static_cast<const T*>(a.new_kv[kind]) + (int64_t(b) * a.q_len + j) * a.new_stride +
                 int64_t(kvh) * D;
    encode_vector<D, T, false>(a.cache.codec[kind], kvh, x, page, pos);
  }
}

// A rotated query row (the warp holds it: lane l has channels E l .. E l + E - 1) as 8-bit hi + lo
// for the 8-bit key products: q = u (254 hi + lo) to within u / 2, u the row's largest magnitude
// over 127 x 254 (about 15 bits of it). Written to a query-row slot of 2 (D + 8) bytes: hi bytes
// [0, D), lo bytes [D, 2D), each coordinate at the run slot its key code decodes to (decode_bytes:
// a fragment's 4 coordinates are one word), u at byte 2D; u is NaN where the row holds a NaN or
// Inf, so that the row's outputs are NaN as on the fp16 path.
template <int D, int KG>
__device__ inline void store_query_bytes(uint8_t* row, const float (&x)[D / 32], const PageShape& kt) {
  constexpr int E = D / 32, KCNT = D / KG / 4;
  const int lane = threadIdx.x & 31;
  float mx = 0.0f;
  bool finite = true;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    mx = fmaxf(mx, fabsf(x[e]));
    finite &= isfinite(x[e]);
  }
  finite = __all_sync(0xffffffffu, finite);
#pragma unroll
  for (int s = 16; s >= 1; s /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, s));
  // __fdividef: no IEEE division, whose slow path (a call) every padding row (mx = 0) would take
  const float to_units = mx > 0.0f ? __fdividef(127.0f, mx) : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int c = lane * E + e, g = c / (D / KG), run = c % (D / KG);
    const int at = g * (D / KG) + run - run % KCNT + run_coord_slot(kt.group[g].bits, KCNT, run % KCNT);
    const float v = x[e] * to_units, h = rintf(v);  // |v| <= 127, |v - h| <= 1/2
    row[at] = uint8_t(int(h));
    row[D + at] = uint8_t(int(rintf((v - h) * 254.0f)));
  }
  if (lane == 0) *reinterpret_cast<float*>(row + 2 * D) = finite ? mx * (1.0f / (127.0f * 254.0f)) : NAN;
}

// Stage "scores": S^T = K Q^T of a staged tile (kt_s), per half h: element e of row tile nr is
// (token 16h + g4 + 8 (e / 2), row 8nr + 2tig + e % 2). This thread decodes tokens 16h + g4 and
// 16h + g4 + 8 (its A rows). Even and odd k steps accumulate separately: independent mma chains.
// qb, qb_lo, key_step, row_unit: the query fragments and units of the prologue.
template <int D, int KG, int MAXB, int NR, bool kGrid, int KCNT, int KSTEPS>
__device__ __forceinline__ void tile_scores(float (&s)[2][NR][4], const uint8_t* kt_s, const PageShape& kt,
                                            const ByteTables* tables, const uint32_t (&qb)[KG * KSTEPS][NR][2],
                                            const uint32_t (&qb_lo)[KG * KSTEPS][2], const float (&key_step)[KG],
                                            const float (&row_unit)[2], int g4, int tig) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int g = 0; g < KG; ++g) {
      float sg[NR][2][4] = {};
      with_bits<MAXB>(kt.group[g].bits, [&](auto bits) {
        constexpr int BITS = decltype(bits)::value;
        const CodeTables<BITS> table = code_tables<BITS>(tables, g);
        // this thread's A rows: tokens g4 and g4 + 8, as fp16 pairs or (kGrid) 8-bit levels
        uint32_t ka[2][kGrid ? KCNT / 4 : KCNT / 2];
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          CodeRun<BITS, KCNT> run;
          run.load(kt_s, kt.group[g], kTile * h + g4 + 8 * t, tig);
          if constexpr (kGrid) decode_bytes(run, table, ka[t]);
          else decode_pairs(run, table, ka[t]);
        }
        int hi[4] = {}, lo[4] = {};  // kGrid: the two chains are the hi and lo products
#pragma unroll
        for (int st = 0; st < KSTEPS; ++st) {
          const uint32_t af[4] = {ka[0][2 * st], ka[1][2 * st], ka[0][2 * st + 1], ka[1][2 * st + 1]};
          if constexpr (kGrid) {
            mma_16832_s8(hi, af, qb[g * KSTEPS + st][0][0], qb[g * KSTEPS + st][0][1]);
            mma_16832_s8(lo, af, qb_lo[g * KSTEPS + st][0], qb_lo[g * KSTEPS + st][1]);
          } else {
#pragma unroll
            for (int nr = 0; nr < NR; ++nr)
              mma_16816(sg[nr][st & 1], af, qb[g * KSTEPS + st][nr][0], qb[g * KSTEPS + st][nr][1]);
          }
        }
        // |254 hi + lo| <= 255 x 127 x 127 x (D / KG) < 2^31
#pragma unroll
        for (int e = 0; kGrid && e < 4; ++e) sg[0][0][e] = float(254 * hi[e] + lo[e]);
      });
      const float n0 = tile_norm(kt_s, kt, g, kTile * h + g4) * key_step[g];
      const float n1 = tile_norm(kt_s, kt, g, kTile * h + g4 + 8) * key_step[g];
#pragma unroll
      for (int nr = 0; nr < NR; ++nr) {
        s[h][nr][0] += (sg[nr][0][0] + sg[nr][1][0]) * n0;
        s[h][nr][1] += (sg[nr][0][1] + sg[nr][1][1]) * n0;
        s[h][nr][2] += (sg[nr][0][2] + sg[nr][1][2]) * n1;
        s[h][nr][3] += (sg[nr][0][3] + sg[nr][1][3]) * n1;
      }
    }
  if constexpr (kGrid)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[h][0][e] *= row_unit[e & 1];
}

// Stage "scores", the rotary mean's term (attention_common.cuh): added to the tile's scores by one
// mma k step per 8 pairs, then each row's w turned to the warp's next tile.
template <int NR>
__device__ __forceinline__ void tile_rotary_scores(float (&s)[2][NR][4], float2 (&rot_w)[NR][2][2], int rot_steps,
                                                   const __half* rot_e, const float2* rot_turn, int lane, int tig) {
#pragma unroll
  for (int st = 0; st < 2; ++st) {
    if (st >= rot_steps) break;
    uint32_t re_hi[NR], re_lo[NR], im_hi[NR], im_lo[NR];
#pragma unroll
    for (int nr = 0; nr < NR; ++nr) {
      split_float2(rot_w[nr][st][0].x, rot_w[nr][st][1].x, re_hi[nr], re_lo[nr]);
      split_float2(-rot_w[nr][st][0].y, -rot_w[nr][st][1].y, im_hi[nr], im_lo[nr]);
    }
    const int lm = lane >> 3;  // lanes 8m .. 8m+7 address rows 8 (m % 2) .., columns 8 (m / 2) ..
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t e_hi[4], e_lo[4];
      const __half* e_row = rot_e + (kTile * h + 8 * (lm & 1) + (lane & 7)) * kRotLd + 16 * st + 8 * (lm >> 1);
      ldmatrix_x4(e_hi, e_row);
      ldmatrix_x4(e_lo, e_row + kChunk * kRotLd);
#pragma unroll
      for (int nr = 0; nr < NR; ++nr) {
        mma_16816(s[h][nr], e_hi, re_hi[nr], im_hi[nr]);
        mma_16816(s[h][nr], e_lo, re_hi[nr], im_hi[nr]);
        mma_16816(s[h][nr], e_hi, re_lo[nr], im_lo[nr]);
      }
    }
    const float4 t = *reinterpret_cast<const float4*>(rot_turn + 8 * st + 2 * tig);
#pragma unroll
    for (int nr = 0; nr < NR; ++nr) {
      rot_w[nr][st][0] = turn_by(rot_w[nr][st][0], make_float2(t.x, t.y));
      rot_w[nr][st][1] = turn_by(rot_w[nr][st][1], make_float2(t.z, t.w));
    }
  }
}

// Stage "softmax step": masks the tile's scores (beyond the split or the staged tokens, or past the
// row's cache_end) where a token can be masked (not `full`), then one online-softmax step per row
// (a row's 32 scores lie across the 8 lanes of its tig): m_use receives the base of the tile's
// probabilities, m_run and l_run move on, and the accumulators o are rescaled.
template <int VG, int NR, bool kGrid, int MT, int VCNT>
__device__ __forceinline__ void tile_softmax(float (&s)[2][NR][4], float (&m_use)[NR][2], float (&m_run)[NR][2],
                                             float (&l_run)[NR][2], float (&o)[MT][NR][4],
                                             float (&p_tile)[VG][NR][4], bool full, const int (&valid)[2], int pos0,
                                             const int (&limit)[NR][2], int g4) {
  if (!full) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int nr = 0; nr < NR; ++nr)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = g4 + 8 * (e >> 1);
          if (tok >= valid[h] || pos0 + kTile * h + tok > limit[nr][e & 1]) s[h][nr][e] = -INFINITY;
        }
  }
  float alpha[NR][2];
#pragma unroll
  for (int nr = 0; nr < NR; ++nr)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float mx = fmaxf(fmaxf(s[0][nr][j], s[0][nr][j + 2]), fmaxf(s[1][nr][j], s[1][nr][j + 2]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const SoftmaxStep step = online_softmax_step(m_run[nr][j], l_run[nr][j], mx);
      m_use[nr][j] = step.base;
      alpha[nr][j] = step.alpha;
    }
  // The rescale on every tile, with no vote and branch around it: its multiplies go to the FMA
  // pipe (the loop is bound by integer issue), and the value decode below, which needs no
  // softmax, is scheduled across the maxima and the rescale. Skipping it where no row's maximum
  // moved was 2-3% slower (docs/BENCHMARKS.md#why-a-split-pass-and-a-merge-pass).
#pragma unroll
  for (int nr = 0; nr < NR; ++nr)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float drop[VG];  // the last tile's bias, rescaled
#pragma unroll
      for (int g = 0; g < VG; ++g) drop[g] = kGrid ? -kGridBias * alpha[nr][e & 1] * p_tile[g][nr][e] : 0.0f;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) o[mt][nr][e] = fmaf(o[mt][nr][e], alpha[nr][e & 1], drop[mt / (VCNT / 2)]);
#pragma unroll
      for (int g = 0; g < VG; ++g) p_tile[g][nr][e] = 0.0f;
    }
}

// Stage "accumulate": O^T += V^T P^T per half h of a staged tile (vt_s); the tile's probabilities
// exp2(s - m_use) join the rows' sums l_run. The probabilities times their tokens' value norms,
// fp16, are two 8x8 blocks (tokens x rows) per row tile: transposed, they are the B fragment (rows
// x tokens). This thread decodes tokens 16h + 2tig, 2tig+1, 2tig+8, 2tig+9 (its A columns), run g4
// of each group, two tokens at a time (decode_token_pairs gives the A fragments' token pairs); m
// tile i of the group takes run slots 2i (A row g4) and 2i + 1 (A row g4 + 8). With kGrid, p_tile
// gathers each group's sum of the fp16 weights the mma used (an A of ones; see the kernel).
template <int D, int VG, int MAXB, int NR, bool kGrid, int MT, int VCNT>
__device__ __forceinline__ void tile_values(float (&o)[MT][NR][4], float (&p_tile)[VG][NR][4], float (&l_run)[NR][2],
                                            const float (&s)[2][NR][4], const float (&m_use)[NR][2],
                                            const uint8_t* vt_s, const PageShape& vt, const ByteTables* tables,
                                            bool full, const int (&valid)[2], int g4, int tig) {
  const uint32_t ones[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float p[NR][4];
#pragma unroll
    for (int nr = 0; nr < NR; ++nr)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[nr][e] = fast_exp2(s[h][nr][e] - m_use[nr][e & 1]);
        l_run[nr][e & 1] += p[nr][e];
      }
#pragma unroll
    for (int g = 0; g < VG; ++g) {
      float nv[2];
#pragma unroll
      for (int t = 0; t < 2; ++t)  // unstaged slots may hold anything, even NaN: zero their norms
        nv[t] = full || g4 + 8 * t < valid[h] ? tile_norm(vt_s, vt, g, kTile * h + g4 + 8 * t) : 0.0f;
      uint32_t pb[NR][2];
#pragma unroll
      for (int nr = 0; nr < NR; ++nr) {
        pb[nr][0] = transpose_8x8(pack_float2(p[nr][0] * nv[0], p[nr][1] * nv[0]));
        pb[nr][1] = transpose_8x8(pack_float2(p[nr][2] * nv[1], p[nr][3] * nv[1]));
      }
      with_bits<MAXB>(vt.group[g].bits, [&](auto bits) {
        constexpr int BITS = decltype(bits)::value;
        const CodeTables<BITS> table = code_tables<BITS>(tables, 2 + g);
        uint32_t vp[2][VCNT];  // tokens (2tig, 2tig+1) and (2tig+8, 2tig+9), slot by slot
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          CodeRun<BITS, VCNT> ra, rb;
          ra.load(vt_s, vt.group[g], kTile * h + 2 * tig + 8 * t, g4);
          rb.load(vt_s, vt.group[g], kTile * h + 2 * tig + 8 * t + 1, g4);
          decode_token_pairs<kGrid>(ra, rb, table, vp[t]);
        }
#pragma unroll
        for (int i = 0; i < VCNT / 2; ++i) {
          const uint32_t af[4] = {vp[0][2 * i], vp[0][2 * i + 1], vp[1][2 * i], vp[1][2 * i + 1]};
#pragma unroll
          for (int nr = 0; nr < NR; ++nr)
            mma_16816(o[g * (VCNT / 2) + i][nr], af, pb[nr][0], pb[nr][1]);
        }
      });
      // after the decode, which hides the transposes' latency
#pragma unroll
      for (int nr = 0; kGrid && nr < NR; ++nr) mma_16816(p_tile[g][nr], ones, pb[nr][0], pb[nr][1]);
    }
  }
}

// The epilogue: combines the warps' states (the loop's shared memory becomes the combine buffer)
// and writes this split's partial state of the CTA's rows to the workspace.
template <int D, int VG, int NR, int W, bool kGrid, int MT, int VCNT>
__device__ __forceinline__ void write_split_state(const AttnArgs& a, uint8_t* smem, const SmemPlan& plan,
                                                  const PageShape& vt, const float (&o)[MT][NR][4],
                                                  const float (&p_tile)[VG][NR][4], const float (&m_run)[NR][2],
                                                  float (&l_run)[NR][2], int b, int kvh, int row0, int split,
                                                  int warp, int g4, int tig) {
#pragma unroll
  for (int nr = 0; nr < NR; ++nr)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      l_run[nr][j] += __shfl_xor_sync(0xffffffffu, l_run[nr][j], 4);
      l_run[nr][j] += __shfl_xor_sync(0xffffffffu, l_run[nr][j], 8);
      l_run[nr][j] += __shfl_xor_sync(0xffffffffu, l_run[nr][j], 16);
    }
  __syncthreads();  // the loop's shared memory becomes the combine buffer
  float* o_s = reinterpret_cast<float*>(smem + plan.combine);   // [warp][row] of rotated dims (combine_at)
  float2* ml_s = reinterpret_cast<float2*>(o_s + W * kRows * combine_ld(D));
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int g = mt / (VCNT / 2), i = mt % (VCNT / 2);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int dim = g * (D / VG) + g4 * VCNT + run_slot_coord(vt.group[g].bits, VCNT, 2 * i + (e >> 1));
#pragma unroll
      for (int nr = 0; nr < NR; ++nr)
        o_s[combine_at(D, warp * kRows + 8 * nr + 2 * tig + (e & 1), dim)] =
            (kGrid ? o[mt][nr][e] - kGridBias * p_tile[g][nr][e] : o[mt][nr][e]) * a.cache.codec[1].grid_step[g];
    }
  }
  if (g4 == 0) {
#pragma unroll
    for (int nr = 0; nr < NR; ++nr)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        ml_s[warp * kRows + 8 * nr + 2 * tig + j] = make_float2(m_run[nr][j], l_run[nr][j]);
  }
  __syncthreads();
  const int rows_here = min(8 * NR, a.rows - row0);  // not the padding rows
  for (int i = threadIdx.x; i < rows_here * D; i += 32 * W) {
    const int row = i / D, dim = i % D;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) m_all = fmaxf(m_all, ml_s[w * kRows + row].x);
    float acc = 0.0f, l_all = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float2 ml = ml_s[w * kRows + row];
      const float wgt = ml.x == -INFINITY ? 0.0f : fast_exp2(ml.x - m_all);  // ml.x <= m_all
      acc += wgt * o_s[combine_at(D, w * kRows + row, dim)];
      l_all += wgt * ml.y;
    }
    const int64_t slot = ws_slot(a, b, kvh, row0 + row, split);
    a.ws_o[slot * D + dim] = acc;
    if (dim == 0) a.ws_ml[slot] = make_float2(m_all, l_all);
  }
}

// KG, VG: groups of the key and value codecs; KB, VB: their group-0 bits, or 0 for any width of at
// most MAXB bits. NR: query-row n tiles (8 rows each) of the transposed products; W: warps.
// ENCODES: the kernel of calls whose split pass writes the fused append's rows
// (split_pass_encodes); the others run one without that code, which made calls without an append
// up to 11% slower (docs/BENCHMARKS.md#the-fused-append).
template <int D, int KG, int VG, int KB, int VB, int MAXB, int NR, int W, typename T, bool ENCODES>
__global__ void __launch_bounds__(32 * W, ctas_per_sm(NR, W)) attention_split_kernel(AttnArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int g4 = lane >> 2, tig = lane & 3;
  // Kernels of one row tile look the codes up in grid tables (layout.h): the keys as signed 8-bit
  // levels for the 8-bit mma (one byte permute per 4 codes), the values as fp16 kGridBias + i
  // (three per 4 codes instead of four). Those of two row tiles look up the grid indices in fp16
  // (four per 4 codes), which need no per-row sums: the sums' registers would make them spill.
  constexpr bool kGrid = NR == 1;
  // The grid (launch_split_pass): (split, KV head, z = b row_tiles + rt), or with append CTAs one
  // dimension, CTA i = split + splits (kvh + heads z), then from append_cta0 on one per sequence
  // and KV head (q_len 1: z = b).
  int split = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
  // The merge pass (a programmatic dependent launch) may start now or after the tile loop.
  if (a.merge_at_start) asm volatile("griddepcontrol.launch_dependents;");
  // Append CTAs exist only where the split pass encodes (split_pass_encodes): the other kernels
  // leave their grid decoding and early exit out (calls 1.3-2.2% faster;
  // docs/BENCHMARKS.md#the-fused-append).
  const bool append_cta = ENCODES && int(blockIdx.x) >= a.append_cta0;
  if (ENCODES && a.append_cta0 != kNoAppendCtas) {
    const int heads = a.cache.num_kv_heads;
    const int i = append_cta ? blockIdx.x - a.append_cta0 : blockIdx.x / a.num_splits;
    split = append_cta ? 0 : blockIdx.x % a.num_splits;
    kvh = i % heads;
    z = i / heads;
  }
  const int b = quotient(z, a.row_tiles), rt = z - b * a.row_tiles.d;
  const PageShape kt = tile_shape<D, KG, KB>(a.chunk[0]);
  const PageShape vt = tile_shape<D, VG, VB>(a.chunk[1]);
  const CodecLayout& kc = a.cache.codec[0];
  const SmemPlan plan = smem_plan(D, W, kt, vt, kc.rotary_pairs > 0);
  __half* q_s = reinterpret_cast<__half*>(smem + plan.q_half);
  ByteTables* tables = reinterpret_cast<ByteTables*>(smem + plan.tables);  // code_tables(kv * 2 + group)

  const int row0 = rt * kRows;
  const CtaKeys keys = cta_keys(a, b, split, row0, kRows);
  const int L = keys.len, split_begin = keys.begin, split_end = keys.end;

  // --- The fused append (AttnArgs::append). The call's positions are no split's to read
  // (the chunk term takes them, cache_end): a one-token step's is encoded in CTAs of its own
  // (AttnArgs::append_cta0), a longer step's by the splits that hold them; every row tile's CTA of
  // the split writes the same bytes. ---
  if constexpr (ENCODES) {
    if (a.append && (append_cta || a.q_len > 1))
      encode_new_rows<D, W, T>(a, b, kvh, L, append_cta ? L - 1 : split_begin,
                               append_cta ? L : split_begin + a.split_tokens);
  }
  if (append_cta) return;
  // Chunk indices and page slot of this warp's tiles i .. i + 31, one per lane, from the block table
  // in one go (the divisions by T happen here, once per 32 tiles). A tile that crosses a block
  // boundary (T not a multiple of kChunk) does so at its half: its second half is slots 0..15 of
  // the next block (chunk indices window_k2, window_v2). The first window is read before the
  // prologue, which hides its latency (at short contexts the first tiles waited on it). The
  // entries are read before the split's end is known (the sequence length is still in flight
  // then; chunk_of keeps every read inside the table) and dropped past it afterwards.
  const int page_tokens = a.cache.tokens;
  int window_k, window_v, window_k2, window_v2, window_slot;
  auto load_window = [&](int i) {
    const int pos = split_begin + (warp + (i + lane) * W) * kChunk;
    const int block = pos / page_tokens;
    window_slot = pos - block * page_tokens;
    const bool crosses = window_slot + kChunk > page_tokens;
    const int k = chunk_of(a.cache, b, 0, block), v = chunk_of(a.cache, b, 1, block);
    const int k2 = crosses ? chunk_of(a.cache, b, 0, block + 1) : -1;
    const int v2 = crosses ? chunk_of(a.cache, b, 1, block + 1) : -1;
    const bool in_split = pos < split_end, cross = crosses && pos + kTile < split_end;
    window_k = in_split ? k : -1;
    window_v = in_split ? v : -1;
    window_k2 = cross ? k2 : -1;
    window_v2 = cross ? v2 : -1;
  };
  load_window(0);
  // --- The rotated query rows, fp16 into shared memory; the codebook tables; the rotary mean's
  // state. Every global read of the prologue is issued before the first use of any: the codec's
  // per-lane and per-pair arrays, then every query value, so that the prologue waits on two
  // dependent reads, not on a chain of them per row (at short contexts it sets the call's time). ---
  constexpr int E = D / 32, kWarpRows = 8 * NR / W;  // query rows per warp: warp + W k
  const LaneRotation<D> lr = lane_rotation<D>(kc, kvh);
  // The rotary mean's logit term (attention_common.cuh): over the tokens j of a tile that starts at
  // position p0, sum_i Re(w_i e^{i j f_i}) with w_i = z_i e^{i p0 f_i}: A = the cos | sin table of
  // the angles j f_i, the same for every tile, B = (Re w, -Im w) of each row. Both in hi + lo fp16
  // (three products): about 22 bits, so the term adds no error of its own. This thread's w: row
  // 8nr + g4 of each row tile, pairs 8s + 2tig + u (its B fragment's k columns), at the warp's
  // first tile, turned by the warp's stride after each tile. It also fills the table's column of
  // pair threadIdx.x % TQ_MAX_ROTARY_PAIRS.
  const int rot_steps = (kc.rotary_pairs + 7) / 8;  // mma k steps, 8 pairs each
  RotaryPair pairs[2][2], table_pair{};
  if (rot_steps) {
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int u = 0; u < 2; ++u) pairs[s][u] = rotary_pair(kc, kvh, 8 * s + 2 * tig + u);
    table_pair = rotary_pair(kc, kvh, threadIdx.x % TQ_MAX_ROTARY_PAIRS);
  }
  // Two rows at a time: four (two row tiles) would cost the loop registers (spills).
  constexpr int kBatch = kWarpRows < 2 ? kWarpRows : 2;
  float x[kBatch][E];
#pragma unroll
  for (int k = 0; k < kBatch; ++k) load_query_row<D, T>(a, b, kvh, row0 + warp + W * k, lr, x[k]);
  float2 rot_w[NR][2][2] = {};
  if (rot_steps)
#pragma unroll
    for (int nr = 0; nr < NR; ++nr) {
      const T* qv = query_row<D, T>(a, b, kvh, row0 + 8 * nr + g4);
#pragma unroll
      for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int u = 0; u < 2; ++u) rot_w[nr][s][u] = rotary_z<D, T>(pairs[s][u], qv, a.q_scale);
    }
#pragma unroll
  for (int k = 0; k < kWarpRows; ++k) {
    if (k >= kBatch && k % kBatch == 0)
#pragma unroll
      for (int l = 0; l < kBatch; ++l) load_query_row<D, T>(a, b, kvh, row0 + warp + W * (k + l), lr, x[l]);
    // Padding rows (a one-token step fills 4 of 8 at a GQA group of 4) load as zeros and stay so.
    if (row0 + warp + W * k < a.rows) rotate_query_row<D, KG>(a, lr, x[k % kBatch]);
    if constexpr (kGrid)
      store_query_bytes<D, KG>(reinterpret_cast<uint8_t*>(q_s + (warp + W * k) * (D + 8)), x[k % kBatch], kt);
    else
#pragma unroll
      for (int e = 0; e < E; ++e) q_s[(warp + W * k) * (D + 8) + lane * E + e] = __float2half_rn(x[k % kBatch][e]);
  }
  fill_byte_tables(tables, a.cache, kGrid);
  if (rot_steps)
#pragma unroll
    for (int nr = 0; nr < NR; ++nr)
#pragma unroll
      for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int u = 0; u < 2; ++u)
          rot_w[nr][s][u] = turn_by(rot_w[nr][s][u], rotary_turn(split_begin + warp * kChunk, pairs[s][u].freq));
  __syncthreads();

  // Query B fragments, held in registers for the whole loop. In k step st of group g, this
  // thread's k columns (2tig, 2tig+1, 2tig+8, 2tig+9) are the coordinates that its A-fragment
  // partners decode into run slots 4st .. 4st+3 of run tig (see decode_pairs); its n column is
  // row g4 of each row tile. With kGrid (8-bit keys) step st spans 32 k: columns 4tig .. 4tig+3
  // and 4tig+16 .. 4tig+19 are run slots 8st .. 8st+7 (decode_bytes; store_query_bytes put them
  // there), the 8-bit hi parts in qb, the lo parts in qb_lo; row_unit[j]: the unit of row 2tig + j
  // (the C columns).
  constexpr int KCNT = D / KG / 4;                // key coordinates per thread per token and group
  constexpr int KSTEPS = KCNT / (kGrid ? 8 : 4);  // mma k steps per group
  uint32_t qb[KG * KSTEPS][NR][2], qb_lo[KG * KSTEPS][2];
  float row_unit[2];
  if constexpr (kGrid) {
    const uint8_t* rows = reinterpret_cast<const uint8_t*>(q_s);
    const uint8_t* q = rows + g4 * 2 * (D + 8);
#pragma unroll
    for (int g = 0; g < KG; ++g)
#pragma unroll
      for (int st = 0; st < KSTEPS; ++st)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int at = g * (D / KG) + tig * KCNT + 8 * st + 4 * r;
          qb[g * KSTEPS + st][0][r] = *reinterpret_cast<const uint32_t*>(q + at);
          qb_lo[g * KSTEPS + st][r] = *reinterpret_cast<const uint32_t*>(q + D + at);
        }
#pragma unroll
    for (int j = 0; j < 2; ++j) row_unit[j] = *reinterpret_cast<const float*>(rows + (2 * tig + j) * 2 * (D + 8) + 2 * D);
  } else {
#pragma unroll
    for (int g = 0; g < KG; ++g)
#pragma unroll
      for (int st = 0; st < KSTEPS; ++st) {
        int c[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
          c[k] = g * (D / KG) + tig * KCNT + run_slot_coord(kt.group[g].bits, KCNT, 4 * st + k);
#pragma unroll
        for (int nr = 0; nr < NR; ++nr) {
          const __half* q = q_s + (8 * nr + g4) * (D + 8);
          qb[g * KSTEPS + st][nr][0] = pack_pair(q[c[0]], q[c[1]]);
          qb[g * KSTEPS + st][nr][1] = pack_pair(q[c[2]], q[c[3]]);
        }
      }
  }
  // Grid units to levels (both kinds of tables hold grid indices). With kGrid and one key group the
  // step folds into the rows' units: one product per row, not one per token and tile.
  constexpr bool kStepInUnit = kGrid && KG == 1;
  float key_step[KG];
#pragma unroll
  for (int g = 0; g < KG; ++g) key_step[g] = kStepInUnit ? 1.0f : kc.grid_step[g];
  if constexpr (kStepInUnit)
#pragma unroll
    for (int j = 0; j < 2; ++j) row_unit[j] *= kc.grid_step[0];

  __half* rot_e = q_s;  // the rotary tables replace the query rows, now in registers
  float2* rot_turn = reinterpret_cast<float2*>(smem + plan.q_half + kRotTableBytes);
  if (rot_steps) {
    __syncthreads();  // every warp holds its query fragments
    const int i = threadIdx.x % TQ_MAX_ROTARY_PAIRS;  // this thread's pair, the same in every row
    const float f = table_pair.freq;
    constexpr int kRowStep = 32 * W / TQ_MAX_ROTARY_PAIRS;
    for (int j = threadIdx.x / TQ_MAX_ROTARY_PAIRS; j < kChunk; j += kRowStep)
      store_turn_hi_lo(rot_e, rot_e + kChunk * kRotLd, i, small_turn(j, f), [j](int c) { return j * kRotLd + c; });
    if (threadIdx.x < TQ_MAX_ROTARY_PAIRS) rot_turn[i] = rotary_turn(W * kChunk, f);
    __syncthreads();
  }

  // Causal limits of this thread's rows 8nr + 2tig + j; tiles that end before keys.full_end skip
  // the mask.
  int limit[NR][2];
#pragma unroll
  for (int nr = 0; nr < NR; ++nr)
#pragma unroll
    for (int j = 0; j < 2; ++j) limit[nr][j] = causal_limit(a, L, row0 + 8 * nr + 2 * tig + j);

  constexpr int VCNT = D / VG / 8;  // value coordinates per thread per token and group
  constexpr int MT = D / 16;        // output m tiles: VCNT / 2 per group
  float o[MT][NR][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nr = 0; nr < NR; ++nr) o[mt][nr][0] = o[mt][nr][1] = o[mt][nr][2] = o[mt][nr][3] = 0.0f;
  // With kGrid each group's value products hold kGridBias times the sum of the fp16 weights
  // (probability x value norm) that the mma used: p_tile[g] accumulates that sum over a tile on the
  // same mma (an A of ones), and kGridBias times it leaves the accumulators with the next tile's
  // rescale (one FFMA instead of the FMUL) or after the loop. Left in over a whole split, the bias
  // made the accumulators hundreds of times larger than what they hold, and the tensor cores'
  // fp32 sums, which truncate, lost up to 2.3e-3 of the output at 1,024 tokens per warp
  // (docs/BENCHMARKS.md#correctness-and-memory-checking).
  float p_tile[VG][NR][4] = {};
  float m_run[NR][2], l_run[NR][2];
#pragma unroll
  for (int nr = 0; nr < NR; ++nr) m_run[nr][0] = m_run[nr][1] = -INFINITY, l_run[nr][0] = l_run[nr][1] = 0.0f;

  uint8_t* stage0 = smem + plan.stages + warp * kStages * plan.stage_bytes;
  const int chunks = split_end > split_begin ? (split_end - split_begin + kChunk - 1) / kChunk : 0;
  uint32_t staged = 0;  // bits 2 (i % kStages) + h: half h of tile i was staged (its pages exist)
  // Stage "stage tile": issues the copies of this warp's i-th tile (uniform over the warp).
  auto stage_tile = [&](int i) {
    if (i % 32 == 0 && i > 0) load_window(i);
    const int ck = __shfl_sync(0xffffffffu, window_k, i % 32);
    const int cv = __shfl_sync(0xffffffffu, window_v, i % 32);
    const int slot0 = __shfl_sync(0xffffffffu, window_slot, i % 32);
    const bool live = warp + i * W < chunks;
    const bool ok = live && ck >= 0 && cv >= 0;
    uint8_t* st = stage0 + (i % kStages) * plan.stage_bytes;
    // K and V rows [row0, row0 + rows) of the tile from page slot `slot` of chunks kc, vc
    auto stage_kv = [&](int kc, int vc, int slot, int row0, int rows) {
      stage_rows<kChunk>(st, page_in_chunk(a.cache, 0, kc, kvh), kt, page_tokens, slot, row0, rows);
      stage_rows<kChunk>(st + kt.page_bytes, page_in_chunk(a.cache, 1, vc, kvh), vt, page_tokens, slot, row0, rows);
    };
    uint32_t got;
    if (slot0 + kChunk <= page_tokens) {  // one page: both halves in one copy
      got = ok ? 3u : 0u;
      if (ok) stage_kv(ck, cv, slot0, 0, kChunk);
    } else {
      const int ck2 = __shfl_sync(0xffffffffu, window_k2, i % 32);
      const int cv2 = __shfl_sync(0xffffffffu, window_v2, i % 32);
      const bool ok2 = live && ck2 >= 0 && cv2 >= 0;
      got = uint32_t(ok) | uint32_t(ok2) << 1;
      if (ok) stage_kv(ck, cv, slot0, 0, kTile);
      if (ok2) stage_kv(ck2, cv2, 0, kTile, kTile);
    }
    staged = (staged & ~(3u << (2 * (i % kStages)))) | got << (2 * (i % kStages));
  };

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    stage_tile(i);
    cp_async_commit();
  }
  for (int it = 0; warp + it * W < chunks; ++it) {
    stage_tile(it + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const int pos0 = split_begin + (warp + it * W) * kChunk;
    const uint32_t halves = (staged >> (2 * (it % kStages))) & 3u;
    int valid[2];  // tokens of each half to use: staged and inside the split
#pragma unroll
    for (int h = 0; h < 2; ++h) valid[h] = (halves >> h) & 1u ? min(kTile, split_end - pos0 - kTile * h) : 0;
    const bool full = halves == 3u && pos0 + kChunk <= keys.full_end;  // no token masked (warp-uniform)
    const uint8_t* kt_s = stage0 + (it % kStages) * plan.stage_bytes;
    const uint8_t* vt_s = kt_s + kt.page_bytes;

    float s[2][NR][4] = {};
    tile_scores<D, KG, MAXB, NR, kGrid, KCNT, KSTEPS>(s, kt_s, kt, tables, qb, qb_lo, key_step, row_unit, g4, tig);
    if (rot_steps)  // the rotary mean's term, then w turned to the warp's next tile
      tile_rotary_scores<NR>(s, rot_w, rot_steps, rot_e, rot_turn, lane, tig);
    float m_use[NR][2];
    tile_softmax<VG, NR, kGrid, MT, VCNT>(s, m_use, m_run, l_run, o, p_tile, full, valid, pos0, limit, g4);

    tile_values<D, VG, MAXB, NR, kGrid, MT, VCNT>(o, p_tile, l_run, s, m_use, vt_s, vt, tables, full, valid, g4, tig);
    __syncwarp();
  }
  cp_async_wait<0>();
  if (!a.merge_at_start) asm volatile("griddepcontrol.launch_dependents;");

  // --- Epilogue: combine the warps' states, write this split's partial state. ---
  write_split_state<D, VG, NR, W, kGrid, MT, VCNT>(a, smem, plan, vt, o, p_tile, m_run, l_run, b, kvh, row0, split,
                                                   warp, g4, tig);
}

}  // namespace
}  // namespace tq
