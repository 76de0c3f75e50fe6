// attention.cu: tq_decode_attention and tq_prefill_attention over the packed paged cache.
//
// Pass 1 (attention_split_kernel): one CTA per (KV split, KV head, sequence, tile of 16 query rows).
// Query rows are the q_len x group query vectors that share one KV head (row = token * group +
// head in group), so every KV byte loaded serves the whole GQA group. The rows are rotated once
// into the keys' domain (FORMAT.md "Attention never needs step 5"), softmax scale and log2(e)
// folded in, and held in registers as mma B fragments (fp16, or 8-bit hi + lo against 8-bit key
// levels). Each warp streams 32-token tiles of the split (cp.async into shared memory, kStages
// deep), decodes codes to levels in registers with byte-permute look-up tables (tile_decode.cuh),
// and computes the transposed products S^T = K Q^T and O^T += V^T P^T on tensor cores, 16 tokens
// per mma, with one online softmax step in base 2 per 32 tokens: tokens and value dims are the
// mma's M (16), query rows its N (8 per row tile), so a decode step of up to 8 rows (GQA group x
// q_len) wastes no tensor-core rows, and the decoded codes, as A fragments, serve every row tile.
// Norms multiply the scores (keys) and the probabilities (values), so centroids are decoded
// unscaled. The warps' states are combined and written as one partial state per split.
// The fused append (tq_decode_attention_append) encodes the call's new keys and values: a one-token
// step's in CTAs of its own, beside the splits or in the merge pass (AttnArgs::append_cta0), a
// longer step's in the splits that hold the new positions. No split reads them: with the new rows
// every query row stops its cache reads before the call's first position (cache_end).
// The chunk term, a query row's attention over the call's positions up to its own with the new
// rows, exactly: in the merge pass for calls of at most kMaxMergeChunk tokens, else in the chunk
// pass (chunk_attention.cu), launched first.
// Every pair of the allocator's widths with values no wider than keys gets kernels whose tile
// offsets and widths are compile-time constants (tile_shape, special_split_kernel); every other
// pair runs the same code with them read at run time.
// The key mean is not needed: q . mu is the same for every key of a query row and softmax is
// invariant to a per-row shift; only the log-sum-exp adds it back (merge pass).
// Pass 2 (merge_kernel): one CTA per query row merges the splits and, where the call has the new
// rows, the chunk term; rotates the output back (inverse Hadamard, signs,
// un-permutation, value scale), adds the value mean and, if asked, writes the row's log-sum-exp.
#include <algorithm>
#include <cmath>

#include "attention_common.cuh"
#include "errors.h"

namespace tq {
namespace {

// Warps per split-pass CTA: kWarps, or kWideWarps for long splits of at most 8 query rows, where
// sharing one prologue (query rotation, tables) among more tiles pays (plan_splits).
constexpr int kWarps = 4, kWideWarps = 8;
constexpr int kStages = 3;   // cp.async stages per warp: kChunk-token tiles in flight while one is computed
// Query-row n tiles (8 rows each) of the split kernel: 1 when every row of the call fits in 8,
// else 2. Twice the query fragments and accumulators leave room for fewer CTAs per SM.
constexpr int row_ntiles(int rows) { return rows <= 8 ? 1 : 2; }
// CTAs of w warps per SM: 16 warps at 128 registers per thread (nr 1), 12 at 170 (nr 2).
constexpr int ctas_per_sm(int nr, int w) { return (nr == 1 ? 16 : 12) / w; }
// Warps per query row in the merge pass. 8 at head_dim 64: SmolLM2's 1 x 8,192 call (32 splits over
// 9 rows) 1-5% faster alone and 6-7% in a CUDA graph than with 4 (1 x 2,048: 0-2% slower); at
// head_dim 128, 8 were up to 3% slower alone and 6% in graphs; 2 were slower at both
// (docs/BENCHMARKS.md#why-a-split-pass-and-a-merge-pass).
template <int D>
constexpr int kMergeWarps = D == 64 ? 8 : 4;
constexpr float kLn2 = 0.6931471805599453f;

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

  // --- The fused append (tq_decode_attention_append). The call's positions are no split's to read
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
  const uint32_t ones[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
  float m_run[NR][2], l_run[NR][2];
#pragma unroll
  for (int nr = 0; nr < NR; ++nr) m_run[nr][0] = m_run[nr][1] = -INFINITY, l_run[nr][0] = l_run[nr][1] = 0.0f;

  uint8_t* stage0 = smem + plan.stages + warp * kStages * plan.stage_bytes;
  const int chunks = split_end > split_begin ? (split_end - split_begin + kChunk - 1) / kChunk : 0;
  uint32_t staged = 0;  // bits 2 (i % kStages) + h: half h of tile i was staged (its pages exist)
  auto stage = [&](int i) {  // issues the copies of this warp's i-th tile (uniform over the warp)
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
    stage(i);
    cp_async_commit();
  }
  for (int it = 0; warp + it * W < chunks; ++it) {
    stage(it + kStages - 1);
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

    // S^T = K Q^T per half h: element e of row tile nr is (token 16h + g4 + 8 (e / 2), row 8nr +
    // 2tig + e % 2). This thread decodes tokens 16h + g4 and 16h + g4 + 8 (its A rows). Even and
    // odd k steps accumulate separately: independent mma chains.
    float s[2][NR][4] = {};
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
    if (rot_steps) {  // the rotary mean's term, then w turned to the warp's next tile
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
    // Mask (beyond the split or the staged tokens, or past the row's cache_end) where a token
    // can be masked, then the online softmax; a row's 32 scores lie across the 8 lanes of its tig.
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
    float m_use[NR][2], alpha[NR][2];
#pragma unroll
    for (int nr = 0; nr < NR; ++nr)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float mx = fmaxf(fmaxf(s[0][nr][j], s[0][nr][j + 2]), fmaxf(s[1][nr][j], s[1][nr][j + 2]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float m_new = fmaxf(m_run[nr][j], mx);
        m_use[nr][j] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[nr][j] = fast_exp2(m_run[nr][j] - m_use[nr][j]);
        m_run[nr][j] = m_new;
        l_run[nr][j] *= alpha[nr][j];
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

    // O^T += V^T P^T per half h. The probabilities times their tokens' value norms, fp16, are two
    // 8x8 blocks (tokens x rows) per row tile: transposed, they are the B fragment (rows x tokens).
    // This thread decodes tokens 16h + 2tig, 2tig+1, 2tig+8, 2tig+9 (its A columns), run g4 of each
    // group, two tokens at a time (decode_token_pairs gives the A fragments' token pairs); m tile i
    // of the group takes run slots 2i (A row g4) and 2i + 1 (A row g4 + 8).
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
    __syncwarp();
  }
  cp_async_wait<0>();
  if (!a.merge_at_start) asm volatile("griddepcontrol.launch_dependents;");

  // --- Epilogue: combine the warps' states, write this split's partial state. ---
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

// E consecutive floats from a 4*E-byte aligned address, in one vector load.
template <int E>
__device__ inline void load_floats(const float* p, float (&v)[E]) {
  if constexpr (E == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
  } else {
    const float2 x = *reinterpret_cast<const float2*>(p);
    v[0] = x.x; v[1] = x.y;
  }
}

// q . x over one query row's D channels, x(ch) a channel's value: each lane sums its E channels,
// then the warp; every lane gets the result.
template <int D, typename T, typename X>
__device__ inline float warp_q_dot(const T* qv, X x) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31;
  float dot = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) dot += to_float(qv[lane * E + e]) * x(lane * E + e);
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  return dot;
}

// A query row's chunk term (AttnArgs::new_kv): its softmax state over the call's positions up to
// its own, exactly, in the splits' units (q_scale (q . k - q . mean) in base 2): maximum m (-inf
// where it sees none; NaN where a score is NaN, so that the row's output is), sum l, and the
// output unnormalized at a lane's output channels (vr.ch).
template <int E>
struct ChunkTerm {
  float m = -INFINITY, l = 0.0f, o[E] = {};
};

// The chunk term of a query row of the call's token j, in a call of at most N (<= kMaxMergeChunk)
// tokens, from the new rows. Every key and value a lane needs is read first, in one round of
// independent loads (the call's tokens up to j exist whether or not they have a position, so no
// read waits for the sequence length): a loop that read row by row behind each score's shuffles
// made a 4-token call 15% slower (docs/BENCHMARKS.md#the-calls-own-tokens-read-exactly).
// qm: q . key mean.
template <int D, int N, typename T>
__device__ inline ChunkTerm<D / 32> merged_chunk_term(const AttnArgs& a, int b, int kvh, int j, const T* qv,
                                                      float qm, const LaneRotation<D>& vr) {
  static_assert(N <= kMaxMergeChunk);
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31;
  auto new_row = [&](int kind, int i) {
    return static_cast<const T*>(a.new_kv[kind]) + (int64_t(b) * a.q_len + i) * a.new_stride + int64_t(kvh) * D;
  };
  float q[E], k[N][E], v[N][E];
#pragma unroll
  for (int e = 0; e < E; ++e) q[e] = to_float(qv[lane * E + e]);
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (i <= j)
#pragma unroll
      for (int e = 0; e < E; ++e) {
        k[i][e] = to_float(new_row(0, i)[lane * E + e]);
        v[i][e] = to_float(new_row(1, i)[vr.ch[e]]);
      }
  const int first = max(0, a.q_len - seq_len(a, b));  // the call's tokens before it have no position
  ChunkTerm<E> t;
  float s[N];
  bool nan = false;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    s[i] = -INFINITY;
    if (i <= j) {  // warp-uniform
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) dot += q[e] * k[i][e];
      dot = group_sum(dot, 32);
      if (i >= first) s[i] = a.q_scale * (dot - qm);
    }
    t.m = fmaxf(t.m, s[i]);  // (fmaxf drops a NaN)
    nan |= isnan(s[i]);
  }
  if (nan) t.m = NAN;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (s[i] != -INFINITY) {
      const float w = exp2f(s[i] - t.m);
      t.l += w;
#pragma unroll
      for (int e = 0; e < E; ++e) t.o[e] += w * v[i][e];
    }
  return t;
}

// The chunk pass's term of query row r (longer calls), in the same units.
template <int D>
__device__ inline ChunkTerm<D / 32> passed_chunk_term(const AttnArgs& a, int b, int kvh, int r, float qm,
                                                      const LaneRotation<D>& vr) {
  ChunkTerm<D / 32> t;
  const int64_t slot = chunk_slot(a, b, kvh, r);
  const float2 ml = a.chunk_ml[slot];
  t.m = isnan(ml.y) ? NAN : ml.x == -INFINITY ? -INFINITY : ml.x - a.q_scale * qm;
  t.l = ml.y;
#pragma unroll
  for (int e = 0; e < D / 32; ++e) t.o[e] = a.chunk_o[slot * D + vr.ch[e]];
  return t;
}

// APPENDS: the kernel of calls with merge_appends (the encoding's registers stay out of the others,
// whose CTAs wait beside the splits where the merge pass starts early).
template <int D, typename T, bool APPENDS>
__global__ void __launch_bounds__(32 * kMergeWarps<D>) merge_kernel(AttnArgs a, int batch) {
  constexpr int E = D / 32;
  __shared__ float acc_s[kMergeWarps<D>][D];
  __shared__ float m_s[kMergeWarps<D>], l_s[kMergeWarps<D>];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  // (b, kvh, row): one CTA per query row. 32-bit arithmetic: a grid has fewer than 2^31 CTAs, and
  // 64-bit divisions are calls of dozens of instructions.
  const int item = int(blockIdx.x);
  const int heads = a.cache.num_kv_heads;
  // Then, with merge_appends, one CTA per (b, kvh) encodes a one-token step's new key and value
  // (the fused append). No split reads that position, so it does not wait for the split pass.
  const int64_t merge_ctas = int64_t(batch) * heads * a.rows;
  if (APPENDS && item >= merge_ctas) {
    const int i = int(item - merge_ctas), b = i / heads, L = seq_len(a, b);
    encode_new_rows<D, kMergeWarps<D>, T>(a, b, i % heads, L, L - 1, L);
    return;
  }
  const int row_item = item / a.rows, r = item - row_item * a.rows;
  const int b = row_item / heads, kvh = row_item - b * heads;
  const int64_t base = ws_slot(a, b, kvh, r, 0);
  const QueryRow qr = query_row_of(a, kvh, r);
  const int j = qr.token, hq = qr.head;
  const int64_t row = query_row_index(a, b, kvh, r);
  const T* qv = static_cast<const T*>(a.q) + row * D;
  // Warp 0 finishes the row, so only it reads the value codec's channels, factors and means at its
  // lanes' dims (the output's inverse rotation), q . key mean (original channels: the splits' scores
  // leave it out; the chunk term and the log-sum-exp need it) and a short call's chunk term, all
  // before the wait: after it, only the workspace reads stand between the split pass's end and the
  // output.
  const CodecLayout& kl = a.cache.codec[0];
  const CodecLayout& vl = a.cache.codec[1];
  LaneRotation<D> vr{};
  float v_mean[E] = {}, qm = 0.0f;
  ChunkTerm<E> chunk;
  if (warp == 0) {
    vr = lane_rotation<D>(vl, kvh);
#pragma unroll
    for (int e = 0; e < E; ++e) v_mean[e] = mean_of(vl, kvh, vr.ch[e]);
    if (kl.mean && (a.lse || a.new_kv[0])) qm = warp_q_dot<D>(qv, [&](int ch) { return mean_of(kl, kvh, ch); });
    // (A merge that appends serves one-token steps only: room for one token's rows keeps the
    // encoding's registers and these within the limit without a spill.)
    if (a.new_kv[0] && !a.chunk_ml)
      chunk = merged_chunk_term<D, APPENDS ? 1 : kMaxMergeChunk, T>(a, b, kvh, j, qv, qm, vr);
  }
  // The table's page shift lowers every split's state (the cached positions) against the chunk term.
  const float shift = a.cache.page_lse_shift ? a.cache.page_lse_shift[hq] * kLog2e : 0.0f;
  // Launched early (programmatic dependent launch): wait until the split pass's writes are visible.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // Warp w folds splits w, w + kMergeWarps<D>, ... into a running state of its own (maximum, sum,
  // weighted output), as the online softmax does: no pass over the splits' maxima comes first, so
  // after the wait the workspace is read in one round of independent loads (one warp walking every
  // split was latency-bound: 30 us at 64 splits). Each lane holds E consecutive rotated dims.
  float m_w = -INFINITY, l_w = 0.0f, acc[E] = {};
#pragma unroll 4
  for (int s = warp; s < a.num_splits; s += kMergeWarps<D>) {
    const float2 ml = a.ws_ml[base + s];
    float part[E];
    load_floats<E>(a.ws_o + (base + s) * D + lane * E, part);
    const float m = ml.x - shift;  // -inf: the split saw no key
    if (m > m_w) {
      const float r = exp2f(m_w - m);  // 0 while m_w is -inf
      l_w *= r;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] *= r;
      m_w = m;
    }
    const float w = m == -INFINITY ? 0.0f : exp2f(m - m_w);
    l_w += w * ml.y;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += w * part[e];
  }
#pragma unroll
  for (int e = 0; e < E; ++e) acc_s[warp][lane * E + e] = acc[e];
  if (lane == 0) m_s[warp] = m_w, l_s[warp] = l_w;
  __syncthreads();
  if (warp != 0) return;
  // Warp 0 weighs the warps' states and the chunk term against their common maximum and finishes
  // the row.
  if (a.chunk_ml) chunk = passed_chunk_term<D>(a, b, kvh, r, qm, vr);
  float m_all = chunk.m;
#pragma unroll
  for (int w = 0; w < kMergeWarps<D>; ++w) m_all = fmaxf(m_all, m_s[w]);
  float l_all = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.0f;
#pragma unroll
  for (int w = 0; w < kMergeWarps<D>; ++w) {
    const float r = m_s[w] == -INFINITY ? 0.0f : exp2f(m_s[w] - m_all);
    l_all += r * l_s[w];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += r * acc_s[w][lane * E + e];
  }
  const float w_chunk = chunk.m == -INFINITY ? 0.0f : exp2f(chunk.m - m_all);
  const float l_sum = l_all + w_chunk * chunk.l;
  // The log-sum-exp with q . mean added back, in base 2 (NaN where the sum is: a NaN score).
  if (a.lse && lane == 0)
    a.lse[row] = l_sum > 0.0f ? (m_all + log2f(l_sum) + a.q_scale * qm) * kLn2 : l_sum == 0.0f ? -INFINITY : NAN;
  // out = (R^-1(acc) * value scale + l_all * value mean + w_chunk * chunk output) / l_sum: the
  // cached tokens' decoded values each carry the value mean; a row that sees nothing gets the mean.
  const float inv = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;
  const float mean_w = l_sum > 0.0f ? l_all * inv : 1.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] *= inv;
  warp_fwht<E>(acc, D / vl.num_groups);
  T* out = static_cast<T*>(a.out) + row * D;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    float y = acc[e] * vr.factor[e] + mean_w * v_mean[e];
    if (w_chunk != 0.0f) y += w_chunk * inv * chunk.o[e];  // (NaN: a NaN score)
    out[vr.ch[e]] = from_float<T>(y);
  }
}

struct SplitPlan {
  bool prefill;   // the prefill pass (more than kPrefillMinRows rows per KV head), else the split pass
  int cta_tiles;  // CTA row tiles per (sequence, KV head): kPrefillRows or kRows rows each
  int row_tiles;  // 16-row tiles of the workspace per (sequence, KV head)
  int num_splits, split_tokens;
  int warps;      // per split-pass CTA: kWarps or kWideWarps
};

int sm_count() {
  static int sms = 0;
  if (!sms) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) sms = 132;
  }
  return sms;
}

int smem_per_sm() {
  static int bytes = 0;
  if (!bytes) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess)
      bytes = 228 * 1024;  // an H200's
  }
  return bytes;
}

// The largest q_len the split pass serves at a GQA group: more than kPrefillMinRows query rows per
// KV head go to the prefill pass.
static_assert(kPrefillMinRows >= TQ_MAX_GQA_GROUP);
// The longest chunk tq_prefill_attention takes; its rows stay quotient()'s exact range.
constexpr int kMaxPrefillQLen = 1 << 20;
static_assert(int64_t(kMaxPrefillQLen) * TQ_MAX_GQA_GROUP < kSmallDividendLimit);
int split_pass_max_q_len(int group) { return kPrefillMinRows / group; }

// The pass a call runs and its row tiles, before the split.
SplitPlan pass_of(int q_len, int group) {
  SplitPlan p{};
  const int rows = q_len * group;
  p.prefill = q_len > split_pass_max_q_len(group);
  p.row_tiles = (rows + kRows - 1) / kRows;
  p.cta_tiles = p.prefill ? (rows + kPrefillRows - 1) / kPrefillRows : p.row_tiles;
  return p;
}

// A split is a whole number of steps of both passes: kWarps x 32 tokens (the split pass: one tile
// per warp; twice that with kWideWarps), 128 tokens (the prefill pass).
constexpr int kSplitStep = kWarps * kChunk;
static_assert(kSplitStep % kTile == 0);
// Split CTAs never exceed kMaxWaves waves of the pass (or one per sequence, KV head and CTA row
// tile), which bounds the workspace (tq_attention_workspace_bytes).
constexpr int kMaxWaves = 4;
int64_t max_split_ctas(int64_t ctas, int resident) {
  return std::max<int64_t>(ctas, int64_t(kMaxWaves) * sm_count() * resident);
}

// The split pass's cost model (docs/BENCHMARKS.md#the-split-length-a-cost-model), in units of one
// warp's 32-token tile, fitted to H200 timings of 3-bit d 128 decode (1 x 1,024 to 32 x 32,768
// tokens, q_len 1 and 4, splits of 128 to 8,192 tokens, CTAs of 4 warps): with t tiles per warp,
// the busiest SM's w CTAs of W warps cost w (kPrologueTiles + W t (1 + kFewCtas / r)), r of them
// resident at once (each CTA's prologue, the query rotation and the tables, costs as much as 9
// tiles; fewer resident warps hide less latency), and no less than one CTA's latency alone,
// kLonePrologue + kLoneTile t.
constexpr double kPrologueTiles = 9.0, kFewCtas = 0.2, kLonePrologue = 4.5, kLoneTile = 5.5;
// Where the 4-warp plan's splits are at least kWideMinTiles tiles per warp long, the call runs on
// kWideWarps CTAs instead if they fit one wave and the model rates them at most kWideMaxCost
// times the 4-warp plan: on the H200 they were 1.5-5% faster from 1 x 16,384 to 32 x 32,768
// tokens (the model, fitted to 4-warp CTAs, rated them up to 4% dearer there), even at 1 x 8,192
// (4 tiles), 2-4% slower at 1 x 4,096 (2 tiles), and 8% slower over 1.45 waves (SmolLM2 16 x
// 8,192; docs/BENCHMARKS.md#the-split-length-a-cost-model).
constexpr int kWideMinTiles = 8;
constexpr double kWideMaxCost = 1.05;

// Split pass: steps per split of least modelled time (the most splits among equals). The cost
// grows with the steps per split at a given count w of CTAs on the busiest SM, so the candidates
// are the most splits that keep each w: a handful of plans, not one per split count.
struct SplitSteps {
  int per;      // steps per split
  double cost;  // modelled
};
SplitSteps split_pass_steps(int64_t ctas, int steps, int resident, int64_t cap, int warps) {
  const int sms = sm_count();
  int best = steps;
  double best_cost = INFINITY;
  for (int64_t w = (cap + sms - 1) / sms; w >= 1; --w) {
    const int64_t s = std::min<int64_t>({steps, w * sms / ctas, cap / ctas});
    if (s < 1) continue;
    const int per = int((steps + s - 1) / s);
    const int64_t n = ctas * ((steps + per - 1) / per);
    const int64_t on_sm = (n + sms - 1) / sms;  // CTAs on the busiest SM: w or fewer
    const double tile = 1.0 + kFewCtas / double(std::min<int64_t>(on_sm, resident));
    const double cost =
        std::max(double(on_sm) * (kPrologueTiles + warps * per * tile), kLonePrologue + kLoneTile * per);
    if (cost < best_cost) best = per, best_cost = cost;
  }
  return {best, best_cost};
}

// Prefill pass: as many splits as fill whole waves of its CTAs (a long history at batch 1 fills the
// GPU), each at least kPrefillMinSplitTokens long; steps per split. (The split pass's cost model
// does not describe it: 256-row CTAs, one per SM.)
constexpr int kPrefillMinSplitTokens = 256;
int prefill_pass_steps(int64_t ctas, int len, int64_t cap) {
  const int64_t slots = int64_t(sm_count()) * kPrefillCtasPerSm;
  const int max_splits = std::max(1, len / kPrefillMinSplitTokens);
  int best = 1;
  double best_eff = 0.0;
  for (int s = 1; s <= std::min(max_splits, 1024); ++s) {
    const int64_t n = ctas * s;
    if (n > cap) break;
    const double eff = double(n) / double((n + slots - 1) / slots * slots);
    if (eff > best_eff + 0.02) { best = s; best_eff = eff; }  // fewer splits unless clearly better
  }
  return ((len + best - 1) / best + kSplitStep - 1) / kSplitStep;
}

// wide_fits: kWideWarps CTAs of the call's codecs fit ctas_per_sm(1, kWideWarps) per SM.
SplitPlan plan_splits(int batch, int q_len, int group, int num_kv_heads, int max_kv_len, bool wide_fits) {
  SplitPlan p = pass_of(q_len, group);
  const int64_t ctas = int64_t(batch) * num_kv_heads * p.cta_tiles;
  const int len = std::max(1, max_kv_len), nr = row_ntiles(q_len * group);
  // The plan of CTAs of w warps (steps of w x kChunk tokens); its modelled cost.
  auto plan = [&](SplitPlan& q, int w) {
    q.warps = w;
    const int steps = (len + w * kChunk - 1) / (w * kChunk);
    const int resident = q.prefill ? kPrefillCtasPerSm : ctas_per_sm(nr, w);
    const int64_t cap = max_split_ctas(ctas, resident);
    const SplitSteps s = q.prefill ? SplitSteps{prefill_pass_steps(ctas, len, cap), 0.0}
                                   : split_pass_steps(ctas, steps, resident, cap, w);
    q.split_tokens = s.per * w * kChunk;
    q.num_splits = (steps + s.per - 1) / s.per;
    return s;
  };
  const SplitSteps narrow = plan(p, kWarps);
  if (p.prefill || nr != 1 || !wide_fits || narrow.per < kWideMinTiles) return p;
  SplitPlan wide = p;
  const SplitSteps w = plan(wide, kWideWarps);
  const bool one_wave = ctas * wide.num_splits <= int64_t(sm_count()) * ctas_per_sm(1, kWideWarps);
  return one_wave && w.cost <= kWideMaxCost * narrow.cost ? wide : p;
}

// Whether CTAs of kWideWarps fit ctas_per_sm(1, kWideWarps) per SM (wide codes need more stages'
// bytes), with the 1 KB that the runtime keeps per CTA.
bool wide_ctas_fit(const AttnArgs& a) {
  const int bytes = smem_plan(a.cache.codec[0].head_dim, kWideWarps, a.chunk[0], a.chunk[1],
                              a.cache.codec[0].rotary_pairs > 0).total;
  return ctas_per_sm(1, kWideWarps) * (bytes + 1024) <= smem_per_sm();
}

size_t workspace_bytes(size_t slots, int head_dim) {
  return slots * head_dim * sizeof(float) + slots * sizeof(float2) + 16;
}

// Workspace slots (query rows x splits) of a plan.
size_t plan_slots(const SplitPlan& p, int batch, int num_kv_heads) {
  return size_t(batch) * num_kv_heads * p.row_tiles * kRows * p.num_splits;
}

// The chunk pass's states of a call of q_len tokens (one per query row, counted as workspace slots),
// needed where it has new rows (counted in the bound below whether or not it has).
size_t chunk_rows(const SplitPlan& p, int batch, int num_kv_heads, int q_len) {
  return q_len > kMaxMergeChunk ? size_t(batch) * num_kv_heads * p.row_tiles * kRows : 0;
}

// Slots enough for every call whose batch, q_len and max_kv_len are at most these (the TensorRT
// plugin sizes its workspace once, for its profile's maxima), from the bounds on split CTAs: a
// pass's CTAs n <= max_split_ctas, each split at least one step; a split-pass CTA keeps kRows
// rows per split, a prefill CTA at most kPrefillRows. (kWideWarps CTAs: fewer resident per SM and
// longer steps, so fewer CTAs and splits than these bounds.)
size_t slots_bound(int batch, int q_len, int group, int num_kv_heads, int max_kv_len) {
  const int steps = (std::max(1, max_kv_len) + kSplitStep - 1) / kSplitStep;
  const SplitPlan sp = pass_of(std::min(q_len, split_pass_max_q_len(group)), group);  // its largest
  int64_t bound = int64_t(kRows) * max_split_ctas(int64_t(batch) * num_kv_heads * sp.cta_tiles, ctas_per_sm(1, kWarps));
  const SplitPlan pp = pass_of(q_len, group);
  if (pp.prefill)
    bound = std::max(bound, int64_t(kPrefillRows) *
                                max_split_ctas(int64_t(batch) * num_kv_heads * pp.cta_tiles, kPrefillCtasPerSm));
  return size_t(std::min(bound, int64_t(batch) * num_kv_heads * pp.row_tiles * kRows * steps)) +
         chunk_rows(pp, batch, num_kv_heads, q_len);
}

// The generic split kernel for these codecs' groups, decoding codes of up to MAXB bits.
template <int D, int MAXB, int NR, int W, typename T, bool E>
void (*generic_split_kernel(int kg, int vg))(AttnArgs) {
  if (kg == 1) return vg == 1 ? attention_split_kernel<D, 1, 1, 0, 0, MAXB, NR, W, T, E> : attention_split_kernel<D, 1, 2, 0, 0, MAXB, NR, W, T, E>;
  return vg == 1 ? attention_split_kernel<D, 2, 1, 0, 0, MAXB, NR, W, T, E> : attention_split_kernel<D, 2, 2, 0, 0, MAXB, NR, W, T, E>;
}

// The widths with kernels of their own, narrowest first: those the allocator gives
// (calibration/allocate.py: 2, 2.5, 3, 3.5, 4 and 5 bits) as (groups, bits of group 0). A
// fractional width's second group is one bit narrower (FORMAT.md section 2; make_layout refuses
// any other), so these two numbers name a width.
struct Width {
  int groups, bits;
};
constexpr Width kSpecialWidths[] = {{1, 2}, {2, 3}, {1, 3}, {2, 4}, {1, 4}, {1, 5}};
constexpr int kNumSpecialWidths = sizeof(kSpecialWidths) / sizeof(kSpecialWidths[0]);

__host__ inline bool has_width(const PageShape& s, Width w) {
  return s.num_groups == w.groups && s.group[0].bits == w.bits;
}

// The specialized split kernel of these codecs' widths, among the pairs whose value width is no
// wider than the key width (what calibrated engines have), from pair (KI, VI) of kSpecialWidths
// on; nullptr for any other pair.
template <int D, int NR, int W, typename T, bool E, int KI = 0, int VI = 0>
void (*special_split_kernel(const CacheView& c))(AttnArgs) {
  if constexpr (KI == kNumSpecialWidths) {
    return nullptr;
  } else if constexpr (VI > KI) {
    return special_split_kernel<D, NR, W, T, E, KI + 1, 0>(c);
  } else {
    constexpr Width k = kSpecialWidths[KI], v = kSpecialWidths[VI];
    if (has_width(c.codec[0], k) && has_width(c.codec[1], v))
      return attention_split_kernel<D, k.groups, v.groups, k.bits, v.bits, std::max(k.bits, v.bits), NR, W, T, E>;
    return special_split_kernel<D, NR, W, T, E, KI, VI + 1>(c);
  }
}

// The split kernel for these codecs: specialized for their widths where it exists, else generic.
template <int D, int NR, int W, typename T, bool E>
void (*split_kernel_for(const CacheView& c))(AttnArgs) {
  if (auto kernel = special_split_kernel<D, NR, W, T, E>(c)) return kernel;
  const int kg = c.codec[0].num_groups, vg = c.codec[1].num_groups;
  return has_5bit_codes(c) ? generic_split_kernel<D, 5, NR, W, T, E>(kg, vg) : generic_split_kernel<D, 4, NR, W, T, E>(kg, vg);
}

// The split kernel of a call of `warps` warps per CTA.
template <int D, typename T, bool E>
void (*split_kernel_of(const AttnArgs& a, int warps))(AttnArgs) {
  return warps == kWideWarps      ? split_kernel_for<D, 1, kWideWarps, T, E>(a.cache)
         : row_ntiles(a.rows) == 1 ? split_kernel_for<D, 1, kWarps, T, E>(a.cache)
                                   : split_kernel_for<D, 2, kWarps, T, E>(a.cache);
}

// Whether the split pass writes the fused append's rows: in append CTAs (a one-token step beside
// the splits) or in the splits (longer steps); a one-token step's merge pass may write them instead.
inline bool split_pass_encodes(const AttnArgs& a) {
  return a.append && (a.append_cta0 != kNoAppendCtas || a.q_len > 1);
}

// With append CTAs the split pass's grid is one-dimensional (attention_split_kernel): the split
// CTAs in the same order, then the append CTAs, dispatched last. CTAs of kWideWarps serve one
// row tile (plan_splits).
template <int D, typename T>
tq_status launch_split_pass(const AttnArgs& a, int warps, dim3 grid, cudaStream_t stream) {
  if (a.append_cta0 != kNoAppendCtas) grid = dim3(unsigned(a.append_cta0 + int64_t(grid.z) * grid.y));  // z = b here
  const int smem = smem_plan(D, warps, a.chunk[0], a.chunk[1], a.cache.codec[0].rotary_pairs > 0).total;
  auto kernel = split_pass_encodes(a) ? split_kernel_of<D, T, true>(a, warps) : split_kernel_of<D, T, false>(a, warps);
  return launch_pass(kernel, "attention (split pass)", grid, 32 * warps, smem, a, stream);
}

template <int D, typename T>
tq_status launch(const AttnArgs& a, const SplitPlan& sp, int batch, cudaStream_t stream) {
  const dim3 grid(a.num_splits, a.cache.num_kv_heads, batch * sp.cta_tiles);
  if (a.chunk_ml) TQ_TRY((launch_chunk_pass<D, T>(a, batch, stream)));  // done before the merge pass starts
  TQ_TRY((sp.prefill ? launch_prefill_pass<D, T>(a, grid, stream) : launch_split_pass<D, T>(a, sp.warps, grid, stream)));
  // The merge pass as a programmatic dependent launch: its launch overlaps the split pass's tail
  // (it starts with griddepcontrol.wait), which matters where the whole call lasts microseconds.
  // One CTA per query row, then with merge_appends one per (sequence, KV head).
  const int64_t rows = int64_t(batch) * a.cache.num_kv_heads * (a.rows + (a.merge_appends ? 1 : 0));
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(rows));
  cfg.blockDim = dim3(32 * kMergeWarps<D>);
  cfg.stream = stream;
  cfg.attrs = &pdl;
  cfg.numAttrs = 1;
  const cudaError_t err = a.merge_appends ? cudaLaunchKernelEx(&cfg, merge_kernel<D, T, true>, a, batch)
                                           : cudaLaunchKernelEx(&cfg, merge_kernel<D, T, false>, a, batch);
  cudaGetLastError();  // reported from err: leave no stale error for the next check_launch
  return err == cudaSuccess ? TQ_OK
                            : fail(TQ_ERR_CUDA, "attention (merge pass): CUDA launch failed: %s",
                                   cudaGetErrorString(err));
}

// new_k, new_v, new_stride: the call's new rows (the chunk term: attended exactly), or null;
// append: write them into the pages first (the fused append).
tq_status attention(const char* name, int max_q_len, const tq_paged_cache* cache,
                    const void* new_k, const void* new_v, int64_t new_stride, bool append,
                    const void* q, void* out, float* lse, tq_dtype dtype, const int32_t* kv_lens,
                    int32_t max_kv_len, int32_t batch, int32_t q_len, int32_t num_q_heads,
                    float softmax_scale, void* workspace, size_t ws_bytes, tq_stream stream) {
  AttnArgs a{};
  TQ_TRY(make_cache_view(cache, &a.cache));
  if (!new_k != !new_v)
    return fail(TQ_ERR_NULL_POINTER, "%s: k_new and v_new must be given together (or both NULL)", name);
  if (new_k) {
    if (reinterpret_cast<uintptr_t>(new_k) % 4 || reinterpret_cast<uintptr_t>(new_v) % 4)
      return fail(TQ_ERR_MISALIGNED, "%s: k_new and v_new must be 4-byte aligned", name);
    if (new_stride % 2)
      return fail(TQ_ERR_MISALIGNED, "%s: new_stride %lld must be even (4-byte aligned rows)", name,
                  (long long)new_stride);
    if (new_stride < int64_t(a.cache.num_kv_heads) * a.cache.codec[0].head_dim)
      return fail(TQ_ERR_INVALID_ARGUMENT, "%s: new_stride %lld is smaller than num_kv_heads x "
                  "head_dim = %d", name, (long long)new_stride,
                  a.cache.num_kv_heads * a.cache.codec[0].head_dim);
  }
  a.new_kv[0] = new_k;
  a.new_kv[1] = new_v;
  a.new_stride = new_stride;
  a.append = append;
  if (!q || !out || !kv_lens)
    return fail(TQ_ERR_NULL_POINTER, "%s: q, out and kv_lens must not be NULL", name);
  if (reinterpret_cast<uintptr_t>(lse) % alignof(float))
    return fail(TQ_ERR_MISALIGNED, "%s: lse must be 4-byte aligned", name);
  if (batch < 1 || q_len < 1 || q_len > max_q_len)
    return fail(TQ_ERR_BAD_LENGTH, "%s: batch %d must be >= 1 and q_len %d in 1..%d", name, batch,
                q_len, max_q_len);
  const int heads = a.cache.num_kv_heads;
  if (num_q_heads < heads || num_q_heads % heads || num_q_heads / heads > TQ_MAX_GQA_GROUP)
    return fail(TQ_ERR_INVALID_ARGUMENT, "%s: num_q_heads %d must be 1 to %d times num_kv_heads %d",
                name, num_q_heads, TQ_MAX_GQA_GROUP, heads);
  if (max_kv_len < 0 || int64_t(max_kv_len) > int64_t(a.cache.max_blocks) * a.cache.tokens)
    return fail(TQ_ERR_BAD_LENGTH, "%s: max_kv_len %d lies beyond the block table (%d blocks of %d "
                "tokens)", name, max_kv_len, a.cache.max_blocks, a.cache.tokens);
  if (dtype != TQ_FP16 && dtype != TQ_BF16)
    return fail(TQ_ERR_INVALID_ARGUMENT, "%s: dtype %d is neither TQ_FP16 nor TQ_BF16", name, int(dtype));
  if (!(softmax_scale > 0.0f) || !std::isfinite(softmax_scale))
    return fail(TQ_ERR_INVALID_ARGUMENT, "%s: softmax_scale must be positive and finite", name);
  const int d = a.cache.codec[0].head_dim;
  for (int kv = 0; kv < 2; ++kv) {
    a.tile[kv] = relayout(a.cache.codec[kv], kTile);
    a.chunk[kv] = relayout(a.cache.codec[kv], kChunk);
  }
  const SplitPlan sp = plan_splits(batch, q_len, num_q_heads / heads, heads, max_kv_len, wide_ctas_fit(a));
  if (int64_t(batch) * sp.cta_tiles > 65535)
    return fail(TQ_ERR_BAD_LENGTH, "%s: batch %d x %d tiles of %d query rows exceeds the grid "
                "limit (65535); split the batch or the chunk", name, batch, sp.cta_tiles,
                sp.prefill ? kPrefillRows : kRows);
  const size_t slots = plan_slots(sp, batch, heads);
  const size_t chunk = new_k ? chunk_rows(sp, batch, heads, q_len) : 0;
  const size_t need = workspace_bytes(slots + chunk, d);
  if (!workspace || ws_bytes < need)
    return fail(TQ_ERR_WORKSPACE, "%s: the workspace needs %zu bytes, got %zu%s", name, need,
                ws_bytes, workspace ? "" : " (NULL)");
  if (reinterpret_cast<uintptr_t>(workspace) % 16)
    return fail(TQ_ERR_MISALIGNED, "%s: the workspace must be 16-byte aligned", name);
  a.q = q;
  a.out = out;
  a.lse = lse;
  a.kv_lens = kv_lens;
  a.max_kv_len = max_kv_len;
  a.q_len = q_len;
  a.group = small_divisor(num_q_heads / heads);
  a.num_q_heads = num_q_heads;
  a.rows = q_len * a.group.d;  // below kSmallDividendLimit (kMaxPrefillQLen)
  a.row_tiles = small_divisor(sp.row_tiles);
  a.num_splits = sp.num_splits;
  a.split_tokens = sp.split_tokens;
  a.q_scale = softmax_scale * kLog2e;
  // The merge pass starts with the split pass at head_dim 64 and in CUDA graphs, else after the
  // tile loop: starting it at once made SmolLM2's calls 1-7% faster alone and 7-15% in graphs,
  // Llama-3-8B's 5-7% faster in graphs but up to 11% slower alone at batch 1
  // (docs/BENCHMARKS.md#why-a-split-pass-and-a-merge-pass).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &capture) != cudaSuccess)
    cudaGetLastError();  // (the legacy stream beside a global capture): taken as not capturing
  a.merge_at_start = d == 64 || capture == cudaStreamCaptureStatusActive;
  // A one-token step's append: in CTAs of the split pass, after the splits' (one per sequence and
  // KV head), where the splits and they take at most 3 of an SM's 4 CTA slots of 4 warps (at 1 x
  // 131,072, 3 split CTAs per SM, they made the call 24% slower), or all fit one wave beside
  // kWideWarps splits. Else in CTAs of the merge pass: beside batched splits they cost 3-4% less
  // than encoding in the splits (docs/BENCHMARKS.md#the-fused-append). (Taken where the split
  // pass's fit too, they ended short calls alone 1-1.6 us later where the merge pass starts late,
  // and made fused calls in graphs 1.7-3.4% slower at 1 x 16,384 and 1 x 131,072, SmolLM2's alone
  // 4% at 1 x 8,192, where it starts early.)
  const int64_t split_ctas = int64_t(sp.num_splits) * heads * batch * sp.cta_tiles;
  const int resident = ctas_per_sm(row_ntiles(a.rows), sp.warps);
  const int64_t free_slots = int64_t(sm_count()) * (sp.warps == kWideWarps ? resident : resident - 1) - split_ctas;
  const bool one_token = append && q_len == 1 && !sp.prefill;
  a.append_cta0 = one_token && int64_t(batch) * heads <= free_slots ? int(split_ctas) : kNoAppendCtas;
  a.merge_appends = one_token && a.append_cta0 == kNoAppendCtas;
  // [ws_o | chunk_o | ws_ml | chunk_ml]
  a.ws_o = static_cast<float*>(workspace);
  a.ws_ml = reinterpret_cast<float2*>(a.ws_o + (slots + chunk) * d);
  a.chunk_o = chunk ? a.ws_o + slots * d : nullptr;
  a.chunk_ml = chunk ? a.ws_ml + slots : nullptr;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  return dispatch(d, dtype, [&](auto dim, auto type) {
    return launch<decltype(dim)::value, typename decltype(type)::type>(a, sp, batch, s);
  });
}

}  // namespace
}  // namespace tq

extern "C" size_t tq_attention_workspace_bytes(int32_t batch, int32_t q_len, int32_t num_q_heads,
                                               int32_t num_kv_heads, int32_t head_dim,
                                               int32_t max_kv_len) {
  if (batch < 1 || q_len < 1 || num_kv_heads < 1 || num_q_heads < num_kv_heads || head_dim < 1)
    return 0;
  return tq::workspace_bytes(tq::slots_bound(batch, q_len, num_q_heads / num_kv_heads, num_kv_heads,
                                             std::max(0, max_kv_len)),
                             head_dim);
}

extern "C" tq_status tq_decode_attention(const tq_paged_cache* cache, const void* k_new,
                                         const void* v_new, int64_t new_stride, const void* q,
                                         void* out, float* lse, tq_dtype dtype,
                                         const int32_t* kv_lens, int32_t max_kv_len, int32_t batch,
                                         int32_t q_len, int32_t num_q_heads, float softmax_scale,
                                         void* workspace, size_t workspace_bytes, tq_stream stream) {
  return tq::attention("decode_attention", TQ_MAX_DECODE_Q_LEN, cache, k_new, v_new, new_stride,
                       false, q, out, lse, dtype, kv_lens, max_kv_len, batch, q_len, num_q_heads,
                       softmax_scale, workspace, workspace_bytes, stream);
}

extern "C" tq_status tq_decode_attention_append(const tq_paged_cache* cache, const void* k_new,
                                                const void* v_new, int64_t new_stride,
                                                const void* q, void* out, float* lse,
                                                tq_dtype dtype, const int32_t* kv_lens,
                                                int32_t max_kv_len, int32_t batch, int32_t q_len,
                                                int32_t num_q_heads, float softmax_scale,
                                                void* workspace, size_t workspace_bytes,
                                                tq_stream stream) {
  if (!k_new || !v_new)
    return tq::fail(TQ_ERR_NULL_POINTER, "decode_attention_append: k_new and v_new must not be NULL");
  return tq::attention("decode_attention_append", TQ_MAX_DECODE_Q_LEN, cache, k_new, v_new,
                       new_stride, true, q, out, lse, dtype, kv_lens, max_kv_len, batch, q_len,
                       num_q_heads, softmax_scale, workspace, workspace_bytes, stream);
}

extern "C" tq_status tq_prefill_attention(const tq_paged_cache* cache, const void* k_new,
                                          const void* v_new, int64_t new_stride, const void* q,
                                          void* out, float* lse, tq_dtype dtype,
                                          const int32_t* kv_lens, int32_t max_kv_len,
                                          int32_t batch, int32_t q_len, int32_t num_q_heads,
                                          float softmax_scale, void* workspace,
                                          size_t workspace_bytes, tq_stream stream) {
  return tq::attention("prefill_attention", tq::kMaxPrefillQLen, cache, k_new, v_new, new_stride,
                       false, q, out, lse, dtype, kv_lens, max_kv_len, batch, q_len, num_q_heads,
                       softmax_scale, workspace, workspace_bytes, stream);
}
