// device_tables.h: one plugin instance's device-side state: the layer table's arrays the kernels read
// (uploaded once, on first use in the runtime phase, never during the build) and a pinned staging
// buffer for the per-step metadata.
#pragma once

#include "plugin_config.h"
#include "tq/tq_kernels.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tq::plugin {

class DeviceTables {
 public:
  DeviceTables() = default;
  DeviceTables(DeviceTables const&) = delete;
  DeviceTables& operator=(DeviceTables const&) = delete;
  ~DeviceTables();

  // Uploads the arrays of `config` if not done yet; fills the codecs. False with `error` on failure.
  bool ensureUploaded(PluginConfig const& config, std::string& error);
  tq_codec const& keyCodec() const { return mKey; }
  tq_codec const& valueCodec() const { return mValue; }
  float const* pageShift() const { return mPageShift; }  // [num_q_heads] or nullptr

  // Copies `metadata` to `device` on `stream` through pinned memory. The previous copy is waited
  // for before its staging buffer is reused, so no host array is read after it changes.
  bool uploadMetadata(std::vector<int32_t> const& metadata, void* device, cudaStream_t stream, std::string& error);

 private:
  bool uploadSide(LayerTableSide const& side, int32_t widthX2, LayerTable const& table, tq_codec& codec,
                  std::string& error);
  template <typename T> bool upload(std::vector<T> const& host, T const*& device, std::string& error);

  bool mUploaded = false;
  tq_codec mKey{};
  tq_codec mValue{};
  float const* mPageShift = nullptr;
  std::vector<void*> mAllocations;
  int32_t* mStaging = nullptr;  // pinned
  size_t mStagingCount = 0;
  cudaEvent_t mStagingFree = nullptr;
};

}  // namespace tq::plugin
