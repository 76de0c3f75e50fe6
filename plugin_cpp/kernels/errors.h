// errors.h: the error helpers of the CUDA units: last_error.h's, and the launch check.
#pragma once

#include <cuda_runtime.h>

#include "last_error.h"
#include "tq/tq_kernels.h"

namespace tq {

// TQ_OK, or TQ_ERR_CUDA naming `what` if the last launch on this thread failed.
tq_status check_launch(const char* what);

}  // namespace tq
