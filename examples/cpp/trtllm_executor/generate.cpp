// Greedy generation with an engine built by `tq-build --backend trtllm`, on TensorRT-LLM 1.2's
// Executor API (the C++ runtime behind ModelRunnerCpp and Triton's TensorRT-LLM backend).
//
//   tq_trtllm_generate ENGINE_DIR TOKEN_IDS [MAX_NEW_TOKENS]
//
// TOKEN_IDS is the prompt as comma-separated token ids (the engine's tokenizer/ folder turns text
// into ids and back; docs/TRTLLM.md shows the two lines). The program loads the QuantizedAttention
// plugin from ENGINE_DIR/lib before the executor deserializes the engine, keeps block reuse,
// chunked context and CUDA graphs off (docs/TRTLLM.md), and prints the generated ids. With tensor
// parallelism, run it under `mpirun -n <tp size>`; rank 0 prints.
#include <NvInferRuntime.h>

#include "tensorrt_llm/executor/executor.h"
#include "tensorrt_llm/plugins/api/tllmPlugin.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace tle = tensorrt_llm::executor;

namespace {

std::vector<tle::TokenIdType> parseIds(std::string const& text) {
  std::vector<tle::TokenIdType> ids;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) continue;
    std::size_t used = 0;
    long value = std::stol(item, &used);
    if (used != item.size() || value < 0) throw std::invalid_argument("token id '" + item + "'");
    ids.push_back(static_cast<tle::TokenIdType>(value));
  }
  if (ids.empty()) throw std::invalid_argument("the prompt has no token ids");
  return ids;
}

// Registers the QuantizedAttention creator in TensorRT's plugin registry: the registry of the one
// libnvinfer in the process, which the executor deserializes with.
bool loadQuantizedAttention(std::filesystem::path const& engineDir) {
  auto const library = engineDir / "lib" / "libtq_attention_plugin.so";
  if (!std::filesystem::exists(library)) {
    std::cerr << "error: " << library << " is missing; rebuild the engine with tq-build --backend trtllm\n";
    return false;
  }
  if (nvinfer1::getPluginRegistry()->loadLibrary(library.c_str()) == nullptr) {
    std::cerr << "error: TensorRT could not load " << library << " (built for another TensorRT major?)\n";
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::cerr << "usage: " << argv[0] << " ENGINE_DIR TOKEN_IDS [MAX_NEW_TOKENS]\n";
    return 2;
  }
  std::filesystem::path const engineDir = argv[1];
  std::vector<tle::TokenIdType> prompt;
  int maxNewTokens = 32;
  try {
    prompt = parseIds(argv[2]);
    if (argc == 4) maxNewTokens = std::stoi(argv[3]);
  } catch (std::exception const& err) {
    std::cerr << "error: " << err.what() << "; give TOKEN_IDS as e.g. 1,2,3 and MAX_NEW_TOKENS as a number\n";
    return 2;
  }

  initTrtLlmPlugins(nullptr, "tensorrt_llm");  // TensorRT-LLM's own plugins (all-reduce with tp > 1)
  if (!loadQuantizedAttention(engineDir)) return 1;

  tle::KvCacheConfig kvCache;
  kvCache.setEnableBlockReuse(false);    // packed pages: no (partial) block reuse
  tle::ExecutorConfig config(/*maxBeamWidth=*/1);
  config.setKvCacheConfig(kvCache);
  config.setEnableChunkedContext(false);
  tle::ExtendedRuntimePerfKnobConfig knobs;
  knobs.setCudaGraphMode(false);         // the plugin reads host lengths at enqueue time
  config.setExtendedRuntimePerfKnobConfig(knobs);

  tle::Executor executor(engineDir, tle::ModelType::kDECODER_ONLY, config);
  if (!executor.canEnqueueRequests()) return 0;  // ranks above 0 of a tensor-parallel engine

  tle::Request request(prompt, maxNewTokens);
  auto const id = executor.enqueueRequest(request);
  tle::VecTokens generated;
  for (bool done = false; !done;) {
    for (auto const& response : executor.awaitResponses(id, std::chrono::milliseconds(1000))) {
      if (response.hasError()) {
        std::cerr << "error: " << response.getErrorMsg() << "\n";
        return 1;
      }
      auto const& result = response.getResult();
      generated = result.outputTokenIds.at(0);
      done = result.isFinal;
    }
  }
  // the output holds the prompt first unless the request excludes it
  std::size_t const start = generated.size() > prompt.size() && std::equal(prompt.begin(), prompt.end(), generated.begin())
                                ? prompt.size() : 0;
  for (std::size_t i = start; i < generated.size(); ++i) std::cout << (i > start ? "," : "") << generated[i];
  std::cout << "\n";
  return 0;
}
