// chunk_attention.cu: the chunk pass of calls with new rows (k_new, v_new) longer than
// kMaxMergeChunk tokens. Each query row attends to the call's own keys and values up to its token,
// exactly: original channels, the rows as the caller computed them, causal, no cache involved.
// The passes over the cache stop before the call's first position (cache_end), and the merge pass
// weighs this pass's state against theirs, as it does for the chunk term of short calls.
//
// Flash attention on mma.sync (m16n8k16, the call's fp16 or bf16 in, fp32 accumulate): a CTA of
// kChunkWarps warps serves 16 query rows per warp (row = token x group + head in group, as in the
// other passes, so a GQA group's heads share each staged tile), and walks the call's tokens in
// 64-token tiles of K and V, copied (cp.async) into shared memory one tile ahead. S = Q K^T with Q
// and K by ldmatrix; O += P V with P from S's accumulators and V by ldmatrix.trans. bf16
// probabilities go in as hi + lo (two products): one bf16 rounding of them would cost up to 2^-9
// relative. Q in shared memory rather than registers keeps a thread within 128 registers, so that
// two CTAs share an SM.
#include <type_traits>

#include "attention_common.cuh"

namespace tq {
namespace {

constexpr int kChunkWarps = 8;
constexpr int kChunkRows = 16 * kChunkWarps;  // query rows per CTA
constexpr int kKeyTile = 64;                  // tokens per staged tile of K and of V

// Shared-memory row stride of Q and the staged tiles, in elements: 16 bytes of padding move each
// row's start by four banks, so the eight rows an ldmatrix reads fall in distinct banks.
template <int D>
constexpr int tile_ld() { return D + 8; }
// Q [kChunkRows] rows, then two buffers of K [kKeyTile] and V [kKeyTile] rows, all 2-byte elements.
template <int D>
constexpr int chunk_smem_bytes() { return (kChunkRows + 4 * kKeyTile) * tile_ld<D>() * 2; }

// Issues the copies of tokens [t0, t0 + kKeyTile) of kind's new rows (zeros from t_end on) into a
// staged tile, in VEC-byte pieces (16 where the rows are 16-byte aligned, else 4: launch_chunk_pass).
template <int D, int VEC, typename T>
__device__ inline void stage_new_rows(T* tile, const AttnArgs& a, int kind, int b, int kvh, int t0, int t_end) {
  constexpr int kPer = VEC / 2, kPieces = D / kPer;  // elements per piece, pieces per row
  const T* base = static_cast<const T*>(a.new_kv[kind]) + int64_t(b) * a.q_len * a.new_stride + int64_t(kvh) * D;
#pragma unroll 1
  for (int w = threadIdx.x; w < kKeyTile * kPieces; w += 32 * kChunkWarps) {
    const int row = w / kPieces, col = kPer * (w % kPieces), t = t0 + row;
    const bool valid = t < t_end;
    cp_async_fill<VEC>(tile + row * tile_ld<D>() + col, base + (valid ? int64_t(t) * a.new_stride + col : 0), valid);
  }
}

// grid: (CTA row tiles, KV heads, batch). VEC: the copies' bytes.
template <int D, int VEC, typename T>
__global__ void __launch_bounds__(32 * kChunkWarps, 2) chunk_kernel(AttnArgs a) {
  constexpr int KS = D / 16;  // k steps of Q K^T
  constexpr int LD = tile_ld<D>();
  extern __shared__ __align__(16) uint8_t smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* kv_s = q_s + kChunkRows * LD;  // buffer u: K at kv_s + 2u kKeyTile LD, V after it
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int g4 = lane >> 2, tig = lane & 3;
  const int kvh = blockIdx.y, b = blockIdx.z, row0 = blockIdx.x * kChunkRows;
  const int len = seq_len(a, b);
  // The call's token i sits at position len - q_len + i: tokens before first have none.
  const int first = max(0, a.q_len - len);
  const int end = quotient(min(a.rows, row0 + kChunkRows) - 1, a.group) + 1;  // past the CTA's last token
  auto stage = [&](int u, int t0) {
    stage_new_rows<D, VEC, T>(kv_s + 2 * u * kKeyTile * LD, a, 0, b, kvh, t0, end);
    stage_new_rows<D, VEC, T>(kv_s + (2 * u + 1) * kKeyTile * LD, a, 1, b, kvh, t0, end);
    cp_async_commit();
  };
  if (first < end) stage(0, first);
  // The CTA's query rows into shared memory (zeros for padding rows), while the first tile copies.
  for (int i = threadIdx.x; i < kChunkRows * D; i += 32 * kChunkWarps) {
    const int rr = i / D, c = i % D;
    const T* qv = query_row<D, T>(a, b, kvh, row0 + rr);
    q_s[rr * LD + c] = qv ? qv[c] : from_float<T>(0.0f);
  }
  // This thread's rows g4 and g4 + 8 of the warp's 16, their tokens (-1: a padding row, sees none).
  int token[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 16 * warp + g4 + 8 * h;
    token[h] = r < a.rows ? quotient(r, a.group) : -1;
  }
  const T* q_warp = q_s + (16 * warp + (lane & 15)) * LD + 8 * (lane >> 4);  // its ldmatrix row

  float o[D / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int t0 = first, u = 0; t0 < end; t0 += kKeyTile, u ^= 1) {
    if (t0 + kKeyTile < end) stage(u ^ 1, t0 + kKeyTile);  // the next tile, into the other buffer
    else cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // tile t0 (and the query rows) visible to every warp
    const T* k_s = kv_s + 2 * u * kKeyTile * LD;
    const T* v_s = k_s + kKeyTile * LD;
    // S = Q K^T over the tile's 8 n tiles of 8 tokens; one ldmatrix of K gives two k steps of one.
    float s[kKeyTile / 8][4] = {};
#pragma unroll
    for (int ks = 0; ks < KS; ks += 2) {
      uint32_t qa[4], qb[4];
      ldmatrix_x4(qa, q_warp + 16 * ks);
      ldmatrix_x4(qb, q_warp + 16 * ks + 16);
#pragma unroll
      for (int nt = 0; nt < kKeyTile / 8; ++nt) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_s + (8 * nt + (lane & 7)) * LD + 16 * ks + 8 * (lane >> 3));
        mma_16816<T>(s[nt], qa, kb[0], kb[1]);
        mma_16816<T>(s[nt], qb, kb[2], kb[3]);
      }
    }
    // Online softmax in base 2 over the tile, rows g4 (h 0: c0, c1) and g4 + 8 (h 1: c2, c3).
    float scale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kKeyTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = t0 + 8 * nt + 2 * tig + e;
          float& x = s[nt][2 * h + e];
          x = t <= token[h] ? x * a.q_scale : -INFINITY;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const SoftmaxStep step = online_softmax_step(m[h], l[h], mx);
      const float base = step.base;
      scale[h] = step.alpha;
#pragma unroll
      for (int nt = 0; nt < kKeyTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nt][2 * h + e];
          x = fast_exp2(x - base);
          l[h] += x;
        }
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= scale[0], o[n][1] *= scale[0];
      o[n][2] *= scale[1], o[n][3] *= scale[1];
    }
    // O += P V: k step ks covers the tile's tokens 16 ks .. 16 ks + 15, S's n tiles 2 ks and 2 ks + 1.
#pragma unroll
    for (int ks = 0; ks < kKeyTile / 16; ++ks) {
      uint32_t p[4], p_lo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float* x = s[2 * ks + i / 2] + 2 * (i % 2);
        split_float2<T>(x[0], x[1], p[i], p_lo[i]);
      }
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_s + (16 * ks + 8 * ((lane >> 3) & 1) + (lane & 7)) * LD + 8 * (n + (lane >> 4)));
        mma_16816<T>(o[n], p, vb[0], vb[1]);
        mma_16816<T>(o[n + 1], p, vb[2], vb[3]);
        if constexpr (!std::is_same_v<T, __half>) {
          mma_16816<T>(o[n], p_lo, vb[0], vb[1]);
          mma_16816<T>(o[n + 1], p_lo, vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with buffer u before the next iteration copies into it
  }
  // Each row's state: the quad's sums, then (max, sum) and the unnormalized output.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int r = row0 + 16 * warp + g4 + 8 * h;
    if (r >= a.rows) continue;
    const int64_t slot = chunk_slot(a, b, kvh, r);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(a.chunk_o + slot * D + 8 * n + 2 * tig) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
    if (tig == 0) a.chunk_ml[slot] = make_float2(m[h], l[h]);
  }
}

// The kernel for the new rows' alignment: 16-byte copies where every row starts 16-byte aligned.
template <int D, typename T>
void (*chunk_kernel_for(const AttnArgs& a))(AttnArgs) {
  const uintptr_t starts = reinterpret_cast<uintptr_t>(a.new_kv[0]) | reinterpret_cast<uintptr_t>(a.new_kv[1]) |
                           uintptr_t(a.new_stride * int64_t(sizeof(T)));
  return starts % 16 == 0 ? chunk_kernel<D, 16, T> : chunk_kernel<D, 4, T>;
}

}  // namespace

template <int D, typename T>
tq_status launch_chunk_pass(const AttnArgs& a, int batch, cudaStream_t stream) {
  const dim3 grid((a.rows + kChunkRows - 1) / kChunkRows, a.cache.num_kv_heads, batch);
  return launch_pass(chunk_kernel_for<D, T>(a), "attention (chunk pass)", grid, 32 * kChunkWarps, chunk_smem_bytes<D>(), a, stream);
}

template tq_status launch_chunk_pass<64, __half>(const AttnArgs&, int, cudaStream_t);
template tq_status launch_chunk_pass<128, __half>(const AttnArgs&, int, cudaStream_t);
template tq_status launch_chunk_pass<64, __nv_bfloat16>(const AttnArgs&, int, cudaStream_t);
template tq_status launch_chunk_pass<128, __nv_bfloat16>(const AttnArgs&, int, cudaStream_t);

}  // namespace tq
