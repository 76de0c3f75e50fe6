#include "codec_layout.h"

#include <cstring>

namespace tq::plugin {

namespace {
constexpr int32_t kSupportedWidthsX2[] = {2, 3, 4, 5, 6, 7, 8, 9, 10};  // FORMAT.md section 2
constexpr int64_t kNormBytes = 2;  // one fp16 norm per group and token

bool isSupportedWidthX2(int32_t widthX2) {
  for (int32_t w : kSupportedWidthsX2)
    if (w == widthX2) return true;
  return false;
}

std::string supportedWidthsText() {
  std::string text;
  for (int32_t w : kSupportedWidthsX2) text += (text.empty() ? "" : ", ") + widthText(w);
  return text;
}
}  // namespace

std::string widthText(int32_t widthX2) {
  return std::to_string(widthX2 / 2) + (widthX2 % 2 ? ".5" : "");
}

bool initCodec(tq_codec& codec, int32_t headDim, int32_t widthX2, uint32_t seed, float const* codebooks,
               int32_t entries, std::string& error) {
  std::memset(&codec, 0, sizeof(codec));
  if (!isSupportedWidthX2(widthX2)) {
    error = "width " + std::to_string(widthX2 / 2.0) + " is not supported; supported: " + supportedWidthsText();
    return false;
  }
  codec.head_dim = headDim;
  codec.seed = seed;
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
  if (codebooks && entries != codebookEntries(codec)) {
    error = "codebooks hold " + std::to_string(entries) + " entries, not " + std::to_string(codebookEntries(codec));
    return false;
  }
  if (codebooks) {
    int32_t at = 0;
    for (int32_t g = 0; g < codec.num_groups; ++g)
      for (int32_t k = 0; k < codebookSize(codec, g); ++k) codec.codebook[g][k] = codebooks[at++];
  }
  return true;
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
