// dynamic_entry.cpp: the two symbols TensorRT looks up in a plugin library it loads itself
// (IPluginRegistry::loadLibrary, trtexec --dynamicPlugins). Nothing here calls into libnvinfer,
// so the library does not link it.
#include "plugin_creator.h"
#include "plugin_log.h"

#define TQ_EXPORT extern "C" __attribute__((visibility("default")))

TQ_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder) { tq::plugin::useLoggerFinder(finder); }

TQ_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
  static nvinfer1::IPluginCreatorInterface* const creators[] = {&tq::plugin::pluginCreator()};
  nbCreators = 1;
  return creators;
}
