#include "quantized_attention_plugin.h"

#include "attention_enqueue.h"
#include "io_layout.h"
#include "plugin_log.h"
#include "plugin_shapes.h"

#include <exception>

namespace tq::plugin {

using namespace nvinfer1;

QuantizedAttentionPlugin::QuantizedAttentionPlugin(PluginConfig config) : mConfig(std::move(config)) {
  mFields = configFields(mConfig);
  mFieldCollection.nbFields = int32_t(mFields.size());
  mFieldCollection.fields = mFields.data();
}

IPluginCapability* QuantizedAttentionPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept {
  switch (type) {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
  }
  return nullptr;
}

IPluginV3* QuantizedAttentionPlugin::clone() noexcept {
  try {
    return new QuantizedAttentionPlugin(mConfig);  // device state is per instance, made on first use
  } catch (std::exception const& e) {
    logError(std::string("clone: ") + e.what());
    return nullptr;
  }
}

int32_t QuantizedAttentionPlugin::configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs,
                                                  DynamicPluginTensorDesc const*, int32_t nbOutputs) noexcept {
  if (nbOutputs != kNumOutputs || nbInputs != kNumInputs) {
    logError("configurePlugin: expects " + std::to_string(kNumInputs) + " inputs and 1 output");
    return -1;
  }
  std::vector<Dims> dims(nbInputs);
  for (int32_t i = 0; i < nbInputs; ++i) dims[i] = in[i].desc.dims;
  std::string error;
  if (!checkInputShapes(mConfig, dims.data(), nbInputs, error)) {
    logError("configurePlugin: " + error);
    return -1;
  }
  return 0;
}

int32_t QuantizedAttentionPlugin::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs,
                                                     DataType const* inputTypes, int32_t nbInputs) const noexcept {
  if (nbOutputs != kNumOutputs || nbInputs != kNumInputs || !outputTypes || !inputTypes) {
    logError("getOutputDataTypes: expects " + std::to_string(kNumInputs) + " inputs and 1 output");
    return -1;
  }
  if (!isActivationType(inputTypes[kQkv])) {
    logError("input 'qkv' must be fp16 or bf16");
    return -1;
  }
  outputTypes[kOutput] = inputTypes[kQkv];
  return 0;
}

int32_t QuantizedAttentionPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const*,
                                                  int32_t, DimsExprs* outputs, int32_t nbOutputs,
                                                  IExprBuilder& exprBuilder) noexcept {
  if (nbInputs != kNumInputs || nbOutputs != kNumOutputs || !inputs || !outputs) {
    logError("getOutputShapes: expects " + std::to_string(kNumInputs) + " inputs and 1 output");
    return -1;
  }
  // Check ranks and the extents already known as constants.
  std::vector<Dims> dims(nbInputs);
  for (int32_t i = 0; i < nbInputs; ++i) {
    dims[i].nbDims = inputs[i].nbDims;
    for (int32_t a = 0; a < inputs[i].nbDims && a < Dims::MAX_DIMS; ++a)
      dims[i].d[a] = inputs[i].d[a]->isConstant() ? inputs[i].d[a]->getConstantValue() : -1;
  }
  std::string error;
  if (!checkInputShapes(mConfig, dims.data(), nbInputs, error)) {
    logError("getOutputShapes: " + error);
    return -1;
  }
  outputs[kOutput].nbDims = 2;
  outputs[kOutput].d[0] = inputs[kQkv].d[0];
  outputs[kOutput].d[1] = exprBuilder.constant(int64_t(mConfig.table.numQHeads) * mConfig.table.headDim);
  return 0;
}

bool QuantizedAttentionPlugin::supportsFormatCombination(int32_t pos, DynamicPluginTensorDesc const* inOut,
                                                         int32_t nbInputs, int32_t nbOutputs) noexcept {
  return inOut && supportsFormat(pos, inOut, nbInputs, nbOutputs);
}

int32_t QuantizedAttentionPlugin::getNbOutputs() const noexcept { return kNumOutputs; }

size_t QuantizedAttentionPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
                                                  DynamicPluginTensorDesc const*, int32_t) const noexcept {
  if (!inputs || nbInputs != kNumInputs) return 0;
  // The largest step the profile allows: all its tokens, all its requests, full block tables.
  int64_t const tokens = inputs[kQkv].max.d[0];
  int64_t const batch = inputs[kHostRequestTypes].max.d[0];
  int64_t const maxKvLen = inputs[kBlockOffsets].max.d[4] * mConfig.tokensPerBlock;
  size_t const activationBytes = 2;  // fp16 and bf16
  return workspaceLayout(mConfig, tokens, batch, maxKvLen, activationBytes).total;
}

int32_t QuantizedAttentionPlugin::onShapeChange(PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const*,
                                                int32_t nbOutputs) noexcept {
  if (nbOutputs != kNumOutputs || nbInputs != kNumInputs || !in) {
    logError("onShapeChange: expects " + std::to_string(kNumInputs) + " inputs and 1 output");
    return -1;
  }
  std::vector<Dims> dims(nbInputs);
  for (int32_t i = 0; i < nbInputs; ++i) dims[i] = in[i].dims;
  std::string error;
  if (!checkInputShapes(mConfig, dims.data(), nbInputs, error)) {
    logError("onShapeChange: " + error);
    return -1;
  }
  return 0;
}

int32_t QuantizedAttentionPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const*,
                                          void const* const* inputs, void* const* outputs, void* workspace,
                                          cudaStream_t stream) noexcept {
  try {
    if (!inputDesc || !inputs || !outputs || !workspace) {
      logError("enqueue: null descriptors, inputs, outputs or workspace");
      return 1;
    }
    if (!mTables) mTables = std::make_unique<DeviceTables>();
    return enqueueAttention(mConfig, *mTables, inputDesc, inputs, outputs, workspace, stream);
  } catch (std::exception const& e) {
    logError(std::string("enqueue: ") + e.what());
    return 1;
  }
}

IPluginV3* QuantizedAttentionPlugin::attachToContext(IPluginResourceContext*) noexcept { return clone(); }

PluginFieldCollection const* QuantizedAttentionPlugin::getFieldsToSerialize() noexcept { return &mFieldCollection; }

}  // namespace tq::plugin
