#include "plugin_shapes.h"

#include "codec_layout.h"
#include "io_layout.h"
#include "tq/tq_kernels.h"

#include <algorithm>

namespace tq::plugin {

using nvinfer1::DataType;
using nvinfer1::TensorFormat;

namespace {
// Packed bytes per token of one side (tq_codec_token_bytes); a parsed table's widths are ones the
// library accepts.
int64_t sideBytesPerToken(LayerTable const& t, int32_t widthX2) {
  tq_codec codec;
  std::string error;
  return initCodec(codec, t.headDim, widthX2, t.rotationSeed, nullptr, 0, error) ? tq_codec_token_bytes(&codec) : 0;
}
}  // namespace

int64_t poolHeadSizeBytes(PluginConfig const& c) {
  return std::max(sideBytesPerToken(c.table, c.table.keyWidthX2), sideBytesPerToken(c.table, c.table.valueWidthX2));
}

int64_t poolChunkBytes(PluginConfig const& c) {
  return int64_t(c.table.numKvHeads) * c.tokensPerBlock * poolHeadSizeBytes(c);
}

int64_t qkvWidth(PluginConfig const& c) { return int64_t(c.table.numQHeads + 2 * c.table.numKvHeads) * c.table.headDim; }

bool isActivationType(DataType type) { return type == DataType::kHALF || type == DataType::kBF16; }

bool supportsFormat(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) {
  if (nbInputs != kNumInputs || nbOutputs != kNumOutputs || pos < 0 || pos >= nbInputs + nbOutputs) return false;
  nvinfer1::PluginTensorDesc const& d = inOut[pos].desc;
  if (d.format != TensorFormat::kLINEAR) return false;
  switch (pos) {
    case kQkv: return isActivationType(d.type);
    case kHostPoolPointers: return d.type == DataType::kINT64;
    case kNumInputs + kOutput: return d.type == inOut[kQkv].desc.type;  // the output follows qkv
    default: return d.type == DataType::kINT32;
  }
}

bool checkInputShapes(PluginConfig const& c, nvinfer1::Dims const* dims, int32_t nbInputs, std::string& error) {
  if (nbInputs != kNumInputs) {
    error = "expects " + std::to_string(kNumInputs) + " inputs, got " + std::to_string(nbInputs);
    return false;
  }
  static constexpr int32_t kRanks[kNumInputs] = {2, 1, 1, 1, 5, 2, 2};
  for (int32_t i = 0; i < kNumInputs; ++i) {
    if (dims[i].nbDims != kRanks[i]) {
      error = std::string("input '") + inputName(i) + "' has rank " + std::to_string(dims[i].nbDims) +
              ", expected " + std::to_string(kRanks[i]);
      return false;
    }
  }
  // Extents that are fixed by the fields; -1 (dynamic, at build time) passes.
  struct Fixed { int32_t input, axis; int64_t value; char const* meaning; };
  Fixed const fixed[] = {
      {kQkv, 1, qkvWidth(c), "(query heads + 2 * KV heads) * head_dim of the layer table"},
      {kBlockOffsets, 2, 1, "beam width 1"},
      {kBlockOffsets, 3, 2, "K and V"},
      {kHostPoolPointers, 1, 2, "primary and secondary pool"},
      {kHostPoolMapping, 1, 2, "pool index and layer in pool"},
  };
  for (Fixed const& f : fixed) {
    int64_t got = dims[f.input].d[f.axis];
    if (got != -1 && got != f.value) {
      error = std::string("input '") + inputName(f.input) + "' has extent " + std::to_string(got) + " on axis " +
              std::to_string(f.axis) + ", expected " + std::to_string(f.value) + " (" + f.meaning + ")";
      return false;
    }
  }
  int64_t layers = dims[kHostPoolMapping].d[0];
  if (layers != -1 && layers <= c.table.layerIdx) {
    error = std::string("input '") + inputName(kHostPoolMapping) + "' maps " + std::to_string(layers) +
            " layers, but the layer table's layer index is " + std::to_string(c.table.layerIdx);
    return false;
  }
  return true;
}

namespace {
constexpr size_t kAlign = 256;
size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// The attention workspace that serves every call of at most this shape on the current device
// (tq_attention_plan_info::workspace_bytes); 0 for a shape the library refuses (the call's own
// plan then says why at enqueue).
size_t attentionBytes(PluginConfig const& c, int64_t batch, int64_t qLen, int32_t kvLen) {
  tq_attention_plan_info plan{};
  if (tq_attention_plan(int32_t(std::min<int64_t>(batch, INT32_MAX)), int32_t(std::min<int64_t>(qLen, INT32_MAX)),
                        c.table.numQHeads, c.table.numKvHeads, c.table.headDim, kvLen, 0, &plan) != TQ_OK)
    return 0;
  return plan.workspace_bytes;
}
}  // namespace

WorkspaceLayout workspaceLayout(PluginConfig const& c, int64_t numTokens, int64_t batch, int64_t maxKvLen,
                                size_t activationBytes) {
  WorkspaceLayout w{};
  size_t const tokens = size_t(std::max<int64_t>(numTokens, 0));
  w.metadata = 0;
  w.q = alignUp(w.metadata + sizeof(int32_t) * (2 * tokens + size_t(std::max<int64_t>(batch, 0))));
  w.kv = alignUp(w.q + tokens * c.table.numQHeads * c.table.headDim * activationBytes);
  w.attention = alignUp(w.kv + tokens * 2 * c.table.numKvHeads * c.table.headDim * activationBytes);
  // One context request at a time (batch 1, its whole chunk) or all generation requests at once
  // (q_len 1): the calls run one after another on the stream and share this region.
  int32_t const kvLen = int32_t(std::min<int64_t>(maxKvLen, INT32_MAX));
  w.attentionBytes = std::max(attentionBytes(c, 1, numTokens, kvLen), attentionBytes(c, batch, 1, kvLen));
  w.total = alignUp(w.attention + w.attentionBytes);
  return w;
}

}  // namespace tq::plugin
