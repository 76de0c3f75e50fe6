// codec.h: the checks behind tq_codec_init and tq_codec_token_bytes, for the library's other
// validations of a tq_codec (layout.cpp).
#pragma once

#include "tq/tq_kernels.h"

namespace tq {

// TQ_OK when codec's head_dim, group count, group dims and bits are those tq_codec_init gives for
// some width (FORMAT.md section 2); else an error whose message starts with `what` ("key", ...).
tq_status check_codec_shape(const tq_codec& codec, const char* what);

// The first of `count` levels that is not finite or not above the one before it, or -1 if none.
int first_bad_level(const float* levels, int count);

}  // namespace tq
