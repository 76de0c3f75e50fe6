#include "batch_plan.h"

namespace tq::plugin {

bool planBatch(int32_t const* requestTypes, int32_t const* pastKvLengths, int32_t const* contextLengths,
               int32_t batch, int32_t numTokens, int64_t capacity, BatchPlan& plan, std::string& error) {
  if (batch <= 0 || numTokens <= 0 || !requestTypes || !pastKvLengths || !contextLengths) {
    error = "empty batch or missing host length arrays";
    return false;
  }
  BatchPlan p;
  p.metadata.assign(size_t(numTokens) * 2 + batch, 0);
  int32_t* pos = p.metadata.data();
  int32_t* seqIdx = pos + numTokens;
  int32_t* kvLens = seqIdx + numTokens;
  int32_t token = 0;
  for (int32_t b = 0; b < batch; ++b) {
    std::string where = "request " + std::to_string(b) + ": ";
    int32_t type = requestTypes[b];
    if (type != int32_t(RequestType::kContext) && type != int32_t(RequestType::kGeneration)) {
      error = where + "host_request_types is " + std::to_string(type) + "; only 0 (context) and 1 (generation) are served";
      return false;
    }
    bool context = type == int32_t(RequestType::kContext);
    if (context && p.numGeneration > 0) {
      error = where + "a context request after a generation request; TensorRT-LLM puts context requests first";
      return false;
    }
    int32_t n = context ? contextLengths[b] : 1;
    int64_t kvLen = context ? int64_t(pastKvLengths[b]) : int64_t(pastKvLengths[b]) + 1;
    if (n <= 0 || kvLen < n) {
      error = where + "host_context_lengths " + std::to_string(n) + " and host_past_key_value_lengths " +
              std::to_string(pastKvLengths[b]) + " are inconsistent";
      return false;
    }
    if (kvLen > capacity) {
      error = where + "KV length " + std::to_string(kvLen) + " lies beyond its block table (" +
              std::to_string(capacity) + " tokens)";
      return false;
    }
    if (int64_t(token) + n > numTokens) {
      error = "the requests bring more tokens than qkv has rows (" + std::to_string(numTokens) + ")";
      return false;
    }
    for (int32_t j = 0; j < n; ++j) {
      pos[token + j] = int32_t(kvLen - n + j);
      seqIdx[token + j] = b;
    }
    kvLens[b] = int32_t(kvLen);
    p.requests.push_back({token, n, int32_t(kvLen)});
    token += n;
    if (context) {
      ++p.numContext;
    } else {
      ++p.numGeneration;
      if (kvLen > p.maxGenerationKvLen) p.maxGenerationKvLen = int32_t(kvLen);
    }
  }
  if (token != numTokens) {
    error = "the requests bring " + std::to_string(token) + " tokens but qkv has " + std::to_string(numTokens) + " rows";
    return false;
  }
  plan = std::move(p);
  return true;
}

}  // namespace tq::plugin
