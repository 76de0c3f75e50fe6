// plugin_config.h: the QuantizedAttention plugin's fields, parsed and checked as one consistent set.
// Field names, types and rules: docs/PLUGIN.md, section "Fields".
#pragma once

#include "calib_table.h"
#include "tq/tq_rope.h"

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tq::plugin {

struct PluginConfig {
  int32_t numQHeads = 0;
  int32_t numKvHeads = 0;
  int32_t headDim = 0;
  int32_t layerIdx = 0;
  int32_t tokensPerBlock = 0;
  float keyWidth = 0.f;        // as given (e.g. 3.5), serialized back unchanged
  float valueWidth = 0.f;
  int32_t keyWidthX2 = 0;      // derived: width * 2
  int32_t valueWidthX2 = 0;
  int32_t rotationSeed = 0;    // the uint32 seed of FORMAT.md section 4, bit for bit
  int64_t modelFingerprint = 0;
  tq_rope_params rope{};
  std::vector<uint8_t> tableBytes;  // the calibration_table field, kept for serialization
  CalibTable table;                 // and parsed
};

// Parses `fc` and checks every field and their consistency. On failure returns false and sets
// `error` to a message that names the offending field.
bool parsePluginConfig(nvinfer1::PluginFieldCollection const* fc, PluginConfig& config, std::string& error);

// Every field of `config`, pointing into `config` (which must outlive the returned vector).
std::vector<nvinfer1::PluginField> configFields(PluginConfig const& config);

// The fields the creator advertises: names and types, no data.
std::vector<nvinfer1::PluginField> fieldDeclarations();

}  // namespace tq::plugin
