#include "codec_layout.h"

namespace tq::plugin {

std::string widthText(int32_t widthX2) {
  return std::to_string(widthX2 / 2) + (widthX2 % 2 ? ".5" : "");
}

bool initCodec(tq_codec& codec, int32_t headDim, int32_t widthX2, uint32_t seed, float const* codebooks,
               int32_t entries, std::string& error) {
  if (tq_codec_init(&codec, headDim, widthX2, seed, codebooks, entries) == TQ_OK) return true;
  error = tq_last_error();
  return false;
}

}  // namespace tq::plugin
