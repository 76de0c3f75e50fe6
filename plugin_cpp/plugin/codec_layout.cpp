#include "codec_layout.h"

#include <cstring>

namespace tq::plugin {

namespace {
constexpr int32_t kSupportedWidthsX2[] = {2, 3, 4, 5, 6, 7, 8, 9, 10};  // FORMAT.md section 2
constexpr int64_t kNormBytes = 2;  // one fp16 norm per group and token
}  // namespace

bool isSupportedWidthX2(int32_t widthX2) {
  for (int32_t w : kSupportedWidthsX2)
    if (w == widthX2) return true;
  return false;
}

std::string widthText(int32_t widthX2) {
  return std::to_string(widthX2 / 2) + (widthX2 % 2 ? ".5" : "");
}

std::string supportedWidthsText() {
  std::string text;
  for (int32_t w : kSupportedWidthsX2) text += (text.empty() ? "" : ", ") + widthText(w);
  return text;
}

tq_codec codecShape(int32_t widthX2, int32_t headDim) {
  tq_codec codec;
  std::memset(&codec, 0, sizeof(codec));
  codec.head_dim = headDim;
  if (widthX2 % 2 == 0) {
    codec.num_groups = 1;
    codec.group_dim[0] = headDim;
    codec.group_bits[0] = widthX2 / 2;
  } else {  // fractional: the outlier half gets ceil(w) bits, the rest floor(w)
    codec.num_groups = 2;
    codec.group_dim[0] = codec.group_dim[1] = headDim / 2;
    codec.group_bits[0] = widthX2 / 2 + 1;
    codec.group_bits[1] = widthX2 / 2;
  }
  return codec;
}

int32_t codebookSize(tq_codec const& codec, int32_t group) { return 1 << codec.group_bits[group]; }

int32_t codebookEntries(tq_codec const& codec) {
  int32_t n = 0;
  for (int32_t g = 0; g < codec.num_groups; ++g) n += codebookSize(codec, g);
  return n;
}

int64_t bytesPerToken(tq_codec const& codec) {
  int64_t bytes = 0;
  for (int32_t g = 0; g < codec.num_groups; ++g)
    bytes += int64_t(codec.group_dim[g]) * codec.group_bits[g] / 8 + kNormBytes;
  return bytes;
}

}  // namespace tq::plugin
