#include "device_tables.h"

#include "codec_layout.h"

#include <cstring>

namespace tq::plugin {

namespace {
bool cudaOk(cudaError_t status, char const* what, std::string& error) {
  if (status == cudaSuccess) return true;
  error = std::string(what) + " failed: " + cudaGetErrorString(status);
  return false;
}
}  // namespace

DeviceTables::~DeviceTables() {
  // Errors here cannot be reported to anyone; the memory is released either way.
  for (void* p : mAllocations) cudaFree(p);
  if (mStagingFree) {
    cudaEventSynchronize(mStagingFree);
    cudaEventDestroy(mStagingFree);
  }
  if (mStaging) cudaFreeHost(mStaging);
}

template <typename T>
bool DeviceTables::upload(std::vector<T> const& host, T const*& device, std::string& error) {
  device = nullptr;
  if (host.empty()) return true;  // absent: the kernels use zeros, ones or the identity
  void* p = nullptr;
  if (!cudaOk(cudaMalloc(&p, host.size() * sizeof(T)), "cudaMalloc of a calibration array", error)) return false;
  mAllocations.push_back(p);
  if (!cudaOk(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              "copying a calibration array to the device", error))
    return false;
  device = static_cast<T const*>(p);
  return true;
}

bool DeviceTables::uploadSide(LayerTableSide const& side, int32_t widthX2, LayerTable const& table, tq_codec& codec,
                              std::string& error) {
  if (!initCodec(codec, table.headDim, widthX2, table.rotationSeed, side.codebooks.data(),
                 int32_t(side.codebooks.size()), error))
    return false;
  return upload(side.perm, codec.perm, error) && upload(side.mean, codec.mean, error) &&
         upload(side.scale, codec.scale, error);
}

bool DeviceTables::ensureUploaded(PluginConfig const& config, std::string& error) {
  if (mUploaded) return true;
  if (!uploadSide(config.table.key, config.table.keyWidthX2, config.table, mKey, error) ||
      !uploadSide(config.table.value, config.table.valueWidthX2, config.table, mValue, error) ||
      !upload(config.table.pageShift, mPageShift, error) ||
      !upload(config.table.rotaryChannel, mKey.rotary_channel, error) ||
      !upload(config.table.rotaryFreq, mKey.rotary_freq, error) ||
      !upload(config.table.rotaryMean, mKey.rotary_mean, error))
    return false;
  mKey.rotary_pairs = config.table.rotaryPairs;
  mUploaded = true;
  return true;
}

bool DeviceTables::uploadMetadata(std::vector<int32_t> const& metadata, void* device, cudaStream_t stream,
                                  std::string& error) {
  if (!mStagingFree &&
      !cudaOk(cudaEventCreateWithFlags(&mStagingFree, cudaEventDisableTiming), "cudaEventCreate", error))
    return false;
  if (!cudaOk(cudaEventSynchronize(mStagingFree), "waiting for the previous metadata copy", error)) return false;
  if (metadata.size() > mStagingCount) {
    if (mStaging) cudaFreeHost(mStaging);
    mStaging = nullptr;
    mStagingCount = 0;
    if (!cudaOk(cudaMallocHost(reinterpret_cast<void**>(&mStaging), metadata.size() * sizeof(int32_t)),
                "cudaMallocHost of the metadata staging buffer", error))
      return false;
    mStagingCount = metadata.size();
  }
  std::memcpy(mStaging, metadata.data(), metadata.size() * sizeof(int32_t));
  return cudaOk(cudaMemcpyAsync(device, mStaging, metadata.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
                "copying the batch metadata to the device", error) &&
         cudaOk(cudaEventRecord(mStagingFree, stream), "cudaEventRecord", error);
}

}  // namespace tq::plugin
