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
  int lo_bits;       // width of the low plane: 4, 2 or 1 (3-bit codes: 2, plus a 1-bit high plane)
  int lo_off;        // byte offset of the low plane's uint32[T][row] array in the page
  int lo_row_bytes;  // bytes of one token's row in the low plane
  int hi_off;        // byte offset of the 1-bit high plane (3-bit codes only), else -1
  int hi_row_bytes;
};

struct CodecLayout {
  int head_dim;
  int num_groups;
  int tokens;      // T of the page this layout describes
  int page_bytes;
  int norm_off;    // fp16[G][T] norms
  GroupLayout group[TQ_MAX_GROUPS];
  float codebook[TQ_MAX_GROUPS][16];
  float boundary[TQ_MAX_GROUPS][15];  // decision boundaries (c_k + c_{k+1}) / 2, computed in double
  uint32_t seed;
  const int32_t* perm;  // device [H][D] or null
  const float* mean;
  const float* scale;
};

// Checks `codec` (what: "key" or "value", for messages) and fills `out` for pages of `tokens`.
tq_status make_layout(const tq_codec* codec, int tokens, const char* what, CodecLayout* out);

// The same codec laid out for a different number of tokens per page (e.g. a 16-token staging tile).
CodecLayout relayout(const CodecLayout& layout, int tokens);

}  // namespace tq
