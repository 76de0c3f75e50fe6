// layout.cpp: validation of tq_codec and the page offsets of FORMAT.md section 5.
#include "layout.h"

#include "tile_decode.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>

#include "codec.h"
#include "errors.h"

namespace tq {

tq_status make_layout(const tq_codec* codec, int tokens, const char* what, CodecLayout* out) {
  if (!codec) return fail(TQ_ERR_NULL_POINTER, "the %s codec is NULL", what);
  TQ_TRY(check_codec_shape(*codec, what));  // head_dim and the groups of a width (tq_codec_init's)
  if (tokens <= 0 || tokens % 16)
    return fail(TQ_ERR_INVALID_ARGUMENT, "tokens_per_block %d must be a positive multiple of 16",
                tokens);
  const int d = codec->head_dim;
  const int g_count = codec->num_groups;
  CodecLayout l{};
  l.head_dim = d;
  for (int g = 0; g < g_count; ++g) {
    const int b = codec->group_bits[g];
    const int levels = 1 << b;
    const float* c = codec->codebook[g];
    const int bad = first_bad_level(c, levels);
    if (bad >= 0)
      return fail(TQ_ERR_INVALID_ARGUMENT, "%s group %d codebook is not finite and strictly "
                  "ascending at entry %d", what, g, bad);
    // FORMAT.md section 1: the levels as read, on the 8-bit grid of the largest magnitude m.
    const double m = std::max(std::fabs(double(c[0])), std::fabs(double(c[levels - 1])));
    l.grid_step[g] = static_cast<float>(m / 127.0);
    for (int k = 0; k < levels; ++k) {
      const double i = std::nearbyint(double(c[k]) * 127.0 / m);
      l.codebook[g][k] = static_cast<float>(i * m / 127.0);
      l.grid_low[g][k / 4] |= uint32_t(int(i) + 128) << (8 * (k % 4));
      if (k > 0 && !(l.codebook[g][k] > l.codebook[g][k - 1]))
        return fail(TQ_ERR_INVALID_ARGUMENT, "%s group %d codebook entries %d and %d fall on the "
                    "same step of its 8-bit grid (FORMAT.md section 1); its levels are too close",
                    what, g, k - 1, k);
      if (k > 0)
        l.boundary[g][k - 1] =
            static_cast<float>((double(l.codebook[g][k - 1]) + double(l.codebook[g][k])) / 2.0);
    }
    // The split pass looks up 4- and 5-bit levels in pairs of neighbours 2j, 2j + 1 of one sign
    // (tile_decode.cuh, paired_word): every codebook with an even number of negative levels.
    if (b < 4) {
      std::copy(std::begin(l.grid_low[g]), std::end(l.grid_low[g]), std::begin(l.grid_lookup[g]));
      continue;
    }
    const int negative = int(std::count_if(l.codebook[g], l.codebook[g] + levels, [](float c) { return c < 0.0f; }));
    if (negative % 2)
      return fail(TQ_ERR_INVALID_ARGUMENT, "%s group %d: a %d-bit codebook needs an even number of "
                  "negative levels on its 8-bit grid, this one has %d (FORMAT.md section 1); move "
                  "one level across zero", what, g, b, negative);
    for (int half = 0; half < levels / 16; ++half)
      for (int w = 0; w < 4; ++w)
        l.grid_lookup[g][4 * half + w] =
            paired_word(*reinterpret_cast<const uint32_t(*)[4]>(&l.grid_low[g][4 * half]), w);
  }
  static_cast<PageShape&>(l) =
      page_shape(d, g_count, codec->group_bits[0], codec->group_bits[g_count - 1], tokens);
  l.seed = codec->seed;
  l.perm = codec->perm;
  l.mean = codec->mean;
  l.scale = codec->scale;
  const int pairs = codec->rotary_pairs;
  if (pairs < 0 || pairs > TQ_MAX_ROTARY_PAIRS)
    return fail(TQ_ERR_INVALID_ARGUMENT, "%s codec has %d rotary pairs; use 0 to %d", what, pairs,
                TQ_MAX_ROTARY_PAIRS);
  if (pairs) {
    if (!codec->rotary_channel || !codec->rotary_freq || !codec->rotary_mean)
      return fail(TQ_ERR_NULL_POINTER, "%s codec has %d rotary pairs but a NULL rotary_channel, "
                  "rotary_freq or rotary_mean", what, pairs);
    if ((reinterpret_cast<uintptr_t>(codec->rotary_channel) | reinterpret_cast<uintptr_t>(codec->rotary_freq) |
         reinterpret_cast<uintptr_t>(codec->rotary_mean)) % 4)
      return fail(TQ_ERR_MISALIGNED, "%s codec's rotary arrays must be 4-byte aligned", what);
  }
  l.rotary_pairs = pairs;
  l.rotary_channel = codec->rotary_channel;
  l.rotary_freq = codec->rotary_freq;
  l.rotary_mean = codec->rotary_mean;
  *out = l;
  return TQ_OK;
}

CodecLayout relayout(const CodecLayout& layout, int tokens) {
  CodecLayout l = layout;
  static_cast<PageShape&>(l) = page_shape(layout.head_dim, layout.num_groups, layout.group[0].bits,
                                          layout.group[layout.num_groups - 1].bits, tokens);
  return l;
}

}  // namespace tq

extern "C" int64_t tq_page_bytes(const tq_codec* codec, int32_t tokens_per_block) {
  tq::CodecLayout l;
  if (tq::make_layout(codec, tokens_per_block, "page", &l) != TQ_OK) return -1;
  return l.page_bytes;
}

extern "C" tq_status tq_codebook_levels(const tq_codec* codec, int32_t group, float* levels) {
  tq::CodecLayout l;
  TQ_TRY(tq::make_layout(codec, 16, "codebook", &l));
  if (!levels) return tq::fail(TQ_ERR_NULL_POINTER, "tq_codebook_levels: levels is NULL");
  if (group < 0 || group >= l.num_groups)
    return tq::fail(TQ_ERR_INVALID_ARGUMENT, "tq_codebook_levels: group %d of a codec with %d "
                    "group(s)", group, l.num_groups);
  for (int k = 0; k < (1 << l.group[group].bits); ++k) levels[k] = l.codebook[group][k];
  return TQ_OK;
}
