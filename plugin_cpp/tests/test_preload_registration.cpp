// test_preload_registration.cpp: loading the LD_PRELOAD variant registers the QuantizedAttention
// creator with the process's TensorRT plugin registry, found by soname at load time (here the
// fake_nvinfer.cpp stand-in), without the library linking libnvinfer.
// Usage: tq_plugin_preload_test PRELOAD_LIBRARY
#include <NvInferRuntime.h>

#include <dlfcn.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) return std::printf("usage: tq_plugin_preload_test PRELOAD_LIBRARY\n"), 2;
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) return std::printf("FAILED: dlopen: %s\n", dlerror()), 1;
  using GetRegistry = nvinfer1::IPluginRegistry* (*)();
  auto getRegistry = reinterpret_cast<GetRegistry>(dlsym(RTLD_DEFAULT, "getPluginRegistry"));
  if (!getRegistry) return std::printf("FAILED: the preload library did not bring libnvinfer into the process\n"), 1;
  int32_t n = 0;
  nvinfer1::IPluginCreatorInterface* const* creators = getRegistry()->getAllCreators(&n);
  for (int32_t i = 0; i < n; ++i) {
    auto* c = static_cast<nvinfer1::IPluginCreatorV3One*>(creators[i]);
    if (std::string(creators[i]->getInterfaceInfo().kind) == "PLUGIN CREATOR_V3ONE" &&
        std::string(c->getPluginName()) == "QuantizedAttention" && std::string(c->getPluginNamespace()) == "tq") {
      std::printf("PASSED: QuantizedAttention (tq) registered at load time (TensorRT headers %d.%d)\n",
                  NV_TENSORRT_MAJOR, NV_TENSORRT_MINOR);
      return 0;
    }
  }
  return std::printf("FAILED: %d creator(s) registered, none is QuantizedAttention (tq)\n", n), 1;
}
