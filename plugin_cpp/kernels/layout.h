// layout.h: where each plane and the norms of one group sit in a page (docs/FORMAT.md, sections
// 2, 3 and 5), in a form the kernels take by value. The one place that computes page offsets.
#pragma once

#include <cstdint>

#include "tq/tq_kernels.h"

namespace tq {

struct GroupLayout {
  int start;         // first permuted coordinate of the group
  int dim;           // n_g
  int bits;          // b_g
  int lo_bits;       // width of the low plane: 4, 2 or 1 (3- and 5-bit codes: 2 and 4, plus a 1-bit high plane)
  int lo_off;        // byte offset of the low plane's uint32[T][row] array in the page
  int lo_row_bytes;  // bytes of one token's row in the low plane
  int hi_off;        // byte offset of the 1-bit high plane (3- and 5-bit codes only), else -1
  int hi_row_bytes;
};

// Where everything of one codec sits in a page of `tokens` tokens. Depends only on head_dim, the
// groups' bits and T, so kernels specialized for a width compute it at compile time.
struct PageShape {
  int num_groups;
  int tokens;      // T of the page this shape describes
  int page_bytes;
  int norm_off;    // fp16[G][T] norms
  GroupLayout group[TQ_MAX_GROUPS];
};

// FORMAT.md section 3: the low plane's width; 3- and 5-bit codes keep their top bit in a 1-bit
// high plane.
__host__ __device__ constexpr int low_plane_bits(int bits) { return bits == 3 ? 2 : bits == 5 ? 4 : bits; }

// The bit of a high-plane word holding coordinate r of its 32: for 3-bit codes nibble order, beside
// the low-plane bits of the same code pair; for 5-bit codes plain order.
__host__ __device__ constexpr int hi_plane_bit(int bits, int r) {
  return bits == 5 ? r : 4 * ((r & 15) >> 1) + 2 - 2 * ((r >> 4) & 1) + (r & 1);
}

// FORMAT.md section 5: per group its planes (low first), then the norms. bits1 is ignored for one
// group; two groups split head_dim in halves.
__host__ __device__ constexpr PageShape page_shape(int head_dim, int num_groups, int bits0,
                                                   int bits1, int tokens) {
  PageShape p{};
  p.num_groups = num_groups;
  p.tokens = tokens;
  int offset = 0;
  for (int g = 0; g < num_groups; ++g) {
    GroupLayout& gl = p.group[g];
    gl.dim = head_dim / num_groups;
    gl.start = g * gl.dim;
    gl.bits = g == 0 ? bits0 : bits1;
    gl.lo_bits = low_plane_bits(gl.bits);
    gl.lo_row_bytes = gl.dim * gl.lo_bits / 8;
    gl.hi_row_bytes = gl.lo_bits != gl.bits ? gl.dim / 8 : 0;
    gl.lo_off = offset;
    offset += tokens * gl.lo_row_bytes;
    gl.hi_off = gl.hi_row_bytes ? offset : -1;
    offset += tokens * gl.hi_row_bytes;
  }
  p.norm_off = offset;
  p.page_bytes = offset + num_groups * tokens * 2;
  return p;
}

// FORMAT.md section 1: a group's levels are i_k * grid_step with |i_k| <= 127 (make_layout puts
// them there). Look-up tables may hold them as the fp16 values kGridBias + i_k instead: all lie in
// [1025, 1279], where fp16 steps by 1, so all share the high byte 0x64 (kGridHiBytes) and only the
// low bytes, i_k + 128, need looking up (tile_decode.cuh, kFixedHi). The reader takes kGridBias
// away and multiplies by grid_step.
constexpr float kGridBias = 1152.0f;
constexpr uint32_t kGridHiBytes = 0x64646464u;

struct CodecLayout : PageShape {
  int head_dim;
  float codebook[TQ_MAX_GROUPS][1 << TQ_MAX_BITS];
  float grid_step[TQ_MAX_GROUPS];
  uint32_t grid_low[TQ_MAX_GROUPS][(1 << TQ_MAX_BITS) / 4];  // the bytes i_k + 128, four per word
  // grid_low as the split pass looks it up: 4- and 5-bit groups' in the paired form (tile_decode.cuh)
  uint32_t grid_lookup[TQ_MAX_GROUPS][(1 << TQ_MAX_BITS) / 4];
  float boundary[TQ_MAX_GROUPS][(1 << TQ_MAX_BITS) - 1];  // decision boundaries (c_k + c_{k+1}) / 2, computed in double
  uint32_t seed;
  const int32_t* perm;  // device [H][D] or null
  const float* mean;
  const float* scale;
  int rotary_pairs;             // tq_codec::rotary_* (FORMAT.md section 1.1)
  const int32_t* rotary_channel;
  const float* rotary_freq;
  const float* rotary_mean;
};

// Checks `codec` (what: "key" or "value", for messages) and fills `out` for pages of `tokens`.
tq_status make_layout(const tq_codec* codec, int tokens, const char* what, CodecLayout* out);

// The same codec laid out for a different number of tokens per page (e.g. a 16-token staging tile).
CodecLayout relayout(const CodecLayout& layout, int tokens);

}  // namespace tq
