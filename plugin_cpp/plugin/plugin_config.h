// plugin_config.h: the QuantizedAttention plugin's fields, parsed and checked as one consistent set.
// The fields are declared once, in tq_trtllm/trt/quantized_attention_fields.json, from which CMake
// generates quantized_attention_fields.h (plugin_fields.cmake); their rules: docs/PLUGIN.md,
// section "Fields". The layer's identity and codecs come from the layer table alone.
#pragma once

#include "layer_table.h"
#include "tq/tq_rope.h"

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tq::plugin {

struct PluginConfig {
  int32_t tokensPerBlock = 0;
  tq_rope_params rope{};
  std::vector<uint8_t> tableBytes;  // the layer_table field, kept for serialization
  LayerTable table;                 // and parsed: layer, heads, head_dim, widths, seed, fingerprint, arrays
};

// Parses `fc` and checks every field and their consistency. On failure returns false and sets
// `error` to a message that names the offending field.
bool parsePluginConfig(nvinfer1::PluginFieldCollection const* fc, PluginConfig& config, std::string& error);

// Every field of `config`, pointing into `config` (which must outlive the returned vector).
std::vector<nvinfer1::PluginField> configFields(PluginConfig const& config);

// The fields the creator advertises: names and types, no data.
std::vector<nvinfer1::PluginField> fieldDeclarations();

}  // namespace tq::plugin
