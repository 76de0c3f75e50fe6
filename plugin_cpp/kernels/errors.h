// errors.h: the per-thread last-error message behind tq_last_error, and the helpers that set it.
#pragma once

#include <cuda_runtime.h>

#include "tq/tq_kernels.h"

namespace tq {

// Records `status` with a printf-style message for tq_last_error and returns it.
tq_status fail(tq_status status, const char* format, ...);

// TQ_OK, or TQ_ERR_CUDA naming `what` if the last launch on this thread failed.
tq_status check_launch(const char* what);

}  // namespace tq

// Evaluates a tq_status expression and returns it from the caller when it is not TQ_OK.
#define TQ_TRY(expr)                       \
  do {                                     \
    tq_status tq_try_status_ = (expr);     \
    if (tq_try_status_ != TQ_OK) return tq_try_status_; \
  } while (0)
