// codec_layout.h: the groups of a KV width (docs/FORMAT.md section 2) as the C ABI's tq_codec.
// The plugin needs them at build time (pool head size) before any kernel runs.
#pragma once

#include "tq/tq_kernels.h"

#include <cstdint>
#include <string>

namespace tq::plugin {

// Widths are carried as twice their value so 2.5 and 3.5 stay exact integers.
bool isSupportedWidthX2(int32_t widthX2);
std::string widthText(int32_t widthX2);    // "3", "3.5"
std::string supportedWidthsText();         // "1, 1.5, 2, ..., 4"

// Groups, group dims and bits for `widthX2` at `headDim`; codebooks, seed and pointers left empty.
tq_codec codecShape(int32_t widthX2, int32_t headDim);
int32_t codebookSize(tq_codec const& codec, int32_t group);  // 2^bits of that group
int32_t codebookEntries(tq_codec const& codec);              // over all groups
// Packed bytes of one token of one head: sum over groups of (n_g * b_g / 8 + 2).
int64_t bytesPerToken(tq_codec const& codec);

}  // namespace tq::plugin
