// attention_enqueue.h: one forward step of the layer over a mixed batch, on the kernel library:
// RoPE, quantize-append of every new token, prefill attention per context request, one decode
// attention over all generation requests.
#pragma once

#include "device_tables.h"
#include "plugin_config.h"

#include <NvInferRuntime.h>

namespace tq::plugin {

// Returns 0 on success; on bad input or a kernel error logs a message and returns non-zero.
int32_t enqueueAttention(PluginConfig const& config, DeviceTables& tables, nvinfer1::PluginTensorDesc const* inputDesc,
                         void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream);

}  // namespace tq::plugin
