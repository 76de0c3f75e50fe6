// plugin_shapes.h: what the plugin accepts and produces at build time (types, formats, shapes) and
// how its workspace is carved up; shared by the build-time methods and enqueue.
#pragma once

#include "plugin_config.h"

#include <NvInferRuntime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace tq::plugin {

// The pool's "head size" in bytes of the declared INT8 KV dtype: the wider of K and V per token, so
// one TensorRT-LLM block (K or V) of Hkv x tokens_per_block tokens holds a packed chunk exactly.
int64_t poolHeadSizeBytes(PluginConfig const& config);
// Bytes of one chunk (one block's K or V of this layer) in the TensorRT-LLM pool.
int64_t poolChunkBytes(PluginConfig const& config);
// Elements in one qkv row: (Hq + 2 Hkv) * head_dim.
int64_t qkvWidth(PluginConfig const& config);

bool isActivationType(nvinfer1::DataType type);  // fp16 or bf16
bool supportsFormat(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs);

// Checks the ranks and the fixed extents of the inputs; `error` names the input.
bool checkInputShapes(PluginConfig const& config, nvinfer1::Dims const* dims, int32_t nbInputs, std::string& error);

// Byte offsets into the workspace for one enqueue of `numTokens` tokens in `batch` requests whose
// KV lengths stay at or below `maxKvLen`. Every region starts 256-byte aligned.
struct WorkspaceLayout {
  size_t metadata;         // int32 pos[num_tokens], seq_idx[num_tokens], kv_lens[batch]
  size_t q;                // rotated queries [num_tokens][Hq][head_dim]
  size_t kv;               // rotated keys and values [num_tokens][2][Hkv][head_dim]
  size_t attention;        // the attention kernels' scratch
  size_t attentionBytes;
  size_t total;
};
WorkspaceLayout workspaceLayout(PluginConfig const& config, int64_t numTokens, int64_t batch, int64_t maxKvLen,
                                size_t activationBytes);

}  // namespace tq::plugin
