// plugin_harness.cpp: drives libtq_attention_plugin.so the way TensorRT and TensorRT-LLM would,
// using TensorRT's interfaces header-only (no libnvinfer): dlopen the library, getCreators, create
// the plugin from fields (build phase), serialize its fields, recreate it from them (runtime phase),
// attach it to a "context", then enqueue a sequence of steps against a paged pool laid out like
// TensorRT-LLM's ([blocks, layers in pool, K/V, chunk bytes]).
//
// Usage: tq_plugin_harness PLUGIN_LIBRARY CASE_DIR OUT_DIR
// CASE_DIR (written by tests/gpu/test_plugin_harness.py):
//   fields.bin        the fields: per field name\0, int32 type, int32 length, then its bytes
//   case.txt          "dtype fp16|bf16", "heads NUM_Q_HEADS NUM_KV_HEADS HEAD_DIM LAYER_IDX" (the layer
//                     table's, for the shapes and the mapping row; the plugin reads them from the table),
//                     "pool NUM_BLOCKS LAYERS_IN_POOL LAYER_IN_POOL NUM_LAYERS",
//                     "chunk_bytes N", "max_blocks N", "steps N", optionally "mapping_pool P" (the
//                     layer's pool index in the mapping; default 0, the one pool there is)
//   stepK_meta.bin    int32 [batch, num_tokens, request_types[batch], past_kv_lengths[batch],
//                     context_lengths[batch]]
//   stepK_qkv.bin     [num_tokens, (Hq + 2 Hkv) * head_dim] fp16/bf16
//   stepK_offsets.bin int32 [1, batch, 1, 2, max_blocks] kv_cache_block_offsets of this step
// OUT_DIR: stepK_out.bin (the attention output), stepK_status.txt (enqueue's return value),
//          pool.bin (the whole pool after the last step), report.txt.
#include <NvInferRuntime.h>

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace {

std::ofstream report;  // static storage: flushed by std::exit in die() too

[[noreturn]] void die(std::string const& message) {
  std::fprintf(stderr, "harness: %s\n", message.c_str());
  std::exit(2);
}

void check(cudaError_t status, char const* what) {
  if (status != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(status));
}

std::vector<char> readFile(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die("cannot read " + path);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void writeFile(std::string const& path, void const* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<char const*>(data), std::streamsize(bytes));
  if (!out) die("cannot write " + path);
}

// Fields with their own storage, so a collection can outlive whatever it was copied from.
struct OwnedFields {
  std::vector<std::string> names;
  std::vector<std::vector<char>> data;
  std::vector<PluginField> fields;
  PluginFieldCollection collection{};

  void add(char const* name, PluginFieldType type, int32_t length, void const* bytes, size_t size) {
    names.emplace_back(name);
    data.emplace_back(static_cast<char const*>(bytes), static_cast<char const*>(bytes) + size);
    fields.emplace_back(nullptr, nullptr, type, length);
  }
  PluginFieldCollection const* finish() {
    for (size_t i = 0; i < fields.size(); ++i) {
      fields[i].name = names[i].c_str();
      fields[i].data = data[i].data();
    }
    collection = {int32_t(fields.size()), fields.data()};
    return &collection;
  }
};

size_t fieldBytes(PluginField const& f) {
  switch (f.type) {
    case PluginFieldType::kUNKNOWN: case PluginFieldType::kINT8: case PluginFieldType::kCHAR: return f.length;
    case PluginFieldType::kINT64: case PluginFieldType::kFLOAT64: return size_t(f.length) * 8;
    default: return size_t(f.length) * 4;
  }
}

void loadFields(std::string const& path, OwnedFields& out) {
  std::vector<char> raw = readFile(path);
  size_t at = 0;
  while (at < raw.size()) {
    std::string name(raw.data() + at);
    at += name.size() + 1;
    int32_t type, length;
    std::memcpy(&type, raw.data() + at, 4);
    std::memcpy(&length, raw.data() + at + 4, 4);
    at += 8;
    PluginField probe(nullptr, nullptr, PluginFieldType(type), length);
    size_t bytes = fieldBytes(probe);
    if (at + bytes > raw.size()) die("fields.bin is truncated at field " + name);
    out.add(name.c_str(), PluginFieldType(type), length, raw.data() + at, bytes);
    at += bytes;
  }
}

// Deep copy of what getFieldsToSerialize returned: what an engine file would store.
void copyFields(PluginFieldCollection const* from, OwnedFields& out) {
  for (int32_t i = 0; i < from->nbFields; ++i) {
    PluginField const& f = from->fields[i];
    out.add(f.name, f.type, f.length, f.data, fieldBytes(f));
  }
}

struct CaseConfig {
  DataType dtype = DataType::kHALF;
  int64_t numBlocks = 0, layersInPool = 0, layerInPool = 0, numLayers = 0, maxBlocks = 0, chunkBytes = 0;
  int64_t numQHeads = 0, numKvHeads = 0, headDim = 0, layerIdx = 0;
  int32_t mappingPool = 0;  // the pool index the mapping gives the layer (1 or more: a pool that does not exist)
  int32_t steps = 0;
};

CaseConfig readCase(std::string const& path) {
  std::vector<char> raw = readFile(path);
  std::istringstream in(std::string(raw.begin(), raw.end()));
  CaseConfig c;
  for (std::string key; in >> key;) {
    if (key == "dtype") {
      std::string d;
      in >> d;
      c.dtype = d == "bf16" ? DataType::kBF16 : DataType::kHALF;
    } else if (key == "heads") {
      in >> c.numQHeads >> c.numKvHeads >> c.headDim >> c.layerIdx;
    } else if (key == "pool") {
      in >> c.numBlocks >> c.layersInPool >> c.layerInPool >> c.numLayers;
    } else if (key == "max_blocks") {
      in >> c.maxBlocks;
    } else if (key == "chunk_bytes") {
      in >> c.chunkBytes;
    } else if (key == "steps") {
      in >> c.steps;
    } else if (key == "mapping_pool") {
      in >> c.mappingPool;
    } else {
      die("case.txt: unknown key " + key);
    }
  }
  return c;
}

Dims makeDims(std::initializer_list<int64_t> values) {
  Dims d{};
  d.nbDims = int32_t(values.size());
  int32_t i = 0;
  for (int64_t v : values) d.d[i++] = v;
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) die("usage: tq_plugin_harness PLUGIN_LIBRARY CASE_DIR OUT_DIR");
  std::string const caseDir = argv[2], outDir = argv[3];
  report.open(outDir + "/report.txt");

  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) die(std::string("dlopen: ") + dlerror());
  using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
  auto getCreators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
  if (!getCreators || !dlsym(lib, "setLoggerFinder")) die("the library does not export getCreators and setLoggerFinder");
  int32_t nbCreators = 0;
  IPluginCreatorInterface* const* creators = getCreators(nbCreators);
  IPluginCreatorV3One* creator = nullptr;
  for (int32_t i = 0; i < nbCreators; ++i) {
    auto* c = static_cast<IPluginCreatorV3One*>(creators[i]);
    if (std::string(creators[i]->getInterfaceInfo().kind) == "PLUGIN CREATOR_V3ONE" &&
        std::string(c->getPluginName()) == "QuantizedAttention" && std::string(c->getPluginNamespace()) == "tq")
      creator = c;
  }
  if (!creator) die("no QuantizedAttention (tq) creator among getCreators()");
  report << "creator " << creator->getPluginName() << " " << creator->getPluginVersion() << " "
         << creator->getPluginNamespace() << "\n";

  OwnedFields given;
  loadFields(caseDir + "/fields.bin", given);
  std::unique_ptr<IPluginV3> built(creator->createPlugin("layer", given.finish(), TensorRTPhase::kBUILD));
  if (!built) die("createPlugin (build phase) refused the fields");
  auto* core = static_cast<IPluginV3OneCore*>(built->getCapabilityInterface(PluginCapabilityType::kCORE));
  auto* build = static_cast<IPluginV3OneBuild*>(built->getCapabilityInterface(PluginCapabilityType::kBUILD));
  auto* builtRuntime = static_cast<IPluginV3OneRuntime*>(built->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
  report << "plugin " << core->getPluginName() << " " << core->getPluginVersion() << " " << core->getPluginNamespace() << "\n";

  // Serialize, then recreate in the runtime phase from the copy, as deserializing an engine does.
  OwnedFields stored;
  copyFields(builtRuntime->getFieldsToSerialize(), stored);
  PluginFieldCollection const* storedFc = stored.finish();
  std::unique_ptr<IPluginV3> restored(creator->createPlugin("layer", storedFc, TensorRTPhase::kRUNTIME));
  if (!restored) die("createPlugin (runtime phase) refused the serialized fields");
  auto* restoredRuntime = static_cast<IPluginV3OneRuntime*>(restored->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
  std::unique_ptr<IPluginV3> attached(restoredRuntime->attachToContext(nullptr));
  if (!attached) die("attachToContext returned null");
  auto* runtime = static_cast<IPluginV3OneRuntime*>(attached->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
  report << "fields " << storedFc->nbFields << " serialized and restored\n";

  CaseConfig const cfg = readCase(caseDir + "/case.txt");
  if (cfg.headDim <= 0) die("case.txt: no heads line");
  int64_t const hq = cfg.numQHeads, hkv = cfg.numKvHeads, d = cfg.headDim, layer = cfg.layerIdx;
  int64_t const qkvWidth = (hq + 2 * hkv) * d, outWidth = hq * d;

  // Per-step metadata first, to size the workspace for the largest step as a build profile would.
  struct Step { std::vector<int32_t> meta; int32_t batch, tokens; };
  std::vector<Step> steps;
  int64_t maxTokens = 1, maxBatch = 1;
  for (int32_t s = 0; s < cfg.steps; ++s) {
    std::vector<char> raw = readFile(caseDir + "/step" + std::to_string(s) + "_meta.bin");
    Step st;
    st.meta.resize(raw.size() / 4);
    std::memcpy(st.meta.data(), raw.data(), raw.size());
    st.batch = st.meta[0];
    st.tokens = st.meta[1];
    maxTokens = std::max<int64_t>(maxTokens, st.tokens);
    maxBatch = std::max<int64_t>(maxBatch, st.batch);
    steps.push_back(std::move(st));
  }
  auto inputDims = [&](int64_t tokens, int64_t batch) {
    return std::vector<Dims>{makeDims({tokens, qkvWidth}), makeDims({batch}), makeDims({batch}), makeDims({batch}),
                             makeDims({1, batch, 1, 2, cfg.maxBlocks}), makeDims({1, 2}), makeDims({cfg.numLayers, 2})};
  };
  DataType const types[] = {cfg.dtype, DataType::kINT32, DataType::kINT32, DataType::kINT32,
                            DataType::kINT32, DataType::kINT64, DataType::kINT32};
  std::vector<Dims> maxDims = inputDims(maxTokens, maxBatch);
  std::vector<DynamicPluginTensorDesc> dyn(8);
  for (int32_t i = 0; i < 7; ++i) {
    dyn[i].desc.type = types[i];
    dyn[i].desc.format = TensorFormat::kLINEAR;
    dyn[i].desc.dims = dyn[i].min = dyn[i].opt = dyn[i].max = maxDims[i];
  }
  dyn[7].desc.type = cfg.dtype;
  dyn[7].desc.format = TensorFormat::kLINEAR;
  dyn[7].desc.dims = dyn[7].max = makeDims({maxTokens, outWidth});
  for (int32_t pos = 0; pos < 8; ++pos)
    if (!build->supportsFormatCombination(pos, dyn.data(), 7, 1)) die("supportsFormatCombination refused position " + std::to_string(pos));
  if (build->configurePlugin(dyn.data(), 7, dyn.data() + 7, 1) != 0) die("configurePlugin failed");
  size_t const workspaceBytes = build->getWorkspaceSize(dyn.data(), 7, dyn.data() + 7, 1);
  report << "workspace " << workspaceBytes << "\n";

  // The pool: [blocks][layers in pool][K, V][chunk], chunk = Hkv * tokens_per_block * head size bytes.
  // The chunk size is what the builder declares to TensorRT-LLM (docs/PLUGIN.md), given by the test.
  size_t const chunk = size_t(cfg.chunkBytes);
  size_t const poolBytes = size_t(cfg.numBlocks) * cfg.layersInPool * 2 * chunk;
  void *pool, *workspace, *qkv, *out, *offsets;
  check(cudaMalloc(&pool, poolBytes), "cudaMalloc pool");
  check(cudaMemset(pool, 0, poolBytes), "cudaMemset pool");
  check(cudaMalloc(&workspace, std::max<size_t>(workspaceBytes, 1)), "cudaMalloc workspace");
  size_t const elem = 2;
  check(cudaMalloc(&qkv, maxTokens * qkvWidth * elem), "cudaMalloc qkv");
  check(cudaMalloc(&out, maxTokens * outWidth * elem), "cudaMalloc out");
  check(cudaMalloc(&offsets, maxBatch * 2 * cfg.maxBlocks * 4), "cudaMalloc offsets");
  int64_t const poolPointers[2] = {int64_t(reinterpret_cast<uintptr_t>(pool)), 0};
  std::vector<int32_t> mapping(cfg.numLayers * 2, 0);
  mapping[layer * 2] = cfg.mappingPool;
  mapping[layer * 2 + 1] = int32_t(cfg.layerInPool);
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");

  for (int32_t s = 0; s < cfg.steps; ++s) {
    Step const& st = steps[s];
    std::string const prefix = "/step" + std::to_string(s);
    std::vector<char> hostQkv = readFile(caseDir + prefix + "_qkv.bin");
    std::vector<char> hostOffsets = readFile(caseDir + prefix + "_offsets.bin");
    check(cudaMemcpy(qkv, hostQkv.data(), hostQkv.size(), cudaMemcpyHostToDevice), "copy qkv");
    check(cudaMemcpy(offsets, hostOffsets.data(), hostOffsets.size(), cudaMemcpyHostToDevice), "copy offsets");
    check(cudaMemset(out, 0xFF, st.tokens * outWidth * elem), "poison out");  // NaN unless written
    std::vector<Dims> dims = inputDims(st.tokens, st.batch);
    PluginTensorDesc in[7], outDesc{};
    for (int32_t i = 0; i < 7; ++i) in[i] = {dims[i], types[i], TensorFormat::kLINEAR, 1.f};
    outDesc = {makeDims({st.tokens, outWidth}), cfg.dtype, TensorFormat::kLINEAR, 1.f};
    int32_t const* m = st.meta.data();
    void const* inputs[7] = {qkv, m + 2 + st.batch, m + 2 + 2 * st.batch, m + 2, offsets, poolPointers, mapping.data()};
    void* outputs[1] = {out};
    int32_t status = runtime->onShapeChange(in, 7, &outDesc, 1);
    if (status == 0) status = runtime->enqueue(in, &outDesc, inputs, outputs, workspace, stream);
    check(cudaStreamSynchronize(stream), "step");
    std::ofstream(outDir + prefix + "_status.txt") << status << "\n";
    std::vector<char> hostOut(st.tokens * outWidth * elem);
    check(cudaMemcpy(hostOut.data(), out, hostOut.size(), cudaMemcpyDeviceToHost), "copy out");
    writeFile(outDir + prefix + "_out.bin", hostOut.data(), hostOut.size());
    report << "step " << s << " status " << status << "\n";
  }
  std::vector<char> hostPool(poolBytes);
  check(cudaMemcpy(hostPool.data(), pool, poolBytes, cudaMemcpyDeviceToHost), "copy pool");
  writeFile(outDir + "/pool.bin", hostPool.data(), poolBytes);
  attached.reset();
  restored.reset();
  built.reset();
  cudaFree(pool);
  cudaFree(workspace);
  cudaFree(qkv);
  cudaFree(out);
  cudaFree(offsets);
  cudaStreamDestroy(stream);
  report << "done\n";
  return 0;
}
