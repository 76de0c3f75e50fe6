// errors.cpp: the launch check and the format-version check.
#include "errors.h"

namespace tq {

tq_status check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return fail(TQ_ERR_CUDA, "%s: CUDA launch failed: %s", what, cudaGetErrorString(err));
  return TQ_OK;
}

}  // namespace tq

extern "C" tq_status tq_check_format_version(int32_t version) {
  if (!TQ_READS_FORMAT_VERSION(version))
    return tq::fail(TQ_ERR_FORMAT_VERSION,
                    "packed cache format version %d is not readable by this tq_kernels library, "
                    "which reads versions %d to %d; rebuild the engine or tables with this version",
                    version, TQ_OLDEST_READABLE_FORMAT_VERSION, TQ_FORMAT_VERSION);
  return TQ_OK;
}
