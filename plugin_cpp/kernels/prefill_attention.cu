// prefill_attention.cu: the attention pass of tq_prefill_attention for long chunks (more than
// kPrefillMinRows query rows per KV head). The split pass decodes every tile once per 16 query
// rows, so a 2,048-token chunk decoded the whole history 512 times; here a CTA of 8 warps serves
// kPrefillRows = 128 rows and decodes each 64-token tile once, into shared memory as fp16
// centroids (the byte-permute tables of tile_decode.cuh) with the tokens' gains beside them in
// fp32, after which it is flash attention on tensor cores: each warp holds 16 query rows as A
// fragments in registers, reads K and V fragments with ldmatrix, and keeps an online softmax in
// base 2. As in the split pass, gains multiply the scores (keys) and the probabilities (values)
// per group, so the only fp16 roundings are the centroids' and the scaled probabilities' (gains
// folded into fp16 centroids would round once more: measured 2.3e-3 error against the 2e-3 bound).
// Tiles are staged (cp.async) one step ahead: warp w copies and then decodes 16-token tile w % 4 of
// the keys (w < 4) or the values (w >= 4).
//
// Decoded coordinates are stored in run order: a run is 32 consecutive group coordinates that
// decode_pairs emits in run_slot_coord order, so stored position p holds coordinate
// run_coord(p). The query is gathered in the same order and the output scattered back by it.
// Each split writes the partial state the merge pass (attention.cu) finishes, as the split pass does.
#include <climits>

#include "attention_common.cuh"
#include "errors.h"

namespace tq {
namespace {

constexpr int kPfWarps = 8;                  // 16 query rows each
constexpr int kPfTokens = 64;                // tokens per step: 4 staged tiles
constexpr int kPfTiles = kPfTokens / kTile;  // tiles per step, for K and for V: 2 x 4 = 8 warps
constexpr int kRun = 32;                     // codes per decode run
constexpr int kPad = 8;                      // fp16 row padding: ldmatrix rows on distinct banks
static_assert(kPfWarps == 2 * kPfTiles && kPfWarps * 16 == kPrefillRows);

struct PrefillSmem {
  int kv, gains, tables, flags, stage, stage_bytes, total;
};

// K and V tiles [kPfTokens][D + kPad] fp16 (the query rows [kPrefillRows][D + kPad] before the
// loop), their gains [K or V][group][kPfTokens] fp32, the tables, the staged flags, and two steps
// of packed tiles.
template <int D>
__host__ __device__ inline PrefillSmem prefill_smem(const PageShape& kt, const PageShape& vt) {
  PrefillSmem p{};
  const int kv_bytes = 2 * kPfTokens * (D + kPad) * 2, q_bytes = kPrefillRows * (D + kPad) * 2;
  p.kv = 0;
  p.gains = kv_bytes > q_bytes ? kv_bytes : q_bytes;
  p.tables = p.gains + 2 * TQ_MAX_GROUPS * kPfTokens * 4;
  p.flags = p.tables + 2 * TQ_MAX_GROUPS * int(sizeof(ByteTables));
  p.stage = p.flags + 2 * kPfWarps * 4;
  p.stage_bytes = kPfTiles * (kt.page_bytes + vt.page_bytes);
  p.total = p.stage + 2 * p.stage_bytes;
  return p;
}

// The group coordinate stored at position p of a decoded row (see the file comment).
__device__ inline int run_coord(const PageShape& s, int p) {
  const int c0 = p & ~(kRun - 1);
  const int g = s.num_groups == 2 && c0 >= s.group[1].start ? 1 : 0;
  return c0 + run_slot_coord(s.group[g].bits, kRun, p & (kRun - 1));
}

// KG, VG: groups of the key and value codecs.
template <int D, int KG, int VG, typename T>
__global__ void __launch_bounds__(32 * kPfWarps, 1) prefill_kernel(AttnArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int LD = D + kPad;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int g4 = lane >> 2, tig = lane & 3;
  const int split = blockIdx.x, kvh = blockIdx.y;
  const int cta_tiles = (a.rows + kPrefillRows - 1) / kPrefillRows;
  const int b = blockIdx.z / cta_tiles, row0 = blockIdx.z % cta_tiles * kPrefillRows;
  const PageShape& kt = a.tile[0];
  const PageShape& vt = a.tile[1];
  const PrefillSmem plan = prefill_smem<D>(kt, vt);
  __half* k_s = reinterpret_cast<__half*>(smem + plan.kv);
  __half* v_s = k_s + kPfTokens * LD;
  float* gains = reinterpret_cast<float*>(smem + plan.gains);  // [kind][group][token]
  ByteTables* tables = reinterpret_cast<ByteTables*>(smem + plan.tables);
  int* staged_s = reinterpret_cast<int*>(smem + plan.flags);  // [step % 2][warp]: tile staged

  const int L = max(0, min(a.kv_lens[b], a.max_kv_len));
  const int last_row = min(a.rows, row0 + kPrefillRows) - 1;
  const int visible_end = L - a.q_len + last_row / a.group + 1;
  const int split_begin = split * a.split_tokens;
  const int split_end = min(min(L, visible_end), split_begin + a.split_tokens);

  // --- Prologue: rotated query rows (natural order) in shared memory, then each warp's 16 rows
  // as A fragments in run order. ---
  __half* q_s = k_s;
  for (int rr = warp; rr < kPrefillRows; rr += kPfWarps) {
    constexpr int E = D / 32;
    float x[E];
    rotated_query_row<D, T>(a, b, kvh, row0 + rr, x);
#pragma unroll
    for (int e = 0; e < E; ++e) q_s[rr * LD + lane * E + e] = __float2half_rn(x[e]);
  }
  fill_byte_tables(tables, a.cache);
  __syncthreads();
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const __half* row = q_s + (warp * 16 + g4 + 8 * (h & 1)) * LD;
      const int p = 16 * ks + 2 * tig + 8 * (h >> 1);
      qa[ks][h] = pack_half2(row[run_coord(kt, p)], row[run_coord(kt, p + 1)]);
    }
  __syncthreads();  // q_s becomes the K and V tiles

  // Causal limits of this thread's rows (padding rows are never written out: no limit); tokens
  // before full_end are visible to every row of the CTA.
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + warp * 16 + g4 + 8 * h;
    limit[h] = r < a.rows ? L - a.q_len + r / a.group : INT_MAX;
  }
  const int full_end = min(split_end, L - a.q_len + row0 / a.group + 1);

  // This warp's staged tile: 16 tokens of the keys (kind 0) or the values (kind 1).
  const int kind = warp / kPfTiles, part = warp % kPfTiles;
  const PageShape& shape = kind ? vt : kt;
  const int tile_off = kind ? kPfTiles * kt.page_bytes + part * vt.page_bytes : part * kt.page_bytes;
  const int steps = split_end > split_begin ? (split_end - split_begin + kPfTokens - 1) / kPfTokens : 0;
  auto stage = [&](int i) {
    const int pos = split_begin + i * kPfTokens + part * kTile;
    const int block = pos / a.cache.tokens;
    const int chunk = pos < split_end ? chunk_of(a.cache, b, kind, block) : -1;
    if (lane == 0) staged_s[(i % 2) * kPfWarps + warp] = chunk >= 0;
    if (chunk >= 0)
      stage_page_tile(smem + plan.stage + (i % 2) * plan.stage_bytes + tile_off,
                      page_in_chunk(a.cache, kind, chunk, kvh), shape, a.cache.tokens / kTile,
                      pos - block * a.cache.tokens);
  };
  // Decodes this warp's staged tile into its 16 rows of k_s or v_s and its gains; tokens past the
  // split or not staged get gain 0 (their bytes may be anything, even NaN gains).
  auto decode = [&](int i) {
    const uint8_t* tile = smem + plan.stage + (i % 2) * plan.stage_bytes + tile_off;
    __half* dst = (kind ? v_s : k_s) + part * kTile * LD;
    const int pos = split_begin + i * kPfTokens + part * kTile;
    const int valid = staged_s[(i % 2) * kPfWarps + warp] ? min(kTile, split_end - pos) : 0;
    for (int r = lane; r < kTile * D / kRun; r += 32) {
      const int token = r % kTile, c0 = r / kTile * kRun;
      const int g = shape.num_groups == 2 && c0 >= shape.group[1].start ? 1 : 0;
      if (c0 == shape.group[g].start)
        gains[(kind * TQ_MAX_GROUPS + g) * kPfTokens + part * kTile + token] =
            token < valid ? tile_norm(tile, shape, g, token) : 0.0f;
      uint32_t pairs[kRun / 2];
      with_bits(shape.group[g].bits, [&](auto bits) {
        CodeRun<decltype(bits)::value, kRun> run;
        run.load(tile, shape.group[g], token, (c0 - shape.group[g].start) / kRun);
        decode_pairs(run, tables[kind * 2 + g], pairs);
      });
      uint4* out = reinterpret_cast<uint4*>(dst + token * LD + c0);
#pragma unroll
      for (int q = 0; q < kRun / 8; ++q)
        out[q] = make_uint4(pairs[4 * q], pairs[4 * q + 1], pairs[4 * q + 2], pairs[4 * q + 3]);
    }
  };

  float o[D / 8][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  if (steps > 0) stage(0);
  cp_async_commit();
  for (int i = 0; i < steps; ++i) {
    if (i + 1 < steps) stage(i + 1);  // its buffer was decoded in step i - 1, before a barrier
    cp_async_commit();
    cp_async_wait<1>();
    __syncwarp();  // the warp decodes the tile it copied itself
    decode(i);
    __syncthreads();  // every K and V row of the step is decoded
    const int pos0 = split_begin + i * kPfTokens;
    const bool full = pos0 + kPfTokens <= full_end;

    // S = Q K^T over the step's 64 tokens, n tile t = tokens 8t .. 8t+7; per key group, times the
    // tokens' gains.
    float s[kPfTokens / 8][4] = {};
#pragma unroll
    for (int g = 0; g < KG; ++g) {
      float sg[kPfTokens / 8][4] = {};
#pragma unroll
      for (int ks = g * D / 16 / KG; ks < (g + 1) * D / 16 / KG; ++ks)
#pragma unroll
        for (int np = 0; np < kPfTokens / 16; ++np) {
          const int m = lane / 8;  // matrix: n tile 2np + m / 2, k half m % 2
          uint32_t kb[4];
          ldmatrix_x4(kb, k_s + (16 * np + 8 * (m >> 1) + lane % 8) * LD + 16 * ks + 8 * (m & 1));
          mma_16816(sg[2 * np], qa[ks], kb[0], kb[1]);
          mma_16816(sg[2 * np + 1], qa[ks], kb[2], kb[3]);
        }
#pragma unroll
      for (int t = 0; t < kPfTokens / 8; ++t) {
        const float2 gn = *reinterpret_cast<const float2*>(gains + g * kPfTokens + 8 * t + 2 * tig);
        s[t][0] += sg[t][0] * gn.x;
        s[t][1] += sg[t][1] * gn.y;
        s[t][2] += sg[t][2] * gn.x;
        s[t][3] += sg[t][3] * gn.y;
      }
    }
    if (!full) {
      const int* staged = staged_s + (i % 2) * kPfWarps;
#pragma unroll
      for (int t = 0; t < kPfTokens / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = 8 * t + 2 * tig + (e & 1), pos = pos0 + tok;
          const bool seen = pos < split_end && staged[tok / kTile] && staged[kPfTiles + tok / kTile];
          if (!seen || pos > limit[e >> 1]) s[t][e] = -INFINITY;
        }
    }
    // Online softmax: row g4 (e < 2) and row g4 + 8; a row's scores lie across the 4 lanes of g4.
    float m_use[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int t = 0; t < kPfTokens / 8; ++t) mx = fmaxf(mx, fmaxf(s[t][2 * h], s[t][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[h], mx);
      m_use[h] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[h] = fast_exp2(m_run[h] - m_use[h]);
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e >> 1];
    // O += P V, 16 tokens per k step: P's C fragments, times the value gains of each group, are
    // the A fragments (fp16); V's B fragments come transposed from v_s (dims 8n .. 8n+7 of n tile n).
#pragma unroll
    for (int kk = 0; kk < kPfTokens / 16; ++kk) {
      float p[2][4];
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[t][e] = fast_exp2(s[2 * kk + t][e] - m_use[e >> 1]);
          l_run[e >> 1] += p[t][e];
        }
#pragma unroll
      for (int g = 0; g < VG; ++g) {
        const float* vg = gains + (TQ_MAX_GROUPS + g) * kPfTokens + 16 * kk + 2 * tig;
        const float2 g0 = *reinterpret_cast<const float2*>(vg);
        const float2 g1 = *reinterpret_cast<const float2*>(vg + 8);
        const uint32_t pa[4] = {pack_float2(p[0][0] * g0.x, p[0][1] * g0.y),
                                pack_float2(p[0][2] * g0.x, p[0][3] * g0.y),
                                pack_float2(p[1][0] * g1.x, p[1][1] * g1.y),
                                pack_float2(p[1][2] * g1.x, p[1][3] * g1.y)};
#pragma unroll
        for (int dp = g * D / 16 / VG; dp < (g + 1) * D / 16 / VG; ++dp) {
          const int m = lane / 8;  // matrix: k half m % 2, n tile 2dp + m / 2
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_s + (16 * kk + 8 * (m & 1) + lane % 8) * LD + 8 * (2 * dp + (m >> 1)));
          mma_16816(o[2 * dp], pa, vb[0], vb[1]);
          mma_16816(o[2 * dp + 1], pa, vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // the next step's decode overwrites k_s and v_s
  }
  cp_async_wait<0>();
  asm volatile("griddepcontrol.launch_dependents;");

  // --- Epilogue: this split's partial state of each of the warp's rows. ---
  const int heads = a.cache.num_kv_heads;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    const int r = row0 + warp * 16 + g4 + 8 * h;
    if (r >= a.rows) continue;
    const int64_t slot = ((int64_t(b) * heads + kvh) * a.row_tiles * kRows + r) * a.num_splits + split;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) a.ws_o[slot * D + run_coord(vt, 8 * n + 2 * tig + e)] = o[n][2 * h + e];
    if (tig == 0) a.ws_ml[slot] = make_float2(m_run[h], l_run[h]);
  }
}

}  // namespace

template <int D, typename T>
tq_status launch_prefill_pass(const AttnArgs& a, dim3 grid, cudaStream_t stream) {
  const int bytes = prefill_smem<D>(a.tile[0], a.tile[1]).total;
  const bool k1 = a.cache.codec[0].num_groups == 1, v1 = a.cache.codec[1].num_groups == 1;
  auto kernel = k1 ? (v1 ? prefill_kernel<D, 1, 1, T> : prefill_kernel<D, 1, 2, T>)
                   : (v1 ? prefill_kernel<D, 2, 1, T> : prefill_kernel<D, 2, 2, T>);
  if (bytes > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
    return fail(TQ_ERR_CUDA, "attention (prefill pass): cannot raise the shared memory limit to %d "
                "bytes", bytes);
  kernel<<<grid, 32 * kPfWarps, bytes, stream>>>(a);
  return check_launch("attention (prefill pass)");
}

template tq_status launch_prefill_pass<64, __half>(const AttnArgs&, dim3, cudaStream_t);
template tq_status launch_prefill_pass<128, __half>(const AttnArgs&, dim3, cudaStream_t);
template tq_status launch_prefill_pass<64, __nv_bfloat16>(const AttnArgs&, dim3, cudaStream_t);
template tq_status launch_prefill_pass<128, __nv_bfloat16>(const AttnArgs&, dim3, cudaStream_t);

}  // namespace tq
