// plugin_log.h: where the plugin's messages go. TensorRT hands a dynamically loaded library an
// ILoggerFinder (setLoggerFinder); the LD_PRELOAD variant looks up TensorRT's global logger; with
// neither, messages go to stderr so a refused field is never silent.
#pragma once

#include <NvInferRuntime.h>

#include <string>

namespace tq::plugin {

void useLoggerFinder(nvinfer1::ILoggerFinder* finder);
void useLogger(nvinfer1::ILogger* logger);

void logError(std::string const& message);
void logWarning(std::string const& message);

}  // namespace tq::plugin
