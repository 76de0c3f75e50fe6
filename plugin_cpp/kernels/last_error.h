// last_error.h: the per-thread message behind tq_last_error and the helper that sets it. Host only
// (no CUDA headers), so the library's host-only part (tq_codec_host) builds without the toolkit.
#pragma once

#include "tq/tq_kernels.h"

namespace tq {

// Records `status` with a printf-style message for tq_last_error and returns it.
tq_status fail(tq_status status, const char* format, ...);

}  // namespace tq

// Evaluates a tq_status expression and returns it from the caller when it is not TQ_OK.
#define TQ_TRY(expr)                       \
  do {                                     \
    tq_status tq_try_status_ = (expr);     \
    if (tq_try_status_ != TQ_OK) return tq_try_status_; \
  } while (0)
