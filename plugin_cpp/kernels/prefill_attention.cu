// prefill_attention.cu: the attention pass of tq_attention_run for long chunks (more than
// kPrefillMinRows query rows per KV head). The split pass decodes every tile once per 16 query
// rows, so a 2,048-token chunk decoded the whole history 512 times; here a CTA of four warpgroups
// serves kPrefillRows = 256 rows (64 per warpgroup: one wgmma m64 tile) and decodes each 128-token
// step once, into shared memory as the levels' grid indices in fp16 (exact; the byte-permute
// tables of tile_decode.cuh) with the tokens' gains beside them in fp32, after which it is flash
// attention on Hopper's warpgroup tensor cores (wgmma.cuh): S = Q K^T with Q and K from shared
// memory, O += P V with P from registers, an online softmax in base 2 over 32-token sub-steps. As
// in the split pass, gains (the keys' times the grid step) multiply the scores (keys) and the
// probabilities (values) per group, and the grid step the outputs, so the only fp16 roundings are
// the query's and the scaled probabilities' (fp16 levels rounded too: 2.17e-3 against the 2e-3
// bound in a test with 5-bit keys; gains folded into them, 2.3e-3). Tiles are staged (cp.async)
// one step ahead: warp w copies and then decodes 16-token tile w of the keys or of the values.
//
// Measured on the H200 (docs/BENCHMARKS.md#the-prefill-pass): two warpgroups of two m64 tiles each
// (8 warps, ~240 registers) were 1.16x slower than four of one (16 warps within 128 registers:
// twice the warps to hide the products' and the softmax's latencies); with mma.sync instead of
// wgmma, 1.30x slower. Before wgmma, 128-row CTAs were 1.2x slower, 64-row CTAs (2 or 3 per SM)
// 1.4-1.7x slower, 64-token steps 1.05x slower.
//
// Shared-memory matrices (query rows, decoded K and V, the rotary mean's tables) are stored as
// wgmma's 8 x 8 core matrices (blocked<COLS>). Decoded coordinates are stored in run order: a run
// is 32 consecutive group coordinates that decode_pairs emits in run_slot_coord order, so stored
// column p holds coordinate run_coord(p). The query is stored in the same order and the output
// scattered back by it. Each split writes the partial state the merge pass (merge_kernel.cuh)
// finishes, as the split pass does.
#include "attention_common.cuh"
#include "errors.h"
#include "wgmma.cuh"

namespace tq {
namespace {

constexpr int kPfTokens = 128;               // tokens per step: 8 staged tiles of K, 8 of V
constexpr int kPfTiles = kPfTokens / kTile;  // staged tiles per step, of K and of V
constexpr int kSub = 32;                     // tokens per softmax sub-step (the n of S's wgmma)
constexpr int kMTiles = 1;                   // wgmma m64 tiles per warpgroup
constexpr int kGroupRows = 64 * kMTiles;     // query rows per warpgroup
constexpr int kRun = 32;                     // codes per decode run
constexpr int kRotCols = 2 * TQ_MAX_ROTARY_PAIRS;  // columns of the rotary mean's tables
static_assert(kGroupRows * kPrefillWarps / 4 == kPrefillRows && 2 * kPfTiles % kPrefillWarps == 0);
static_assert(kRotCols == 32, "two k16 steps of rotary columns (rot_col)");

struct PrefillSmem {
  int q, kv, gains, tables, flags, rot, stage, stage_bytes, total;
};

// The query rows [kPrefillRows][D] fp16, the K and V rows [kPfTokens][D] fp16 (blocked) and their
// gains [K or V][group][kPfTokens] fp32, the tables, the staged flags, with a rotary mean its
// (Re z, -Im z) rows [kPrefillRows][kRotCols] and the step's cos | sin rows, hi and lo (the
// rounding remainder), [2][kPfTokens][kRotCols] fp16 (blocked), and two steps of packed tiles.
template <int D>
__host__ __device__ inline PrefillSmem prefill_smem(const PageShape& kt, const PageShape& vt,
                                                    bool rotary) {
  PrefillSmem p{};
  p.q = 0;
  p.kv = kPrefillRows * D * 2;
  p.gains = p.kv + 2 * kPfTokens * D * 2;
  p.tables = p.gains + 2 * TQ_MAX_GROUPS * kPfTokens * 4;
  p.flags = p.tables + kByteTablesBytes;
  p.rot = (p.flags + 2 * 2 * kPfTiles * 4 + 127) / 128 * 128;  // wgmma reads 16-byte aligned rows
  p.stage = p.rot + (rotary ? (kPrefillRows + 2 * kPfTokens) * kRotCols * 2 : 0);
  p.stage_bytes = kPfTiles * (kt.page_bytes + vt.page_bytes);
  p.total = p.stage + 2 * p.stage_bytes;
  return p;
}

// The group coordinate stored at column p of a decoded row (see the file comment), and the
// column of coordinate c.
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
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int VN = D / VG;  // the n of a value group's P V product
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int g4 = lane >> 2, tig = lane & 3;
  const int split = blockIdx.x, kvh = blockIdx.y;
  const int cta_tiles = (a.rows + kPrefillRows - 1) / kPrefillRows;
  const int b = blockIdx.z / cta_tiles, row0 = blockIdx.z % cta_tiles * kPrefillRows;
  const PageShape& kt = a.tile[0];
  const PageShape& vt = a.tile[1];
  const bool rotary = a.cache.codec[0].rotary_pairs > 0;
  const PrefillSmem plan = prefill_smem<D>(kt, vt, rotary);
  __half* q_s = reinterpret_cast<__half*>(smem + plan.q);
  __half* k_s = reinterpret_cast<__half*>(smem + plan.kv);
  __half* v_s = k_s + kPfTokens * D;
  float* gains = reinterpret_cast<float*>(smem + plan.gains);  // [kind][group][token]
  ByteTables* tables = reinterpret_cast<ByteTables*>(smem + plan.tables);
  int* staged_s = reinterpret_cast<int*>(smem + plan.flags);  // [step % 2][tile]: staged
  __half* rot_q = reinterpret_cast<__half*>(smem + plan.rot);  // the rotary mean's rows
  __half* rot_k = rot_q + kPrefillRows * kRotCols;  // hi, then lo at + kPfTokens * kRotCols

  const CtaKeys keys = cta_keys(a, b, split, row0, kPrefillRows);
  const int split_begin = keys.begin, split_end = keys.end;

  // --- Prologue: the rotated query rows, in run order, in shared memory; the tables. ---
  const LaneRotation<D> lr = lane_rotation<D>(a.cache.codec[0], kvh);  // the same for every row
  for (int rr = warp; rr < kPrefillRows; rr += kPrefillWarps) {
    constexpr int E = D / 32;
    float x[E];
    load_query_row<D, T>(a, b, kvh, row0 + rr, lr, x);
    rotate_query_row<D, KG>(a, lr, x);
#pragma unroll
    for (int e = 0; e < E; ++e) q_s[blocked<D>(rr, run_position(kt, lane * E + e))] = __float2half_rn(x[e]);
  }
  if (rotary)  // the rotary mean's (Re z, -Im z) row of each query row (attention_common.cuh)
    for (int idx = threadIdx.x; idx < kPrefillRows * TQ_MAX_ROTARY_PAIRS; idx += 32 * kPrefillWarps) {
      const int rr = idx / TQ_MAX_ROTARY_PAIRS, i = idx % TQ_MAX_ROTARY_PAIRS;
      const float2 z = rotary_z<D, T>(rotary_pair(a.cache.codec[0], kvh, i),
                                      query_row<D, T>(a, b, kvh, row0 + rr), a.q_scale);
      rot_q[blocked<kRotCols>(rr, rot_col(i))] = __float2half_rn(z.x);
      rot_q[blocked<kRotCols>(rr, rot_col(i) + 8)] = __float2half_rn(-z.y);
    }
  fill_byte_tables(tables, a.cache, false);
  __syncthreads();  // the first decode reads the tables (the query rows wait for the loop's barrier)

  // This thread's rows: warpgroup wg's m64 tile mt, half h (accumulator row g4 + 8h of its warp),
  // and their causal limits.
  const int wg = warp / 4;
  auto row_of = [&](int mt, int h) { return wg * kGroupRows + 64 * mt + 16 * (warp % 4) + g4 + 8 * h; };
  int limit[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) limit[mt][h] = causal_limit(a, keys.len, row0 + row_of(mt, h));
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
      __half* dst = kind ? v_s : k_s;
      const int pos = split_begin + i * kPfTokens + part * kTile;
      const int valid = staged_s[(i % 2) * 2 * kPfTiles + j] ? min(kTile, split_end - pos) : 0;
      for (int r = lane; r < kTile * D / kRun; r += 32) {
        const int token = r % kTile, c0 = r / kTile * kRun;
        const int g = shape.num_groups == 2 && c0 >= shape.group[1].start ? 1 : 0;
        if (c0 == shape.group[g].start)  // the keys' gains carry the grid step (fill_byte_tables)
          gains[(kind * TQ_MAX_GROUPS + g) * kPfTokens + part * kTile + token] =
              token < valid ? tile_norm(tile, shape, g, token) * (kind ? 1.0f : a.cache.codec[0].grid_step[g]) : 0.0f;
        uint32_t pairs[kRun / 2];
        with_bits<MAXB>(shape.group[g].bits, [&](auto bits) {
          CodeRun<decltype(bits)::value, kRun> run;
          run.load(tile, shape.group[g], token, (c0 - shape.group[g].start) / kRun);
          decode_pairs(run, code_tables<decltype(bits)::value>(tables, kind * 2 + g), pairs);
        });
#pragma unroll
        for (int q = 0; q < kRun / 8; ++q)
          *reinterpret_cast<uint4*>(dst + blocked<D>(part * kTile + token, c0 + 8 * q)) =
              make_uint4(pairs[4 * q], pairs[4 * q + 1], pairs[4 * q + 2], pairs[4 * q + 3]);
      }
    }
  };

  // Accumulators (wgmma.cuh): o[mt][g] holds columns g * VN .. of m tile mt, n8 chunk j in
  // [4j .. 4j + 3]; element e of a chunk is row half e / 2, column 2 tig + e % 2.
  float o[kMTiles][VG][VN / 2] = {};
  uint32_t pa[kSub / 16][VG][kMTiles][4] = {};  // P V's A fragments, live until the products end
  float m_run[kMTiles][2], l_run[kMTiles][2] = {};
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) m_run[mt][0] = m_run[mt][1] = -INFINITY;
  // The products' matrices (built once: the loop only moves their start addresses).
  const uint64_t q_desc = k_major_desc<D>(q_s + blocked<D>(wg * kGroupRows, 0));
  const uint64_t k_desc = k_major_desc<D>(k_s), v_desc = mn_major_desc<D>(v_s);
  const uint64_t rot_q_desc = k_major_desc<kRotCols>(rot_q + blocked<kRotCols>(wg * kGroupRows, 0));
  const uint64_t rot_k_desc = k_major_desc<kRotCols>(rot_k);
  if (steps > 0) stage(0);
  cp_async_commit();
  for (int i = 0; i < steps; ++i) {
    if (i + 1 < steps) stage(i + 1);  // its buffer was decoded in step i - 1, before a barrier
    cp_async_commit();
    cp_async_wait<1>();
    __syncwarp();  // the warp decodes the tiles it copied itself
    decode(i);
    if (rotary) {  // the cos | sin row of each of the step's positions: the step's first
      // position turned exactly, then by each token's small offset (a thread keeps its pair)
      static_assert(32 * kPrefillWarps % TQ_MAX_ROTARY_PAIRS == 0);
      const int p = threadIdx.x % TQ_MAX_ROTARY_PAIRS;
      const float f = rotary_pair(a.cache.codec[0], kvh, p).freq;
      const float2 base = rotary_turn(split_begin + i * kPfTokens, f);
      for (int t = threadIdx.x / TQ_MAX_ROTARY_PAIRS; t < kPfTokens; t += 32 * kPrefillWarps / TQ_MAX_ROTARY_PAIRS)
        store_turn_hi_lo(rot_k, rot_k + kPfTokens * kRotCols, p, turn_by(base, small_turn(t, f)),
                         [t](int c) { return blocked<kRotCols>(t, c); });
    }
    fence_async_shared();  // the products read what this thread wrote (and, first, the query rows)
    __syncthreads();       // every K and V row of the step is decoded
    const int* staged = staged_s + (i % 2) * 2 * kPfTiles;
#pragma unroll 1
    for (int sub = 0; sub < kPfTokens / kSub; ++sub) {
      const int tok0 = sub * kSub;  // the sub-step's first token in the step
      const int pos0 = split_begin + i * kPfTokens + tok0;
      // S = Q K^T per key group, times the tokens' gains; n8 chunk t = tokens tok0 + 8t .. +7. The
      // first wait also drains the previous sub-step's P V.
      float s[kMTiles][kSub / 2];
#pragma unroll
      for (int g = 0; g < KG; ++g) {
        float sg[kMTiles][kSub / 2];
        wgmma_fence();
#pragma unroll
        for (int ks = g * D / 16 / KG; ks < (g + 1) * D / 16 / KG; ++ks)
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
            wgmma_ss_n32(sg[mt], desc_at(q_desc, blocked<D>(64 * mt, 16 * ks)),
                         desc_at(k_desc, blocked<D>(tok0, 16 * ks)), ks != g * D / 16 / KG);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(sg);
        fence_regs(o);
        fence_regs(pa);
#pragma unroll
        for (int t = 0; t < kSub / 8; ++t) {
          const float2 gn = *reinterpret_cast<const float2*>(gains + g * kPfTokens + tok0 + 8 * t + 2 * tig);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              s[mt][4 * t + e] = (g ? s[mt][4 * t + e] : 0.0f) + sg[mt][4 * t + e] * (e & 1 ? gn.y : gn.x);
        }
      }
      // The rotary mean's term: (Re z, -Im z) rows times the tokens' cos | sin rows (hi + lo: the
      // rows' fp16 is the query's own precision), no gains. Both k16 steps run (a pair beyond
      // rotary_pairs has zero columns): a loop of run-time length would serialize the products.
      if (rotary) {
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kRotCols / 16; ++ks)
#pragma unroll
          for (int part = 0; part < 2; ++part)
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
              wgmma_ss_n32(s[mt], desc_at(rot_q_desc, blocked<kRotCols>(64 * mt, 16 * ks)),
                           desc_at(rot_k_desc, part * kPfTokens * kRotCols + blocked<kRotCols>(tok0, 16 * ks)), true);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(s);
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
              if (!seen || pos > limit[mt][e >> 1]) s[mt][4 * t + e] = -INFINITY;
          }
      }
      // Online softmax per row: a row's scores lie across the 4 lanes of its g4.
      float m_use[kMTiles][2], alpha[kMTiles][2];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = -INFINITY;
#pragma unroll
          for (int t = 0; t < kSub / 8; ++t) mx = fmaxf(mx, fmaxf(s[mt][4 * t + 2 * h], s[mt][4 * t + 2 * h + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const SoftmaxStep step = online_softmax_step(m_run[mt][h], l_run[mt][h], mx);
          m_use[mt][h] = step.base;
          alpha[mt][h] = step.alpha;
        }
      // Rescale O where some row of the warp's m tile got a new maximum (after the first steps of a
      // long history, rarely).
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        if (__any_sync(0xffffffffu, alpha[mt][0] != 1.0f || alpha[mt][1] != 1.0f))
#pragma unroll
          for (int g = 0; g < VG; ++g)
#pragma unroll
            for (int i = 0; i < VN / 2; ++i) o[mt][g][i] *= alpha[mt][(i >> 1) & 1];
      // O += P V, 16 tokens per k step: P's accumulator fragments, times the value gains of each
      // group, are the A fragments (fp16); V comes MN-major from v_s (value group g: columns g VN ..).
      // The products run on while the next sub-step's S products are issued.
#pragma unroll
      for (int kk = 0; kk < kSub / 16; ++kk) {
        float p[kMTiles][8];  // n8 chunks 2kk and 2kk + 1
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            p[mt][e] = fast_exp2(s[mt][8 * kk + e] - m_use[mt][(e >> 1) & 1]);
            l_run[mt][(e >> 1) & 1] += p[mt][e];
          }
#pragma unroll
        for (int g = 0; g < VG; ++g) {
          const float* vg = gains + (TQ_MAX_GROUPS + g) * kPfTokens + tok0 + 16 * kk + 2 * tig;
          const float2 g0 = *reinterpret_cast<const float2*>(vg);
          const float2 g1 = *reinterpret_cast<const float2*>(vg + 8);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            pa[kk][g][mt][0] = pack_float2(p[mt][0] * g0.x, p[mt][1] * g0.y);
            pa[kk][g][mt][1] = pack_float2(p[mt][2] * g0.x, p[mt][3] * g0.y);
            pa[kk][g][mt][2] = pack_float2(p[mt][4] * g1.x, p[mt][5] * g1.y);
            pa[kk][g][mt][3] = pack_float2(p[mt][6] * g1.x, p[mt][7] * g1.y);
          }
        }
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kSub / 16; ++kk)
#pragma unroll
        for (int g = 0; g < VG; ++g)
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
            wgmma_rs<VN>(o[mt][g], pa[kk][g][mt], desc_at(v_desc, blocked<D>(tok0 + 16 * kk, g * VN)));
      wgmma_commit();
    }
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);
    __syncthreads();  // the next step's decode overwrites k_s and v_s
  }
  cp_async_wait<0>();
  asm volatile("griddepcontrol.launch_dependents;");

  // --- Epilogue: this split's partial state of each of the thread's rows. ---
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = row0 + row_of(mt, h);
      if (r >= a.rows) continue;
      const int64_t slot = ws_slot(a, b, kvh, r, split);
#pragma unroll
      for (int g = 0; g < VG; ++g)
#pragma unroll
        for (int n = 0; n < VN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            a.ws_o[slot * D + run_coord(vt, g * VN + 8 * n + 2 * tig + e)] =
                o[mt][g][4 * n + 2 * h + e] * a.cache.codec[1].grid_step[g];  // grid units to levels
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
  return launch_pass(kernel, "attention (prefill pass)", grid, 32 * kPrefillWarps, bytes, a, stream);
}

template tq_status launch_prefill_pass<64, __half>(const AttnArgs&, dim3, cudaStream_t);
template tq_status launch_prefill_pass<128, __half>(const AttnArgs&, dim3, cudaStream_t);
template tq_status launch_prefill_pass<64, __nv_bfloat16>(const AttnArgs&, dim3, cudaStream_t);
template tq_status launch_prefill_pass<128, __nv_bfloat16>(const AttnArgs&, dim3, cudaStream_t);

}  // namespace tq
