// batch_plan.h: turns TensorRT-LLM's host-side per-request lengths into the token slices and
// positions the kernels need, refusing any length the block table cannot hold.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tq::plugin {

enum class RequestType : int32_t { kContext = 0, kGeneration = 1 };

struct RequestSlice {
  int32_t tokenBegin;  // first row of this request in qkv and the output
  int32_t numTokens;   // tokens it brings this step
  int32_t kvLen;       // its KV length once they are appended
};

struct BatchPlan {
  int32_t numContext = 0;     // context requests come first, as TensorRT-LLM orders them
  int32_t numGeneration = 0;
  int32_t maxGenerationKvLen = 0;
  std::vector<RequestSlice> requests;  // batch order
  // One host array uploaded at once: pos[num_tokens], seq_idx[num_tokens], kv_lens[batch].
  std::vector<int32_t> metadata;
};

// TensorRT-LLM 1.2 in-flight batching conventions: for a context request host_context_lengths is
// this chunk's token count and host_past_key_value_lengths the KV length after the chunk; for a
// generation request (one token) host_past_key_value_lengths is the KV length before it.
// `capacity` = max_blocks * tokens_per_block. Returns false with `error` set on bad input.
bool planBatch(int32_t const* requestTypes, int32_t const* pastKvLengths, int32_t const* contextLengths,
               int32_t batch, int32_t numTokens, int64_t capacity, BatchPlan& plan, std::string& error);

}  // namespace tq::plugin
