// layout.cpp: validation of tq_codec and the page offsets of FORMAT.md section 5.
#include "layout.h"

#include "errors.h"

namespace tq {
namespace {

bool is_kernel_head_dim(int d) { return d == 64 || d == 128; }

void place_planes(CodecLayout* l) {
  int offset = 0;
  for (int g = 0; g < l->num_groups; ++g) {
    GroupLayout& gl = l->group[g];
    gl.lo_off = offset;
    offset += l->tokens * gl.lo_row_bytes;
    if (gl.hi_row_bytes > 0) {
      gl.hi_off = offset;
      offset += l->tokens * gl.hi_row_bytes;
    } else {
      gl.hi_off = -1;
    }
  }
  l->norm_off = offset;
  l->page_bytes = offset + l->num_groups * l->tokens * 2;
}

}  // namespace

tq_status make_layout(const tq_codec* codec, int tokens, const char* what, CodecLayout* out) {
  if (!codec) return fail(TQ_ERR_NULL_POINTER, "the %s codec is NULL", what);
  if (!is_kernel_head_dim(codec->head_dim))
    return fail(TQ_ERR_UNSUPPORTED_HEAD_DIM,
                "%s head_dim %d is not supported by the CUDA kernels; supported head dims are 64 "
                "and 128", what, codec->head_dim);
  if (tokens <= 0 || tokens % 16)
    return fail(TQ_ERR_INVALID_ARGUMENT, "tokens_per_block %d must be a positive multiple of 16",
                tokens);
  const int d = codec->head_dim;
  const int g_count = codec->num_groups;
  if (g_count != 1 && g_count != 2)
    return fail(TQ_ERR_INVALID_ARGUMENT, "%s codec has %d groups; use 1 (integer widths) or 2 "
                "(fractional widths)", what, g_count);
  CodecLayout l{};
  l.head_dim = d;
  l.num_groups = g_count;
  l.tokens = tokens;
  int start = 0;
  for (int g = 0; g < g_count; ++g) {
    const int n = codec->group_dim[g], b = codec->group_bits[g];
    if (n != d / g_count)
      return fail(TQ_ERR_INVALID_ARGUMENT, "%s group %d has %d coordinates; with %d group(s) of "
                  "head_dim %d each group has %d", what, g, n, g_count, d, d / g_count);
    if (b < 1 || b > 4)
      return fail(TQ_ERR_UNSUPPORTED_BITS, "%s group %d has %d bits per coordinate; use 1, 2, 3 "
                  "or 4", what, g, b);
    if (g_count == 2 && codec->group_bits[0] != codec->group_bits[1] + 1)
      return fail(TQ_ERR_UNSUPPORTED_BITS, "%s fractional width needs group bits {b+1, b}, got "
                  "{%d, %d}", what, codec->group_bits[0], codec->group_bits[1]);
    GroupLayout& gl = l.group[g];
    gl.start = start;
    gl.dim = n;
    gl.bits = b;
    gl.lo_bits = b == 3 ? 2 : b;
    gl.lo_row_bytes = n * gl.lo_bits / 8;
    gl.hi_row_bytes = b == 3 ? n / 8 : 0;
    start += n;
    const int levels = 1 << b;
    for (int k = 0; k < levels; ++k) {
      l.codebook[g][k] = codec->codebook[g][k];
      if (k > 0 && !(codec->codebook[g][k] > codec->codebook[g][k - 1]))
        return fail(TQ_ERR_INVALID_ARGUMENT, "%s group %d codebook is not strictly ascending at "
                    "entry %d", what, g, k);
      if (k > 0)
        l.boundary[g][k - 1] =
            static_cast<float>((double(codec->codebook[g][k - 1]) + double(codec->codebook[g][k])) / 2.0);
    }
  }
  l.seed = codec->seed;
  l.perm = codec->perm;
  l.mean = codec->mean;
  l.scale = codec->scale;
  place_planes(&l);
  *out = l;
  return TQ_OK;
}

CodecLayout relayout(const CodecLayout& layout, int tokens) {
  CodecLayout l = layout;
  l.tokens = tokens;
  place_planes(&l);
  return l;
}

}  // namespace tq

extern "C" int64_t tq_page_bytes(const tq_codec* codec, int32_t tokens_per_block) {
  tq::CodecLayout l;
  if (tq::make_layout(codec, tokens_per_block, "page", &l) != TQ_OK) return -1;
  return l.page_bytes;
}
