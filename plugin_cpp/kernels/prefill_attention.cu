// prefill_attention.cu: the attention pass of tq_prefill_attention for long chunks (more than
// kPrefillMinRows query rows per KV head). The split pass decodes every tile once per 16 query
// rows, so a 2,048-token chunk decoded the whole history 512 times; here a CTA of 8 warps serves
// kPrefillRows = 256 rows (32 per warp, two mma m tiles) and decodes each 128-token step once, into
// shared memory as fp16 centroids (the byte-permute tables of tile_decode.cuh) with the tokens'
// gains beside them in fp32, after which it is flash attention on tensor cores: query, K and V
// fragments come from shared memory by ldmatrix (each K and V fragment feeds both m tiles), with
// an online softmax in base 2 over 32-token sub-steps. As in the split pass, gains multiply the
// scores (keys) and the probabilities (values) per group, so the only fp16 roundings are the
// centroids' and the scaled probabilities' (gains folded into fp16 centroids would round once
// more: measured 2.3e-3 error against the 2e-3 bound). Measured on the H200 (docs/BENCHMARKS.md),
// 128-row CTAs (16 rows per warp) were 1.2x slower, 64-row CTAs (2 or 3 per SM) 1.4-1.7x slower,
// 64-token steps 1.05x slower. Tiles are staged (cp.async) one step ahead: warp w copies and then
// decodes 16-token tiles w of the keys and of the values.
//
// Decoded coordinates are stored in run order: a run is 32 consecutive group coordinates that
// decode_pairs emits in run_slot_coord order, so stored position p holds coordinate
// run_coord(p). The query is stored in the same order and the output scattered back by it.
// Each split writes the partial state the merge pass (attention.cu) finishes, as the split pass does.
#include "attention_common.cuh"
#include "errors.h"

namespace tq {
namespace {

constexpr int kPfTokens = 128;               // tokens per step: 8 staged tiles of K, 8 of V
constexpr int kPfTiles = kPfTokens / kTile;  // staged tiles per step, of K and of V
constexpr int kSub = 32;                     // tokens per softmax sub-step
constexpr int kMTiles = 2;                   // mma m tiles (16 query rows) per warp
constexpr int kWarpRows = 16 * kMTiles;
constexpr int kRun = 32;                     // codes per decode run
constexpr int kPad = 8;                      // fp16 row padding: ldmatrix rows on distinct banks
static_assert(kWarpRows * kPrefillWarps == kPrefillRows && 2 * kPfTiles % kPrefillWarps == 0);

struct PrefillSmem {
  int q, kv, gains, tables, flags, rot, stage, stage_bytes, total;
};

// The query rows [kPrefillRows][D + kPad] fp16, the K and V tiles [kPfTokens][D + kPad] fp16 and
// their gains [K or V][group][kPfTokens] fp32, the tables, the staged flags, with a rotary mean its
// (Re z, -Im z) rows [kPrefillRows][kRotLd] and the step's cos | sin rows, hi and lo (the rounding
// remainder), [2][kPfTokens][kRotLd] fp16, and two steps of packed tiles.
template <int D>
__host__ __device__ inline PrefillSmem prefill_smem(const PageShape& kt, const PageShape& vt,
                                                    bool rotary) {
  PrefillSmem p{};
  p.q = 0;
  p.kv = kPrefillRows * (D + kPad) * 2;
  p.gains = p.kv + 2 * kPfTokens * (D + kPad) * 2;
  p.tables = p.gains + 2 * TQ_MAX_GROUPS * kPfTokens * 4;
  p.flags = p.tables + kByteTablesBytes;
  p.rot = p.flags + 2 * 2 * kPfTiles * 4;
  p.stage = p.rot + (rotary ? (kPrefillRows + 2 * kPfTokens) * kRotLd * 2 : 0);
  p.stage_bytes = kPfTiles * (kt.page_bytes + vt.page_bytes);
  p.total = p.stage + 2 * p.stage_bytes;
  return p;
}

// The group coordinate stored at position p of a decoded row (see the file comment), and the
// position of coordinate c.
__device__ inline int run_coord(const PageShape& s, int p) {
  const int c0 = p & ~(kRun - 1);
  const int g = s.num_groups == 2 && c0 >= s.group[1].start ? 1 : 0;
  return c0 + run_slot_coord(s.group[g].bits, kRun, p & (kRun - 1));
}
__device__ inline int run_position(const PageShape& s, int c) {
  const int c0 = c & ~(kRun - 1);
  const int g = s.num_groups == 2 && c0 >= s.group[1].start ? 1 : 0;
  return c0 + run_coord_slot(s.group[g].bits, kRun, c & (kRun - 1));
}

// KG, VG: groups of the key and value codecs; MAXB: the widest code the kernel decodes.
template <int D, int KG, int VG, int MAXB, typename T>
__global__ void __launch_bounds__(32 * kPrefillWarps, kPrefillCtasPerSm) prefill_kernel(AttnArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int LD = D + kPad;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int g4 = lane >> 2, tig = lane & 3;
  const int split = blockIdx.x, kvh = blockIdx.y;
  const int cta_tiles = (a.rows + kPrefillRows - 1) / kPrefillRows;
  const int b = blockIdx.z / cta_tiles, row0 = blockIdx.z % cta_tiles * kPrefillRows;
  const PageShape& kt = a.tile[0];
  const PageShape& vt = a.tile[1];
  const int rot_steps = (a.cache.codec[0].rotary_pairs + 7) / 8;  // extra mma k steps, 8 pairs each
  const PrefillSmem plan = prefill_smem<D>(kt, vt, rot_steps > 0);
  __half* q_s = reinterpret_cast<__half*>(smem + plan.q);
  __half* k_s = reinterpret_cast<__half*>(smem + plan.kv);
  __half* v_s = k_s + kPfTokens * LD;
  float* gains = reinterpret_cast<float*>(smem + plan.gains);  // [kind][group][token]
  ByteTables* tables = reinterpret_cast<ByteTables*>(smem + plan.tables);
  int* staged_s = reinterpret_cast<int*>(smem + plan.flags);  // [step % 2][tile]: staged
  __half* rot_q = reinterpret_cast<__half*>(smem + plan.rot);  // the rotary mean's rows
  __half* rot_k = rot_q + kPrefillRows * kRotLd;  // hi, then lo at + kPfTokens * kRotLd

  const CtaKeys keys = cta_keys(a, b, split, row0, kPrefillRows);
  const int split_begin = keys.begin, split_end = keys.end;

  // --- Prologue: the rotated query rows, in run order, in shared memory; the tables. ---
  const LaneRotation<D> lr = lane_rotation<D>(a.cache.codec[0], kvh);  // the same for every row
  for (int rr = warp; rr < kPrefillRows; rr += kPrefillWarps) {
    constexpr int E = D / 32;
    float x[E];
    load_query_row<D, T>(a, b, kvh, row0 + rr, lr, x);
    rotate_query_row<D>(a, lr, x);
#pragma unroll
    for (int e = 0; e < E; ++e) q_s[rr * LD + run_position(kt, lane * E + e)] = __float2half_rn(x[e]);
  }
  if (rot_steps)  // the rotary mean's (Re z, -Im z) row of each query row (attention_common.cuh)
    for (int idx = threadIdx.x; idx < kPrefillRows * TQ_MAX_ROTARY_PAIRS; idx += 32 * kPrefillWarps) {
      const int rr = idx / TQ_MAX_ROTARY_PAIRS, i = idx % TQ_MAX_ROTARY_PAIRS;
      const float2 z = rotary_z<D, T>(rotary_pair(a.cache.codec[0], kvh, i),
                                      query_row<D, T>(a, b, kvh, row0 + rr), a.q_scale);
      rot_q[rr * kRotLd + rot_col(i)] = __float2half_rn(z.x);
      rot_q[rr * kRotLd + rot_col(i) + 8] = __float2half_rn(-z.y);
    }
  fill_byte_tables(tables, a.cache);
  __syncthreads();  // the first decode reads the tables (the query rows wait for the loop's barrier)

  // This thread's rows: m tile mt, half h (C-fragment row g4 + 8h), and their causal limits.
  const int wrow0 = warp * kWarpRows;
  int limit[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) limit[mt][h] = causal_limit(a, keys.len, row0 + wrow0 + 16 * mt + g4 + 8 * h);
  const int full_end = keys.full_end;

  // Staged tile j of a step holds 16 tokens of the keys (j < kPfTiles) or the values; warp w copies
  // and decodes tiles w, w + kPrefillWarps, ...
  const int steps = split_end > split_begin ? (split_end - split_begin + kPfTokens - 1) / kPfTokens : 0;
  auto tile_of = [&](int i, int j) {
    const int off = j < kPfTiles ? j * kt.page_bytes : kPfTiles * kt.page_bytes + (j - kPfTiles) * vt.page_bytes;
    return smem + plan.stage + (i % 2) * plan.stage_bytes + off;
  };
  auto stage = [&](int i) {
    for (int j = warp; j < 2 * kPfTiles; j += kPrefillWarps) {
      const int kind = j / kPfTiles;
      const int pos = split_begin + i * kPfTokens + j % kPfTiles * kTile;
      const int block = pos / a.cache.tokens;
      const int chunk = pos < split_end ? chunk_of(a.cache, b, kind, block) : -1;
      if (lane == 0) staged_s[(i % 2) * 2 * kPfTiles + j] = chunk >= 0;
      if (chunk >= 0)
        stage_rows<kTile>(tile_of(i, j), page_in_chunk(a.cache, kind, chunk, kvh), kind ? vt : kt,
                          a.cache.tokens, pos - block * a.cache.tokens, 0, kTile);
    }
  };
  // Decodes this warp's staged tiles into their 16 rows of k_s or v_s and their gains; tokens past
  // the split or not staged get gain 0 (their bytes may be anything, even NaN gains).
  auto decode = [&](int i) {
    for (int j = warp; j < 2 * kPfTiles; j += kPrefillWarps) {
      const int kind = j / kPfTiles, part = j % kPfTiles;
      const PageShape& shape = kind ? vt : kt;
      const uint8_t* tile = tile_of(i, j);
      __half* dst = (kind ? v_s : k_s) + part * kTile * LD;
      const int pos = split_begin + i * kPfTokens + part * kTile;
      const int valid = staged_s[(i % 2) * 2 * kPfTiles + j] ? min(kTile, split_end - pos) : 0;
      for (int r = lane; r < kTile * D / kRun; r += 32) {
        const int token = r % kTile, c0 = r / kTile * kRun;
        const int g = shape.num_groups == 2 && c0 >= shape.group[1].start ? 1 : 0;
        if (c0 == shape.group[g].start)
          gains[(kind * TQ_MAX_GROUPS + g) * kPfTokens + part * kTile + token] =
              token < valid ? tile_norm(tile, shape, g, token) : 0.0f;
        uint32_t pairs[kRun / 2];
        with_bits<MAXB>(shape.group[g].bits, [&](auto bits) {
          CodeRun<decltype(bits)::value, kRun> run;
          run.load(tile, shape.group[g], token, (c0 - shape.group[g].start) / kRun);
          decode_pairs(run, code_tables<decltype(bits)::value>(tables, kind * 2 + g), pairs);
        });
        uint4* out = reinterpret_cast<uint4*>(dst + token * LD + c0);
#pragma unroll
        for (int q = 0; q < kRun / 8; ++q)
          out[q] = make_uint4(pairs[4 * q], pairs[4 * q + 1], pairs[4 * q + 2], pairs[4 * q + 3]);
      }
    }
  };

  float o[kMTiles][D / 8][4] = {};
  float m_run[kMTiles][2], l_run[kMTiles][2] = {};
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) m_run[mt][0] = m_run[mt][1] = -INFINITY;
  const int lm = lane / 8;  // the ldmatrix matrix this lane addresses a row of
  if (steps > 0) stage(0);
  cp_async_commit();
  for (int i = 0; i < steps; ++i) {
    if (i + 1 < steps) stage(i + 1);  // its buffer was decoded in step i - 1, before a barrier
    cp_async_commit();
    cp_async_wait<1>();
    __syncwarp();  // the warp decodes the tiles it copied itself
    decode(i);
    if (rot_steps) {  // the cos | sin row of each of the step's positions: the step's first
      // position turned exactly, then by each token's small offset (a thread keeps its pair)
      static_assert(32 * kPrefillWarps % TQ_MAX_ROTARY_PAIRS == 0);
      const int p = threadIdx.x % TQ_MAX_ROTARY_PAIRS;
      const float f = rotary_pair(a.cache.codec[0], kvh, p).freq;
      const float2 base = rotary_turn(split_begin + i * kPfTokens, f);
      for (int t = threadIdx.x / TQ_MAX_ROTARY_PAIRS; t < kPfTokens; t += 32 * kPrefillWarps / TQ_MAX_ROTARY_PAIRS) {
        store_turn_hi_lo(rot_k + t * kRotLd, rot_k + (kPfTokens + t) * kRotLd, p, turn_by(base, small_turn(t, f)));
      }
    }
    __syncthreads();  // every K and V row of the step is decoded (and, first, every query row)
    const int* staged = staged_s + (i % 2) * 2 * kPfTiles;
#pragma unroll 1
    for (int sub = 0; sub < kPfTokens / kSub; ++sub) {
      const int tok0 = sub * kSub;  // the sub-step's first token in the step
      const int pos0 = split_begin + i * kPfTokens + tok0;
      // S = Q K^T, n tile t = tokens tok0 + 8t .. +7; per key group, times the tokens' gains.
      float s[kMTiles][kSub / 8][4];
#pragma unroll
      for (int g = 0; g < KG; ++g) {
        float sg[kMTiles][kSub / 8][4] = {};
#pragma unroll
        for (int ks = g * D / 16 / KG; ks < (g + 1) * D / 16 / KG; ++ks) {
          uint32_t qf[kMTiles][4];  // A: lanes 8m .. 8m+7 give rows 8 (m % 2) .., columns 8 (m / 2) ..
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
            ldmatrix_x4(qf[mt], q_s + (wrow0 + 16 * mt + 8 * (lm & 1) + lane % 8) * LD + 16 * ks + 8 * (lm >> 1));
#pragma unroll
          for (int np = 0; np < kSub / 16; ++np) {
            uint32_t kb[4];  // B: n tile 2np + m / 2, k half m % 2
            ldmatrix_x4(kb, k_s + (tok0 + 16 * np + 8 * (lm >> 1) + lane % 8) * LD + 16 * ks + 8 * (lm & 1));
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
              mma_16816(sg[mt][2 * np], qf[mt], kb[0], kb[1]);
              mma_16816(sg[mt][2 * np + 1], qf[mt], kb[2], kb[3]);
            }
          }
        }
#pragma unroll
        for (int t = 0; t < kSub / 8; ++t) {
          const float2 gn = *reinterpret_cast<const float2*>(gains + g * kPfTokens + tok0 + 8 * t + 2 * tig);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              s[mt][t][e] = (g ? s[mt][t][e] : 0.0f) + sg[mt][t][e] * (e & 1 ? gn.y : gn.x);
        }
      }
      // The rotary mean's term: (Re z, -Im z) rows times the tokens' cos | sin rows (hi + lo: the
      // rows' fp16 is the query's own precision), no gains.
      for (int ks = 0; ks < rot_steps; ++ks) {
        uint32_t qf[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
          ldmatrix_x4(qf[mt], rot_q + (wrow0 + 16 * mt + 8 * (lm & 1) + lane % 8) * kRotLd + 16 * ks + 8 * (lm >> 1));
#pragma unroll
        for (int np = 0; np < kSub / 16; ++np)
#pragma unroll
          for (int part = 0; part < 2; ++part) {
            uint32_t kb[4];
            ldmatrix_x4(kb, rot_k + (part * kPfTokens + tok0 + 16 * np + 8 * (lm >> 1) + lane % 8) * kRotLd +
                                16 * ks + 8 * (lm & 1));
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
              mma_16816(s[mt][2 * np], qf[mt], kb[0], kb[1]);
              mma_16816(s[mt][2 * np + 1], qf[mt], kb[2], kb[3]);
            }
          }
      }
      if (pos0 + kSub > full_end) {  // some token may be masked
#pragma unroll
        for (int t = 0; t < kSub / 8; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int tok = tok0 + 8 * t + 2 * tig + (e & 1), pos = pos0 - tok0 + tok;
            const bool seen = pos < split_end && staged[tok / kTile] && staged[kPfTiles + tok / kTile];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
              if (!seen || pos > limit[mt][e >> 1]) s[mt][t][e] = -INFINITY;
          }
      }
      // Online softmax per row: a row's scores lie across the 4 lanes of its g4.
      float m_use[kMTiles][2];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = -INFINITY;
#pragma unroll
          for (int t = 0; t < kSub / 8; ++t) mx = fmaxf(mx, fmaxf(s[mt][t][2 * h], s[mt][t][2 * h + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m_run[mt][h], mx);
          m_use[mt][h] = m_new == -INFINITY ? 0.0f : m_new;
          const float alpha = fast_exp2(m_run[mt][h] - m_use[mt][h]);
          m_run[mt][h] = m_new;
          l_run[mt][h] *= alpha;
#pragma unroll
          for (int n = 0; n < D / 8; ++n) o[mt][n][2 * h] *= alpha, o[mt][n][2 * h + 1] *= alpha;
        }
      // O += P V, 16 tokens per k step: P's C fragments, times the value gains of each group, are
      // the A fragments (fp16); V's B fragments come transposed from v_s (dims 8n .. of n tile n).
#pragma unroll
      for (int kk = 0; kk < kSub / 16; ++kk) {
        float p[kMTiles][2][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              p[mt][t][e] = fast_exp2(s[mt][2 * kk + t][e] - m_use[mt][e >> 1]);
              l_run[mt][e >> 1] += p[mt][t][e];
            }
#pragma unroll
        for (int g = 0; g < VG; ++g) {
          const float* vg = gains + (TQ_MAX_GROUPS + g) * kPfTokens + tok0 + 16 * kk + 2 * tig;
          const float2 g0 = *reinterpret_cast<const float2*>(vg);
          const float2 g1 = *reinterpret_cast<const float2*>(vg + 8);
          uint32_t pa[kMTiles][4];
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            pa[mt][0] = pack_float2(p[mt][0][0] * g0.x, p[mt][0][1] * g0.y);
            pa[mt][1] = pack_float2(p[mt][0][2] * g0.x, p[mt][0][3] * g0.y);
            pa[mt][2] = pack_float2(p[mt][1][0] * g1.x, p[mt][1][1] * g1.y);
            pa[mt][3] = pack_float2(p[mt][1][2] * g1.x, p[mt][1][3] * g1.y);
          }
#pragma unroll
          for (int dp = g * D / 16 / VG; dp < (g + 1) * D / 16 / VG; ++dp) {
            uint32_t vb[4];  // B: k half m % 2, n tile 2dp + m / 2
            ldmatrix_x4_trans(vb, v_s + (tok0 + 16 * kk + 8 * (lm & 1) + lane % 8) * LD + 8 * (2 * dp + (lm >> 1)));
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
              mma_16816(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
              mma_16816(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
            }
          }
        }
      }
    }
    __syncthreads();  // the next step's decode overwrites k_s and v_s
  }
  cp_async_wait<0>();
  asm volatile("griddepcontrol.launch_dependents;");

  // --- Epilogue: this split's partial state of each of the warp's rows. ---
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = row0 + wrow0 + 16 * mt + g4 + 8 * h;
      if (r >= a.rows) continue;
      const int64_t slot = ws_slot(a, b, kvh, r, split);
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          a.ws_o[slot * D + run_coord(vt, 8 * n + 2 * tig + e)] = o[mt][n][2 * h + e];
      if (tig == 0) a.ws_ml[slot] = make_float2(m_run[mt][h], l);
    }
}

}  // namespace

// The prefill kernel for these codecs' group counts, decoding codes of up to MAXB bits (a kernel
// without the 5-bit path keeps its registers for the others).
template <int D, int MAXB, typename T>
void (*prefill_kernel_for(bool k1, bool v1))(AttnArgs) {
  return k1 ? (v1 ? prefill_kernel<D, 1, 1, MAXB, T> : prefill_kernel<D, 1, 2, MAXB, T>)
            : (v1 ? prefill_kernel<D, 2, 1, MAXB, T> : prefill_kernel<D, 2, 2, MAXB, T>);
}

template <int D, typename T>
tq_status launch_prefill_pass(const AttnArgs& a, dim3 grid, cudaStream_t stream) {
  const int bytes = prefill_smem<D>(a.tile[0], a.tile[1], a.cache.codec[0].rotary_pairs > 0).total;
  const bool k1 = a.cache.codec[0].num_groups == 1, v1 = a.cache.codec[1].num_groups == 1;
  auto kernel = has_5bit_codes(a.cache) ? prefill_kernel_for<D, 5, T>(k1, v1) : prefill_kernel_for<D, 4, T>(k1, v1);
  if (bytes > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
    return fail(TQ_ERR_CUDA, "attention (prefill pass): cannot raise the shared memory limit to %d "
                "bytes", bytes);
  kernel<<<grid, 32 * kPrefillWarps, bytes, stream>>>(a);
  return check_launch("attention (prefill pass)");
}

template tq_status launch_prefill_pass<64, __half>(const AttnArgs&, dim3, cudaStream_t);
template tq_status launch_prefill_pass<128, __half>(const AttnArgs&, dim3, cudaStream_t);
template tq_status launch_prefill_pass<64, __nv_bfloat16>(const AttnArgs&, dim3, cudaStream_t);
template tq_status launch_prefill_pass<128, __nv_bfloat16>(const AttnArgs&, dim3, cudaStream_t);

}  // namespace tq
