#include "attention_enqueue.h"

#include "batch_plan.h"
#include "io_layout.h"
#include "plugin_log.h"
#include "plugin_shapes.h"
#include "tq/tq_rope.h"

#include <cmath>

namespace tq::plugin {

namespace {

constexpr int32_t kPrimaryPoolOffsetLimit = 1 << 30;  // offsets with a pool-type flag are >= this or < 0

// This layer's slice of TensorRT-LLM's paged pool (docs/PLUGIN.md, "Pool arithmetic").
struct PoolView {
  char* layerBase;            // pool base + layer_in_pool * 2 * chunk bytes
  int32_t const* blockTable;  // this pool's [batch][1][2][max_blocks] offsets
  int32_t maxBlocks;
};

bool locatePool(PluginConfig const& c, nvinfer1::PluginTensorDesc const* desc, void const* const* inputs,
                PoolView& view, std::string& error) {
  nvinfer1::Dims const& offsets = desc[kBlockOffsets].dims;
  int64_t const numPools = desc[kHostPoolPointers].dims.d[0];
  if (desc[kHostPoolMapping].dims.d[0] <= c.table.layerIdx) {
    error = std::string("input '") + inputName(kHostPoolMapping) + "' does not map layer " +
            std::to_string(c.table.layerIdx) + " (the layer table's layer index)";
    return false;
  }
  auto const* mapping = static_cast<int32_t const*>(inputs[kHostPoolMapping]);
  int32_t const pool = mapping[2 * c.table.layerIdx];
  int32_t const layerInPool = mapping[2 * c.table.layerIdx + 1];
  if (pool < 0 || pool >= numPools || pool >= offsets.d[0] || layerInPool < 0) {
    error = std::string("input '") + inputName(kHostPoolMapping) + "' maps layer " + std::to_string(c.table.layerIdx) +
            " to pool " + std::to_string(pool) + " / layer " + std::to_string(layerInPool) + ", which does not exist";
    return false;
  }
  auto const* pointers = static_cast<int64_t const*>(inputs[kHostPoolPointers]);
  char* base = reinterpret_cast<char*>(pointers[2 * pool]);  // the primary (GPU) pool
  if (!base) {
    error = std::string("input '") + inputName(kHostPoolPointers) + "' holds a null primary pool pointer";
    return false;
  }
  int64_t const poolStride = offsets.d[1] * offsets.d[2] * offsets.d[3] * offsets.d[4];
  view.layerBase = base + int64_t(layerInPool) * 2 * poolChunkBytes(c);
  view.blockTable = static_cast<int32_t const*>(inputs[kBlockOffsets]) + pool * poolStride;
  view.maxBlocks = int32_t(offsets.d[4]);
  return true;
}

bool kernelOk(tq_status status, char const* step, std::string& error) {
  if (status == TQ_OK) return true;
  error = std::string(step) + " failed (tq_status " + std::to_string(int(status)) + "): " + tq_last_error();
  return false;
}

// One attention call, planned for its shape (tq_attention_plan on the current device), then run.
bool attend(tq_attention_params const& params, void* workspace, size_t workspaceBytes, tq_stream stream,
            char const* step, std::string& error) {
  tq_attention_plan_info plan{};
  return kernelOk(tq_attention_plan(params.batch, params.q_len, params.num_q_heads, params.cache->num_kv_heads,
                                    params.cache->key.head_dim, params.max_kv_len, 0, &plan),
                  step, error) &&
         kernelOk(tq_attention_run(&plan, &params, workspace, workspaceBytes, stream), step, error);
}

int32_t run(PluginConfig const& c, DeviceTables& tables, nvinfer1::PluginTensorDesc const* desc,
            void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream, std::string& error) {
  std::vector<nvinfer1::Dims> dims(kNumInputs);
  for (int32_t i = 0; i < kNumInputs; ++i) dims[i] = desc[i].dims;
  if (!checkInputShapes(c, dims.data(), kNumInputs, error)) return 1;
  int32_t const numTokens = int32_t(desc[kQkv].dims.d[0]);
  int32_t const batch = int32_t(desc[kHostRequestTypes].dims.d[0]);
  if (desc[kHostPastKvLengths].dims.d[0] != batch || desc[kHostContextLengths].dims.d[0] != batch ||
      desc[kBlockOffsets].dims.d[1] < batch) {
    error = "the per-request inputs disagree on the batch size";
    return 1;
  }
  PoolView pool{};
  if (!locatePool(c, desc, inputs, pool, error)) return 1;
  BatchPlan plan;
  if (!planBatch(static_cast<int32_t const*>(inputs[kHostRequestTypes]),
                 static_cast<int32_t const*>(inputs[kHostPastKvLengths]),
                 static_cast<int32_t const*>(inputs[kHostContextLengths]), batch, numTokens,
                 int64_t(pool.maxBlocks) * c.tokensPerBlock, plan, error))
    return 1;
  if (!tables.ensureUploaded(c, error)) return 1;

  tq_dtype const dtype = desc[kQkv].type == nvinfer1::DataType::kBF16 ? TQ_BF16 : TQ_FP16;
  size_t const elem = 2;  // fp16 and bf16
  int64_t const maxKvLen = int64_t(pool.maxBlocks) * c.tokensPerBlock;
  WorkspaceLayout const ws = workspaceLayout(c, numTokens, batch, maxKvLen, elem);
  char* w = static_cast<char*>(workspace);
  auto* pos = reinterpret_cast<int32_t*>(w + ws.metadata);
  int32_t* seqIdx = pos + numTokens;
  int32_t* kvLens = seqIdx + numTokens;
  char* q = w + ws.q;
  char* kv = w + ws.kv;
  if (!tables.uploadMetadata(plan.metadata, pos, stream, error)) return 1;

  tq_stream const s = reinterpret_cast<tq_stream>(stream);
  if (!kernelOk(tq_rope_split_qkv(inputs[kQkv], qkvWidth(c), dtype, pos, numTokens, c.table.numQHeads,
                                  c.table.numKvHeads, c.table.headDim, &c.rope, q, kv, s),
                "RoPE", error))
    return 1;

  tq_paged_cache cache{};
  cache.k_pool = cache.v_pool = pool.layerBase;  // one pool; K and V chunks alternate (offsets 2b, 2b+1)
  cache.k_chunk_bytes = cache.v_chunk_bytes = poolChunkBytes(c);
  cache.block_table = pool.blockTable;
  cache.max_blocks = pool.maxBlocks;
  cache.tokens_per_block = c.tokensPerBlock;
  cache.num_kv_heads = c.table.numKvHeads;
  // The pool's size is not an input (GPTAttention trusts the offsets too). TensorRT-LLM keeps a pool
  // type in an offset's top two bits: a block still in the secondary pool is skipped, never read.
  cache.num_chunks = kPrimaryPoolOffsetLimit;
  cache.key = tables.keyCodec();
  cache.value = tables.valueCodec();
  cache.page_lse_shift = tables.pageShift();
  // Context tokens come first in the batch: they are appended here; generation tokens are appended
  // by the decode attention call itself (tq_attention_params::append: one launch fewer per step).
  int64_t const kvStride = 2 * int64_t(c.table.numKvHeads) * c.table.headDim;
  int32_t const contextTokens = plan.numGeneration > 0 ? plan.requests[plan.numContext].tokenBegin : numTokens;
  if (contextTokens > 0 &&
      !kernelOk(tq_quantize_append(&cache, kv, kv + c.table.numKvHeads * c.table.headDim * elem, kvStride, dtype,
                                   seqIdx, pos, contextTokens, batch, s),
                "quantize-append", error))
    return 1;

  int64_t const rowBytes = int64_t(c.table.numQHeads) * c.table.headDim * elem;
  char* out = static_cast<char*>(outputs[kOutput]);
  int64_t const tableRow = 2 * int64_t(pool.maxBlocks);  // beam width 1
  void* attnWs = w + ws.attention;
  // What every attention call shares; each sets its requests' rows, lengths and shape.
  tq_attention_params attn{};
  attn.cache = &cache;
  attn.new_stride = kvStride;
  attn.num_q_heads = c.table.numQHeads;
  attn.softmax_scale = 1.f / std::sqrt(float(c.table.headDim));
  attn.dtype = dtype;
  auto rowsFrom = [&](int32_t token) {  // the call's rows from the batch's token `token` on
    char const* kNew = kv + token * kvStride * elem;  // each token attends to its own K/V exactly
    attn.k_new = kNew;
    attn.v_new = kNew + c.table.numKvHeads * c.table.headDim * elem;
    attn.q = q + token * rowBytes;
    attn.out = out + token * rowBytes;
  };
  for (int32_t r = 0; r < plan.numContext; ++r) {
    RequestSlice const& req = plan.requests[r];
    cache.block_table = pool.blockTable + r * tableRow;
    rowsFrom(req.tokenBegin);
    attn.kv_lens = kvLens + r;
    attn.max_kv_len = req.kvLen;
    attn.batch = 1;
    attn.q_len = req.numTokens;
    if (!attend(attn, attnWs, ws.attentionBytes, s, "prefill attention", error)) return 1;
  }
  if (plan.numGeneration > 0) {
    int32_t const first = plan.numContext;
    cache.block_table = pool.blockTable + first * tableRow;
    rowsFrom(plan.requests[first].tokenBegin);
    attn.kv_lens = kvLens + first;
    attn.max_kv_len = plan.maxGenerationKvLen;
    attn.batch = plan.numGeneration;
    attn.q_len = 1;
    attn.append = 1;  // the generation tokens' quantize-append, fused in
    if (!attend(attn, attnWs, ws.attentionBytes, s, "decode attention", error)) return 1;
  }
  return 0;
}

}  // namespace

int32_t enqueueAttention(PluginConfig const& config, DeviceTables& tables, nvinfer1::PluginTensorDesc const* inputDesc,
                         void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) {
  std::string error;
  int32_t status = run(config, tables, inputDesc, inputs, outputs, workspace, stream, error);
  if (status != 0) logError("layer " + std::to_string(config.table.layerIdx) + ": enqueue: " + error);
  return status;
}

}  // namespace tq::plugin
