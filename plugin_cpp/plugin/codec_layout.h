// codec_layout.h: one side (K or V) of a layer as the C ABI's tq_codec, built by the kernel
// library's tq_codec_init: the rule width -> groups (docs/FORMAT.md section 2) and its checks live
// there once. The plugin needs the shape at build time (pool head size) before any kernel runs.
#pragma once

#include "tq/tq_kernels.h"

#include <cstdint>
#include <string>

namespace tq::plugin {

// Widths are carried as twice their value so 2.5 and 3.5 stay exact integers.
std::string widthText(int32_t widthX2);  // "3", "3.5"

// tq_codec_init: `codec` for `widthX2` at `headDim` with `seed` and `codebooks` (`entries` values,
// all groups' levels back to back; nullptr with 0: zeros, for the shape alone). False with `error`
// set to the library's message, which names the bad value and the supported ones.
bool initCodec(tq_codec& codec, int32_t headDim, int32_t widthX2, uint32_t seed, float const* codebooks,
               int32_t entries, std::string& error);

}  // namespace tq::plugin
