// fake_nvinfer.cpp: a test double of libnvinfer.so.<major> with only what the LD_PRELOAD variant
// resolves at load time (getPluginRegistry, getLogger): a registry that records the creators
// registered with it. Built as libnvinfer.so.<major> in a test-only folder, so the preload
// library's dlopen by soname finds it; never installed.
#include <NvInferRuntime.h>

#include <cstdio>
#include <vector>

using namespace nvinfer1;

namespace {

class RecordingRegistry : public IPluginRegistry {
 public:
  bool registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const) noexcept override {
    mCreators.push_back(&creator);
    return true;
  }
  IPluginCreatorInterface* const* getAllCreators(int32_t* const numCreators) const noexcept override {
    *numCreators = int32_t(mCreators.size());
    return mCreators.data();
  }
  IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const numCreators) noexcept override {
    return getAllCreators(numCreators);
  }
  // The rest is not used by the plugin and does nothing.
  void setErrorRecorder(IErrorRecorder* const) noexcept override {}
  IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
  bool isParentSearchEnabled() const override { return false; }
  void setParentSearchEnabled(bool const) override {}
  PluginLibraryHandle loadLibrary(AsciiChar const*) noexcept override { return nullptr; }
  void deregisterLibrary(PluginLibraryHandle) noexcept override {}
  IPluginCreatorInterface* getCreator(AsciiChar const* const, AsciiChar const* const, AsciiChar const* const) noexcept override {
    return nullptr;
  }
  bool deregisterCreator(IPluginCreatorInterface const&) noexcept override { return false; }
  IPluginResource* acquirePluginResource(AsciiChar const*, IPluginResource*) noexcept override { return nullptr; }
  int32_t releasePluginResource(AsciiChar const*) noexcept override { return 0; }
#if NV_TENSORRT_MAJOR < 11  // the IPluginCreator (V2) methods TensorRT 11 removed
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  bool registerCreator(IPluginCreator&, AsciiChar const* const) noexcept override { return false; }
  IPluginCreator* const* getPluginCreatorList(int32_t* const numCreators) const noexcept override {
    *numCreators = 0;
    return nullptr;
  }
  IPluginCreator* getPluginCreator(AsciiChar const* const, AsciiChar const* const, AsciiChar const* const) noexcept override {
    return nullptr;
  }
  bool deregisterCreator(IPluginCreator const&) noexcept override { return false; }
#pragma GCC diagnostic pop
#endif

 private:
  std::vector<IPluginCreatorInterface*> mCreators;
};

class StderrLogger : public ILogger {
  void log(Severity, AsciiChar const* msg) noexcept override { std::fprintf(stderr, "[fake nvinfer] %s\n", msg); }
};

}  // namespace

extern "C" __attribute__((visibility("default"))) IPluginRegistry* getPluginRegistry() noexcept {
  static RecordingRegistry registry;
  return &registry;
}

extern "C" __attribute__((visibility("default"))) ILogger* getLogger() noexcept {
  static StderrLogger logger;
  return &logger;
}
