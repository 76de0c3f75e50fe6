// layer_table.h: the layer table, one layer's calibration and identity in binary form, as the
// plugin's "layer_table" field (PluginFieldType::kUNKNOWN) carries it. It is the only source of the
// layer's index, heads, head_dim, widths, rotation seed and model fingerprint. Byte layout:
// docs/PLUGIN.md, section "Layer table field"; the Python writer is
// tq_trtllm.trt.plugin_fields.layer_table_bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tq::plugin {

// 2: query heads and the page shift; 3: the rotary mean; 4: the rotation seed (the layer's identity
// and codecs come from the table alone).
constexpr uint32_t kLayerTableVersion = 4;
constexpr size_t kLayerTableHeaderBytes = 72;

enum LayerTableFlags : uint32_t {
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
struct LayerTableSide {
  std::vector<float> codebooks;  // groups' centroids back to back, 2^b_g each, ascending
  std::vector<float> mean;       // [num_kv_heads][head_dim]
  std::vector<float> scale;      // [num_kv_heads][head_dim], > 0
  std::vector<int32_t> perm;     // [num_kv_heads][head_dim], fractional widths only
};

struct LayerTable {
  uint64_t modelFingerprint = 0;
  int32_t layerIdx = 0;      // the row of host_kv_cache_pool_mapping this layer reads
  int32_t numKvHeads = 0;
  int32_t numQHeads = 0;     // 1 to TQ_MAX_GQA_GROUP times numKvHeads
  int32_t headDim = 0;       // 64 or 128
  int32_t keyWidthX2 = 0;    // width * 2, so 2.5 and 3.5 stay exact integers
  int32_t valueWidthX2 = 0;
  uint32_t rotationSeed = 0; // FORMAT.md section 4's seed, shared by K and V of the layer
  LayerTableSide key;
  LayerTableSide value;
  std::vector<float> pageShift;  // [numQHeads] (tq_paged_cache::page_lse_shift), or empty
  // The keys' rotary mean (tq_codec::rotary_*), or rotaryPairs 0 and empty arrays.
  int32_t rotaryPairs = 0;
  std::vector<int32_t> rotaryChannel;  // [numKvHeads][rotaryPairs]
  std::vector<float> rotaryFreq;       // [numKvHeads][rotaryPairs]
  std::vector<float> rotaryMean;       // [numKvHeads][rotaryPairs][2]
};

// Parses and checks the table on its own terms (magic, versions, sizes, checksum) and against what
// the kernels support (head_dim, heads, widths, values). On failure returns false and sets `error`
// to a sentence naming what is wrong.
bool parseLayerTable(void const* data, size_t bytes, LayerTable& table, std::string& error);
std::vector<uint8_t> serializeLayerTable(LayerTable const& table);

}  // namespace tq::plugin
