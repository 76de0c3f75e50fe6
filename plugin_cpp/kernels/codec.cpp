// codec.cpp: the rule width -> groups of FORMAT.md section 2 and the tq_codec built from it
// (tq_codec_init and its helpers). Host only: the plugin's and the Python binding's one copy.
#include "codec.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "last_error.h"

namespace {

constexpr int kNormBytes = 2;  // one fp16 norm per group and token
constexpr int kMinWidthX2 = 2, kMaxWidthX2 = 2 * TQ_MAX_BITS;

// head_dim one the kernels have, else an error prefixed with `what`.
tq_status check_head_dim(const char* what, int32_t d) {
  if (d == 64 || d == 128) return TQ_OK;
  return tq::fail(TQ_ERR_UNSUPPORTED_HEAD_DIM, "%s head_dim %d is not supported by the CUDA kernels; "
                  "supported head dims are 64 and 128", what, d);
}

std::string width_text(int32_t width_x2) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", width_x2 / 2.0);
  return text;
}

std::string supported_widths_text() {
  std::string text;
  for (int32_t w = kMinWidthX2; w <= kMaxWidthX2; ++w)
    text += (w == kMinWidthX2 ? "" : w == kMaxWidthX2 ? " and " : ", ") + width_text(w);
  return text;
}

// "64 x 3 bits, 64 x 2 bits"
std::string groups_text(const tq_codec& c) {
  std::string text;
  for (int g = 0; g < c.num_groups; ++g)
    text += (g ? ", " : "") + std::to_string(c.group_dim[g]) + " x " + std::to_string(c.group_bits[g]) + " bits";
  return text;
}

// head_dim and width_x2 supported, else an error prefixed with `fn`.
tq_status check_width(const char* fn, int32_t head_dim, int32_t width_x2) {
  TQ_TRY(check_head_dim(fn, head_dim));
  if (width_x2 < kMinWidthX2 || width_x2 > kMaxWidthX2)
    return tq::fail(TQ_ERR_UNSUPPORTED_BITS, "%s width_x2 %d (a width of %s bits) is not supported; "
                    "supported widths are %s (width_x2 %d to %d)", fn, width_x2,
                    width_text(width_x2).c_str(), supported_widths_text().c_str(), kMinWidthX2, kMaxWidthX2);
  return TQ_OK;
}

// FORMAT.md section 2: an integer width b is one group (d, b); a fractional width w is two halves,
// the outlier half first: (d/2, ceil(w)), (d/2, floor(w)). Everything else zero.
tq_codec shape_of(int32_t head_dim, int32_t width_x2) {
  tq_codec c;
  std::memset(&c, 0, sizeof(c));
  c.head_dim = head_dim;
  if (width_x2 % 2 == 0) {
    c.num_groups = 1;
    c.group_dim[0] = head_dim;
    c.group_bits[0] = width_x2 / 2;
  } else {
    c.num_groups = 2;
    c.group_dim[0] = c.group_dim[1] = head_dim / 2;
    c.group_bits[0] = width_x2 / 2 + 1;
    c.group_bits[1] = width_x2 / 2;
  }
  return c;
}

int32_t entries_of(const tq_codec& c) {
  int32_t n = 0;
  for (int g = 0; g < c.num_groups; ++g) n += 1 << c.group_bits[g];
  return n;
}

}  // namespace

namespace tq {

tq_status check_codec_shape(const tq_codec& codec, const char* what) {
  const int32_t d = codec.head_dim, groups = codec.num_groups;
  TQ_TRY(check_head_dim(what, d));
  if (groups != 1 && groups != 2)
    return fail(TQ_ERR_INVALID_ARGUMENT, "%s codec has %d groups; use 1 (integer widths) or 2 "
                "(fractional widths)", what, groups);
  for (int g = 0; g < groups; ++g)
    if (codec.group_bits[g] < 1 || codec.group_bits[g] > TQ_MAX_BITS)
      return fail(TQ_ERR_UNSUPPORTED_BITS, "%s group %d has %d bits per coordinate; use 1 to %d",
                  what, g, codec.group_bits[g], TQ_MAX_BITS);
  // The one width these bits can be, and whether its groups are the codec's.
  const int32_t width_x2 = groups == 1 ? 2 * codec.group_bits[0] : codec.group_bits[0] + codec.group_bits[1];
  const tq_codec expected = shape_of(d, width_x2);
  bool same = expected.num_groups == groups;
  for (int g = 0; same && g < groups; ++g)
    same = expected.group_dim[g] == codec.group_dim[g] && expected.group_bits[g] == codec.group_bits[g];
  if (!same)
    return fail(TQ_ERR_UNSUPPORTED_BITS, "%s codec's groups (%s) are not those of a width at head_dim "
                "%d (FORMAT.md section 2); width %s has %s: fill the codec with tq_codec_init", what,
                groups_text(codec).c_str(), d, width_text(width_x2).c_str(), groups_text(expected).c_str());
  return TQ_OK;
}

int first_bad_level(const float* levels, int count) {
  for (int k = 0; k < count; ++k)
    if (!std::isfinite(levels[k]) || (k > 0 && !(levels[k] > levels[k - 1]))) return k;
  return -1;
}

}  // namespace tq

extern "C" tq_status tq_codec_init(tq_codec* codec, int32_t head_dim, int32_t width_x2, uint32_t seed,
                                   const float* codebooks, int32_t num_codebook_entries) {
  const char* fn = "tq_codec_init:";
  if (!codec) return tq::fail(TQ_ERR_NULL_POINTER, "%s codec is NULL", fn);
  TQ_TRY(check_width(fn, head_dim, width_x2));
  tq_codec c = shape_of(head_dim, width_x2);
  const int32_t entries = entries_of(c);
  if (!codebooks && num_codebook_entries != 0)
    return tq::fail(TQ_ERR_NULL_POINTER, "%s codebooks is NULL but num_codebook_entries is %d; pass "
                    "the %d levels of width %s, or NULL with 0 for a codec without codebooks", fn,
                    num_codebook_entries, entries, width_text(width_x2).c_str());
  if (codebooks && num_codebook_entries != entries)
    return tq::fail(TQ_ERR_INVALID_ARGUMENT, "%s num_codebook_entries %d, but width %s at head_dim %d "
                    "takes %d (2^b levels of each group, back to back: %s)", fn, num_codebook_entries,
                    width_text(width_x2).c_str(), head_dim, entries, groups_text(c).c_str());
  for (int g = 0, first = 0; codebooks && g < c.num_groups; ++g) {
    const float* levels = codebooks + first;
    const int n = 1 << c.group_bits[g];
    const int k = tq::first_bad_level(levels, n);
    if (k >= 0 && !std::isfinite(levels[k]))
      return tq::fail(TQ_ERR_INVALID_ARGUMENT, "%s codebook entry %d (group %d, level %d) is %g; "
                      "every level must be finite", fn, first + k, g, k, levels[k]);
    if (k >= 0)
      return tq::fail(TQ_ERR_INVALID_ARGUMENT, "%s codebook entry %d (group %d, level %d) is %g, not "
                      "above the level before it (%g); each group's levels must be strictly ascending",
                      fn, first + k, g, k, levels[k], levels[k - 1]);
    std::memcpy(c.codebook[g], levels, n * sizeof(float));
    first += n;
  }
  c.seed = seed;
  *codec = c;
  return TQ_OK;
}

extern "C" int32_t tq_codec_codebook_entries(int32_t head_dim, int32_t width_x2) {
  if (check_width("tq_codec_codebook_entries:", head_dim, width_x2) != TQ_OK) return -1;
  return entries_of(shape_of(head_dim, width_x2));
}

extern "C" int64_t tq_codec_token_bytes(const tq_codec* codec) {
  const char* fn = "tq_codec_token_bytes:";
  if (!codec) return tq::fail(TQ_ERR_NULL_POINTER, "%s codec is NULL", fn), -1;
  if (tq::check_codec_shape(*codec, fn) != TQ_OK) return -1;
  int64_t bytes = 0;
  for (int g = 0; g < codec->num_groups; ++g)
    bytes += int64_t(codec->group_dim[g]) * codec->group_bits[g] / 8 + kNormBytes;
  return bytes;
}
