// calib_table.h: the binary form of one layer's calibration table, as the plugin's
// "calibration_table" field (PluginFieldType::kUNKNOWN) carries it. Byte layout: docs/PLUGIN.md,
// section "Calibration table field"; the Python writer is tq_trtllm/trt/calib_table.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tq::plugin {

constexpr uint32_t kCalibTableVersion = 3;  // 2: query heads and the page shift; 3: the rotary mean
constexpr size_t kCalibTableHeaderBytes = 64;

enum CalibTableFlags : uint32_t {
  kKeyMean = 1u << 0,
  kKeyScale = 1u << 1,
  kKeyPerm = 1u << 2,
  kValueMean = 1u << 3,
  kValueScale = 1u << 4,
  kValuePerm = 1u << 5,
  kPageShift = 1u << 6,
  kKeyRotary = 1u << 7,
};
// The largest page shift a table may hold (tq_trtllm's MAX_PAGE_LSE_SHIFT): more means damage.
constexpr float kMaxPageShift = 4.0f;

// The per-channel arrays of K or V; an empty vector means "absent" (zeros, ones, identity).
struct CalibSide {
  std::vector<float> codebooks;  // groups' centroids back to back, 2^b_g each, ascending
  std::vector<float> mean;       // [num_kv_heads][head_dim]
  std::vector<float> scale;      // [num_kv_heads][head_dim], > 0
  std::vector<int32_t> perm;     // [num_kv_heads][head_dim], fractional widths only
};

struct CalibTable {
  uint64_t modelFingerprint = 0;
  int32_t layerIdx = 0;
  int32_t numKvHeads = 0;
  int32_t numQHeads = 0;
  int32_t headDim = 0;
  int32_t keyWidthX2 = 0;    // width * 2
  int32_t valueWidthX2 = 0;
  CalibSide key;
  CalibSide value;
  std::vector<float> pageShift;  // [numQHeads] (tq_paged_cache::page_lse_shift), or empty
  // The keys' rotary mean (tq_codec::rotary_*), or rotaryPairs 0 and empty arrays.
  int32_t rotaryPairs = 0;
  std::vector<int32_t> rotaryChannel;  // [numKvHeads][rotaryPairs]
  std::vector<float> rotaryFreq;       // [numKvHeads][rotaryPairs]
  std::vector<float> rotaryMean;       // [numKvHeads][rotaryPairs][2]
};

// Parses and checks the table on its own terms (magic, versions, sizes, checksum, values).
// On failure returns false and sets `error` to a sentence naming what is wrong.
bool parseCalibTable(void const* data, size_t bytes, CalibTable& table, std::string& error);
std::vector<uint8_t> serializeCalibTable(CalibTable const& table);

}  // namespace tq::plugin
