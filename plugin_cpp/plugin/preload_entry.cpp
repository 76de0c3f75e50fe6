// preload_entry.cpp: the LD_PRELOAD variant. Loaded before the application (e.g. Triton's
// TensorRT-LLM backend, which has no plugin-path option), it registers its creator with TensorRT's
// global plugin registry while the library loads. It is not linked against libnvinfer: it opens
// the library by its soname (libnvinfer.so.<major of the headers it was built with>) and resolves
// getPluginRegistry and getLogger at load time, so the process later shares that same copy.
#include "plugin_creator.h"
#include "plugin_log.h"
#include "quantized_attention_plugin.h"

#include <NvInferVersion.h>

#include <dlfcn.h>

#include <cstdio>
#include <string>

namespace {

using GetPluginRegistry = nvinfer1::IPluginRegistry* (*)();
using GetLogger = nvinfer1::ILogger* (*)();

void* findSymbol(char const* symbol) {
  if (void* p = dlsym(RTLD_DEFAULT, symbol)) return p;  // libnvinfer already in the process
  std::string const soname = "libnvinfer.so." + std::to_string(NV_TENSORRT_MAJOR);
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) {
    std::fprintf(stderr, "QuantizedAttention (tq): cannot register: %s not found (%s)\n", soname.c_str(), dlerror());
    return nullptr;
  }
  return dlsym(handle, symbol);
}

__attribute__((constructor)) void registerQuantizedAttention() {
  if (auto getLogger = reinterpret_cast<GetLogger>(findSymbol("getLogger"))) tq::plugin::useLogger(getLogger());
  auto getRegistry = reinterpret_cast<GetPluginRegistry>(findSymbol("getPluginRegistry"));
  nvinfer1::IPluginRegistry* registry = getRegistry ? getRegistry() : nullptr;
  if (!registry || !registry->registerCreator(tq::plugin::pluginCreator(), tq::plugin::kPluginNamespace))
    tq::plugin::logError("could not register the plugin creator with TensorRT's plugin registry");
}

}  // namespace
