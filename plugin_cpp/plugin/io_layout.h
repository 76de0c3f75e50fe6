// io_layout.h: the plugin's input and output tensors, in order (docs/PLUGIN.md, "Inputs and output").
// Names follow TensorRT-LLM 1.2's GPTAttention inputs so a builder wires the same network tensors.
#pragma once

#include <cstdint>

namespace tq::plugin {

enum InputIndex : int32_t {
  kQkv = 0,                 // [num_tokens, (Hq + 2 Hkv) * head_dim] fp16 / bf16, device
  kHostPastKvLengths = 1,   // [batch] int32, host
  kHostContextLengths = 2,  // [batch] int32, host
  kHostRequestTypes = 3,    // [batch] int32, host: 0 context, 1 generation
  kBlockOffsets = 4,        // [pools, batch, beam 1, 2, max_blocks] int32, device
  kHostPoolPointers = 5,    // [pools, 2] int64, host: primary, secondary pool base
  kHostPoolMapping = 6,     // [layers, 2] int32, host: pool index, layer index in that pool
  kNumInputs = 7,
};
constexpr int32_t kOutput = 0;  // [num_tokens, Hq * head_dim], the dtype of qkv, device
constexpr int32_t kNumOutputs = 1;

inline char const* inputName(int32_t index) {
  static char const* const kNames[kNumInputs] = {
      "qkv", "host_past_key_value_lengths", "host_context_lengths", "host_request_types",
      "kv_cache_block_offsets", "host_kv_cache_pool_pointers", "host_kv_cache_pool_mapping"};
  return index >= 0 && index < kNumInputs ? kNames[index] : "(no such input)";
}

}  // namespace tq::plugin
