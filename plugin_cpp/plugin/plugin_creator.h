// plugin_creator.h: the IPluginCreatorV3One of QuantizedAttention. Both phases create the plugin
// from the same fields: at build time from the network definition, at run time from the fields
// getFieldsToSerialize() stored in the engine.
#pragma once

#include <NvInferRuntime.h>

#include <vector>

namespace tq::plugin {

class QuantizedAttentionCreator : public nvinfer1::IPluginCreatorV3One {
 public:
  QuantizedAttentionCreator();

  nvinfer1::IPluginV3* createPlugin(char const* name, nvinfer1::PluginFieldCollection const* fc,
                                    nvinfer1::TensorRTPhase phase) noexcept override;
  nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override { return &mFieldNames; }
  char const* getPluginName() const noexcept override;
  char const* getPluginVersion() const noexcept override;
  char const* getPluginNamespace() const noexcept override;

 private:
  std::vector<nvinfer1::PluginField> mFieldDeclarations;
  nvinfer1::PluginFieldCollection mFieldNames{};
};

// The one creator instance both library variants hand to TensorRT.
QuantizedAttentionCreator& pluginCreator();

}  // namespace tq::plugin
