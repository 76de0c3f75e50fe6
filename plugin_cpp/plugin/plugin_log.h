// plugin_log.h: where the plugin's messages go. TensorRT hands a dynamically loaded library an
// ILoggerFinder (setLoggerFinder); the LD_PRELOAD variant looks up TensorRT's global logger; with
// neither, messages go to stderr so a refused field is never silent.
#pragma once

#include <NvInferRuntime.h>

#include <string>

namespace tq::plugin {

// The virtual-table layout of ILogger and ILoggerFinder. TensorRT 10's have no base class (the
// method comes first); TensorRT 11's and TensorRT-RTX's derive from IVersionedInterface, whose
// getAPILanguage, getInterfaceInfo and destructor come first. One plugin library may be loaded by
// either (TensorRT-RTX 1.7 loads one built against TensorRT 10.13's headers).
enum class InterfaceLayout { kPlain, kVersioned };
constexpr InterfaceLayout kHeadersLayout = NV_TENSORRT_MAJOR >= 11 ? InterfaceLayout::kVersioned
                                                                   : InterfaceLayout::kPlain;

// The layout of the TensorRT library at `path`, from its file name (libnvinfer*.so.<major>,
// libtensorrt_rtx*); the headers' own layout for any other name.
InterfaceLayout layoutOfLibrary(char const* path);

// The finder TensorRT gave; its layout is that of the library its virtual table lives in.
void useLoggerFinder(nvinfer1::ILoggerFinder* finder);
void useLoggerFinder(nvinfer1::ILoggerFinder* finder, InterfaceLayout layout);
void useLogger(nvinfer1::ILogger* logger);

void logError(std::string const& message);
void logWarning(std::string const& message);

}  // namespace tq::plugin
