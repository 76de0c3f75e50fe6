#include "plugin_log.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tq::plugin {

namespace {
std::atomic<nvinfer1::ILoggerFinder*> gFinder{nullptr};
std::atomic<InterfaceLayout> gFinderLayout{kHeadersLayout};
std::atomic<nvinfer1::ILogger*> gLogger{nullptr};

// The virtual-table slot of findLogger / log: first in the plain layout, after IVersionedInterface's
// getAPILanguage, getInterfaceInfo and two destructor entries (Itanium C++ ABI) in the versioned one.
size_t methodSlot(InterfaceLayout layout) { return layout == InterfaceLayout::kPlain ? 0 : 4; }

// Calls virtual-table slot `slot` of `object`, a member function taking `args` (the Itanium C++ ABI
// passes `this` first). Used only where the object's layout is not the one these headers declare.
template <typename R, typename... Args>
R callSlot(void* object, size_t slot, Args... args) {
  void* const* vtable = *static_cast<void* const* const*>(object);
  return reinterpret_cast<R (*)(void*, Args...)>(vtable[slot])(object, args...);
}

nvinfer1::ILogger* findLogger(nvinfer1::ILoggerFinder* finder, InterfaceLayout layout) {
  if (layout == kHeadersLayout) return finder->findLogger();
  return callSlot<nvinfer1::ILogger*>(finder, methodSlot(layout));
}

void emit(nvinfer1::ILogger::Severity severity, std::string const& message) {
  std::string text = "QuantizedAttention (tq): " + message;
  // The finder must be asked on the calling thread, so it is asked per message; it may have no
  // logger for this thread, and then TensorRT's global logger (preload variant) is next. A logger
  // the finder returns was made against the same TensorRT as the finder, so it has its layout.
  nvinfer1::ILoggerFinder* finder = gFinder.load();
  InterfaceLayout layout = gFinderLayout.load();
  if (nvinfer1::ILogger* logger = finder ? findLogger(finder, layout) : nullptr) {
    if (layout == kHeadersLayout)
      logger->log(severity, text.c_str());
    else
      callSlot<void>(logger, methodSlot(layout), int32_t(severity), static_cast<char const*>(text.c_str()));
  } else if (nvinfer1::ILogger* global = gLogger.load()) {
    global->log(severity, text.c_str());
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
}
}  // namespace

InterfaceLayout layoutOfLibrary(char const* path) {
  if (!path) return kHeadersLayout;
  char const* slash = std::strrchr(path, '/');
  std::string const name = slash ? slash + 1 : path;
  if (name.find("tensorrt_rtx") != std::string::npos) return InterfaceLayout::kVersioned;
  size_t const so = name.find(".so.");
  if (name.rfind("libnvinfer", 0) == 0 && so != std::string::npos)
    return std::atoi(name.c_str() + so + 4) >= 11 ? InterfaceLayout::kVersioned : InterfaceLayout::kPlain;
  return kHeadersLayout;
}

void useLoggerFinder(nvinfer1::ILoggerFinder* finder) {
  Dl_info info{};
  bool const known = finder && dladdr(*reinterpret_cast<void* const*>(finder), &info) && info.dli_fname;
  useLoggerFinder(finder, known ? layoutOfLibrary(info.dli_fname) : kHeadersLayout);
}

void useLoggerFinder(nvinfer1::ILoggerFinder* finder, InterfaceLayout layout) {
  gFinder.store(nullptr);
  gFinderLayout.store(layout);
  gFinder.store(finder);
}

void useLogger(nvinfer1::ILogger* logger) { gLogger.store(logger); }

void logError(std::string const& message) { emit(nvinfer1::ILogger::Severity::kERROR, message); }
void logWarning(std::string const& message) { emit(nvinfer1::ILogger::Severity::kWARNING, message); }

}  // namespace tq::plugin
