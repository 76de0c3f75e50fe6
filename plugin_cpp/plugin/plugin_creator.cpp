#include "plugin_creator.h"

#include "plugin_config.h"
#include "plugin_log.h"
#include "quantized_attention_plugin.h"

#include <exception>

namespace tq::plugin {

QuantizedAttentionCreator::QuantizedAttentionCreator() : mFieldDeclarations(fieldDeclarations()) {
  mFieldNames.nbFields = int32_t(mFieldDeclarations.size());
  mFieldNames.fields = mFieldDeclarations.data();
}

nvinfer1::IPluginV3* QuantizedAttentionCreator::createPlugin(char const* name, nvinfer1::PluginFieldCollection const* fc,
                                                             nvinfer1::TensorRTPhase phase) noexcept {
  std::string const where = std::string("createPlugin('") + (name ? name : "") + "', " +
                            (phase == nvinfer1::TensorRTPhase::kBUILD ? "build" : "runtime") + " phase): ";
  try {
    PluginConfig config;
    std::string error;
    if (!parsePluginConfig(fc, config, error)) {
      logError(where + error);
      return nullptr;
    }
    return new QuantizedAttentionPlugin(std::move(config));
  } catch (std::exception const& e) {
    logError(where + e.what());
    return nullptr;
  }
}

char const* QuantizedAttentionCreator::getPluginName() const noexcept { return kPluginName; }
char const* QuantizedAttentionCreator::getPluginVersion() const noexcept { return kPluginVersion; }
char const* QuantizedAttentionCreator::getPluginNamespace() const noexcept { return kPluginNamespace; }

QuantizedAttentionCreator& pluginCreator() {
  static QuantizedAttentionCreator creator;
  return creator;
}

}  // namespace tq::plugin
