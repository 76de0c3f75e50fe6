// quantized_attention_plugin.h: the TensorRT IPluginV3 "QuantizedAttention" (namespace "tq"; name,
// namespace and version generated from tq_trtllm/trt/quantized_attention_fields.json): attention
// over the packed 2-5 bit KV cache of docs/FORMAT.md, with the inputs of TensorRT-LLM 1.2's
// GPTAttention in paged mode (docs/PLUGIN.md).
#pragma once

#include "device_tables.h"
#include "plugin_config.h"
#include "quantized_attention_fields.h"

#include <NvInferRuntime.h>

#include <memory>
#include <vector>

namespace tq::plugin {

class QuantizedAttentionPlugin : public nvinfer1::IPluginV3,
                                 public nvinfer1::IPluginV3OneCore,
                                 public nvinfer1::IPluginV3OneBuild,
                                 public nvinfer1::IPluginV3OneRuntime {
 public:
  explicit QuantizedAttentionPlugin(PluginConfig config);
  QuantizedAttentionPlugin(QuantizedAttentionPlugin const&) = delete;
  QuantizedAttentionPlugin& operator=(QuantizedAttentionPlugin const&) = delete;
  ~QuantizedAttentionPlugin() override = default;

  PluginConfig const& config() const { return mConfig; }

  // IPluginV3
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
  nvinfer1::IPluginV3* clone() noexcept override;

  // IPluginV3OneCore
  char const* getPluginName() const noexcept override { return kPluginName; }
  char const* getPluginVersion() const noexcept override { return kPluginVersion; }
  char const* getPluginNamespace() const noexcept override { return kPluginNamespace; }

  // IPluginV3OneBuild
  int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                          nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
  int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs, nvinfer1::DataType const* inputTypes,
                             int32_t nbInputs) const noexcept override;
  int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
                          int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                          nvinfer1::IExprBuilder& exprBuilder) noexcept override;
  bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
                                 int32_t nbOutputs) noexcept override;
  int32_t getNbOutputs() const noexcept override;
  size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
                          nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

  // IPluginV3OneRuntime
  int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
                        int32_t nbOutputs) noexcept override;
  int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
                  void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
  nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

 private:
  PluginConfig mConfig;
  std::vector<nvinfer1::PluginField> mFields;  // point into mConfig
  nvinfer1::PluginFieldCollection mFieldCollection{};
  std::unique_ptr<DeviceTables> mTables;  // created on first enqueue: never during the build
};

}  // namespace tq::plugin
