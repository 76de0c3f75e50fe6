// codec_layout.h: one side (K or V) of a layer as the C ABI's tq_codec. The rule width -> groups
// (docs/FORMAT.md section 2) is the kernel library's (tq_codec_init); the plugin needs the shape at
// build time (pool head size, table sizes) before any kernel runs.
#pragma once

#include "tq/tq_kernels.h"

#include <cstdint>
#include <string>

namespace tq::plugin {

// Widths are carried as twice their value so 2.5 and 3.5 stay exact integers.
std::string widthText(int32_t widthX2);  // "3", "3.5"

// `codec` for `widthX2` at `headDim` with `seed` and `codebooks` (`entries` values, all groups'
// levels back to back; nullptr: zeros, for the shape alone). False with `error` naming the bad
// value and the supported ones.
bool initCodec(tq_codec& codec, int32_t headDim, int32_t widthX2, uint32_t seed, float const* codebooks,
               int32_t entries, std::string& error);
int32_t codebookSize(tq_codec const& codec, int32_t group);  // 2^bits of that group
int32_t codebookEntries(tq_codec const& codec);              // over all groups
// Packed bytes of one token of one head: sum over groups of (n_g * b_g / 8 + 2).
int64_t bytesPerToken(tq_codec const& codec);

}  // namespace tq::plugin
