#include "plugin_log.h"

#include <atomic>
#include <cstdio>

namespace tq::plugin {

namespace {
std::atomic<nvinfer1::ILoggerFinder*> gFinder{nullptr};
std::atomic<nvinfer1::ILogger*> gLogger{nullptr};

void emit(nvinfer1::ILogger::Severity severity, std::string const& message) {
  std::string text = "QuantizedAttention (tq): " + message;
  // The finder must be asked on the calling thread, so it is asked per message.
  nvinfer1::ILoggerFinder* finder = gFinder.load();
  nvinfer1::ILogger* logger = finder ? finder->findLogger() : gLogger.load();
  if (logger)
    logger->log(severity, text.c_str());
  else
    std::fprintf(stderr, "%s\n", text.c_str());
}
}  // namespace

void useLoggerFinder(nvinfer1::ILoggerFinder* finder) { gFinder.store(finder); }
void useLogger(nvinfer1::ILogger* logger) { gLogger.store(logger); }

void logError(std::string const& message) { emit(nvinfer1::ILogger::Severity::kERROR, message); }
void logWarning(std::string const& message) { emit(nvinfer1::ILogger::Severity::kWARNING, message); }

}  // namespace tq::plugin
