// test_plugin_build.cpp: the plugin's build-time behaviour and field handling, on the CPU, with no
// libnvinfer and no GPU (the kernel library is replaced by fake_tq_kernels.cpp).
// Covers: creation from fields (canonical and ONNX-importable forms) and the serialize -> recreate
// round trip, refusal of every kind of bad field with a message naming it, the layer table format,
// its version checks and every refusal of its contents, messages through the logger TensorRT's
// ILoggerFinder gives, output types and shapes, supported formats, workspace size, pool arithmetic
// and the batch plan. `--fields` prints the creator's identity and fields (tests/test_plugin_unit.py
// compares them with quantized_attention_fields.json); `--table FILE` prints a table's contents.
#include "batch_plan.h"
#include "layer_table.h"
#include "io_layout.h"
#include "plugin_creator.h"
#include "plugin_log.h"
#include "plugin_shapes.h"
#include "quantized_attention_plugin.h"
#include "tq/tq_kernels.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace nvinfer1;
using namespace tq::plugin;

extern "C" IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);
extern "C" void setLoggerFinder(ILoggerFinder* finder);

namespace {

int gFailures = 0;
#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
      ++gFailures;                                                          \
    }                                                                       \
  } while (0)

// Captures what the plugin logs, to check that a refusal names the field.
class CapturingLogger : public ILogger {
 public:
  void log(Severity, AsciiChar const* msg) noexcept override { last = msg; }
  std::string last;
};
CapturingLogger gLogger;

constexpr int32_t kHq = 8, kHkv = 2, kD = 128, kLayer = 3, kT = 64;
constexpr uint64_t kFingerprint = 0x1234567890abcdefULL;
constexpr uint32_t kSeed = 0x9E3779B9u;

LayerTable makeTable(int32_t keyX2 = 6, int32_t valueX2 = 7) {
  LayerTable t;
  t.modelFingerprint = kFingerprint;
  t.layerIdx = kLayer;
  t.numKvHeads = kHkv;
  t.numQHeads = kHq;
  t.headDim = kD;
  t.keyWidthX2 = keyX2;
  t.valueWidthX2 = valueX2;
  t.rotationSeed = kSeed;
  auto codebooks = [](int32_t x2) {
    std::vector<float> c;
    int32_t groups = x2 % 2 ? 2 : 1;
    int32_t bits[2] = {x2 % 2 ? x2 / 2 + 1 : x2 / 2, x2 / 2};
    for (int32_t g = 0; g < groups; ++g)
      for (int32_t k = 0; k < (1 << bits[g]); ++k) c.push_back(-1.f + 2.f * (k + 0.5f) / (1 << bits[g]));
    return c;
  };
  t.key.codebooks = codebooks(keyX2);
  t.value.codebooks = codebooks(valueX2);
  t.key.mean.assign(kHkv * kD, 0.25f);
  t.key.scale.assign(kHkv * kD, 1.5f);
  if (valueX2 % 2) {
    for (int32_t h = 0; h < kHkv; ++h)
      for (int32_t j = 0; j < kD; ++j) t.value.perm.push_back((j * 5 + h) % kD);  // 5 is odd: a permutation
  }
  return t;
}

// A complete, valid field set; `tweak` edits it before the collection is made.
struct FieldSet {
  int32_t tokensPerBlock = kT, scaling = 2, origMax = 8192;
  float ropeBase = 500000.f, factor = 8.f, low = 1.f, high = 4.f;
  std::vector<uint8_t> table = serializeLayerTable(makeTable());
  std::vector<PluginField> fields;
  PluginFieldCollection fc{};

  FieldSet() {
    fields = {
        {"tokens_per_block", &tokensPerBlock, PluginFieldType::kINT32, 1},
        {"rope_base", &ropeBase, PluginFieldType::kFLOAT32, 1},
        {"rope_scaling_type", &scaling, PluginFieldType::kINT32, 1},
        {"rope_scaling_factor", &factor, PluginFieldType::kFLOAT32, 1},
        {"rope_low_freq_factor", &low, PluginFieldType::kFLOAT32, 1},
        {"rope_high_freq_factor", &high, PluginFieldType::kFLOAT32, 1},
        {"rope_original_max_positions", &origMax, PluginFieldType::kINT32, 1},
        {"layer_table", nullptr, PluginFieldType::kUNKNOWN, 0},
    };
  }
  PluginField* field(char const* name) {
    for (PluginField& f : fields)
      if (std::strcmp(f.name, name) == 0) return &f;
    return nullptr;
  }
  void remove(char const* name) {
    for (size_t i = 0; i < fields.size(); ++i)
      if (std::strcmp(fields[i].name, name) == 0) fields.erase(fields.begin() + i);
  }
  void setTable(LayerTable const& t) { table = serializeLayerTable(t); }
  PluginFieldCollection const* collection() {
    if (PluginField* t = field("layer_table")) {
      t->data = table.data();
      t->length = int32_t(table.size());
    }
    fc.nbFields = int32_t(fields.size());
    fc.fields = fields.data();
    return &fc;
  }
};

IPluginCreatorV3One& creator() {
  int32_t n = 0;
  IPluginCreatorInterface* const* creators = getCreators(n);
  CHECK(n == 1);
  return *static_cast<IPluginCreatorV3One*>(creators[0]);
}

std::unique_ptr<QuantizedAttentionPlugin> create(PluginFieldCollection const* fc, TensorRTPhase phase) {
  return std::unique_ptr<QuantizedAttentionPlugin>(
      static_cast<QuantizedAttentionPlugin*>(creator().createPlugin("layer", fc, phase)));
}

void testCreatorIdentity() {
  IPluginCreatorV3One& c = creator();
  CHECK(std::string(c.getPluginName()) == "QuantizedAttention");
  CHECK(std::string(c.getPluginNamespace()) == "tq");
  // The version and the fields are quantized_attention_fields.json's (checked against it by
  // tests/test_plugin_unit.py through --fields); the plugin reports what its creator does.
  FieldSet fs;
  auto plugin = create(fs.collection(), TensorRTPhase::kBUILD);
  CHECK(plugin && std::string(plugin->getPluginVersion()) == c.getPluginVersion());
  CHECK(c.getFieldNames()->nbFields == int32_t(fs.fields.size()));
}

void testCreateSerializeRecreate() {
  FieldSet fs;
  auto built = create(fs.collection(), TensorRTPhase::kBUILD);
  CHECK(built != nullptr);
  if (!built) return;
  CHECK(built->getCapabilityInterface(PluginCapabilityType::kCORE) != nullptr);
  PluginFieldCollection const* saved = built->getFieldsToSerialize();
  PluginFieldCollection const* declared = creator().getFieldNames();
  CHECK(saved->nbFields == declared->nbFields);
  for (int32_t i = 0; i < saved->nbFields && i < declared->nbFields; ++i)  // the declaration's order and types
    CHECK(std::strcmp(saved->fields[i].name, declared->fields[i].name) == 0 &&
          saved->fields[i].type == declared->fields[i].type);
  // Recreate in the runtime phase from a deep copy of the serialized fields, as an engine would.
  std::vector<std::vector<uint8_t>> storage;
  std::vector<std::string> names;
  std::vector<PluginField> copy;
  for (int32_t i = 0; i < saved->nbFields; ++i) {
    PluginField const& f = saved->fields[i];
    size_t bytes = f.type == PluginFieldType::kUNKNOWN ? f.length : 4;
    auto const* p = static_cast<uint8_t const*>(f.data);
    storage.emplace_back(p, p + bytes);
    names.emplace_back(f.name);
  }
  for (size_t i = 0; i < storage.size(); ++i)
    copy.emplace_back(names[i].c_str(), storage[i].data(), saved->fields[i].type, saved->fields[i].length);
  PluginFieldCollection fc{int32_t(copy.size()), copy.data()};
  auto restored = create(&fc, TensorRTPhase::kRUNTIME);
  CHECK(restored != nullptr);
  if (!restored) return;
  PluginConfig const& a = built->config();
  PluginConfig const& b = restored->config();
  CHECK(a.tokensPerBlock == kT && b.tokensPerBlock == kT && a.tableBytes == b.tableBytes);
  // The layer's identity and codecs, from the table alone.
  for (LayerTable const* t : {&a.table, &b.table}) {
    CHECK(t->numQHeads == kHq && t->numKvHeads == kHkv && t->headDim == kD && t->layerIdx == kLayer);
    CHECK(t->keyWidthX2 == 6 && t->valueWidthX2 == 7);
    CHECK(t->rotationSeed == kSeed && t->modelFingerprint == kFingerprint);
  }
  CHECK(b.rope.scaling == TQ_ROPE_SCALING_LLAMA3 && b.rope.factor == 8.f && b.rope.original_max_positions == 8192);
  CHECK(b.table.value.perm.size() == size_t(kHkv * kD) && b.table.key.mean.size() == size_t(kHkv * kD));
  // clone carries the same fields
  std::unique_ptr<IPluginV3> cloned(restored->clone());
  auto* c = static_cast<QuantizedAttentionPlugin*>(cloned.get());
  CHECK(c && c->config().tableBytes == a.tableBytes);
}

void testLayerTableRoundTrip() {
  LayerTable t = makeTable(7, 4);
  t.key.perm.clear();
  for (int32_t h = 0; h < kHkv; ++h)
    for (int32_t j = 0; j < kD; ++j) t.key.perm.push_back(kD - 1 - j);
  for (int32_t h = 0; h < kHq; ++h) t.pageShift.push_back(0.1f * h);
  t.rotaryPairs = 3;
  for (int32_t h = 0; h < kHkv; ++h)
    for (int32_t i = 0; i < 3; ++i) {
      t.rotaryChannel.push_back(5 * i + h);
      t.rotaryFreq.push_back(0.5f / (i + 1));
      t.rotaryMean.push_back(float(h - i));
      t.rotaryMean.push_back(0.25f * i);
    }
  std::vector<uint8_t> bytes = serializeLayerTable(t);
  CHECK(bytes.size() > kLayerTableHeaderBytes);
  LayerTable back;
  std::string error;
  CHECK(parseLayerTable(bytes.data(), bytes.size(), back, error));
  CHECK(back.rotationSeed == kSeed && back.modelFingerprint == kFingerprint && back.layerIdx == kLayer);
  CHECK(back.key.perm == t.key.perm && back.key.mean == t.key.mean && back.key.scale == t.key.scale);
  CHECK(back.key.codebooks == t.key.codebooks && back.value.codebooks == t.value.codebooks);
  CHECK(back.value.perm.empty() && back.value.mean.empty());
  CHECK(back.numQHeads == kHq && back.pageShift == t.pageShift);
  CHECK(back.rotaryPairs == 3 && back.rotaryChannel == t.rotaryChannel && back.rotaryFreq == t.rotaryFreq &&
        back.rotaryMean == t.rotaryMean);
  CHECK(serializeLayerTable(back) == bytes);
  LayerTable bad = t;  // a channel named twice, a frequency beyond pi: refused with a reason
  bad.rotaryChannel[1] = bad.rotaryChannel[0];
  bytes = serializeLayerTable(bad);
  CHECK(!parseLayerTable(bytes.data(), bytes.size(), back, error) && error.find("rotary") != std::string::npos);
  bad = t;
  bad.rotaryFreq[2] = 4.f;
  bytes = serializeLayerTable(bad);
  CHECK(!parseLayerTable(bytes.data(), bytes.size(), back, error) && error.find("rotary") != std::string::npos);
  t.pageShift.clear();  // absent: no flag, no bytes
  bytes = serializeLayerTable(t);
  CHECK(parseLayerTable(bytes.data(), bytes.size(), back, error) && back.pageShift.empty());
}

// Creation must fail and the message `logger` got must contain each of `expected` (the field's name,
// and more).
void expectRefusedTo(CapturingLogger& logger, char const* what, std::function<void(FieldSet&)> tweak,
                     std::vector<std::string> const& expected) {
  FieldSet fs;
  tweak(fs);
  gLogger.last.clear();
  logger.last.clear();
  auto plugin = create(fs.collection(), TensorRTPhase::kBUILD);
  bool named = true;
  for (std::string const& piece : expected) named = named && logger.last.find(piece) != std::string::npos;
  if (plugin || !named) {
    std::printf("FAIL refusal '%s': created=%d, logged: %s\n", what, plugin != nullptr, logger.last.c_str());
    ++gFailures;
  }
}
void expectRefused(char const* what, std::function<void(FieldSet&)> tweak, std::string const& expected) {
  expectRefusedTo(gLogger, what, std::move(tweak), {expected});
}
// A table made by `edit` of a valid one must be refused with `expected` after "field 'layer_table' ",
// and the message must hold each of `details` too (the kernel library's words, where it judges).
void expectTableRefused(char const* what, std::function<void(LayerTable&)> edit, std::string const& expected,
                        std::vector<std::string> details = {}) {
  details.push_back("field 'layer_table' " + expected);
  expectRefusedTo(gLogger, what, [&](FieldSet& f) {
    LayerTable t = makeTable();
    edit(t);
    f.setTable(t);
  }, details);
}
// The same for a valid table's bytes with a 4-byte word at `offset` replaced (checksum left as it was).
void expectPatchedTableRefused(char const* what, size_t offset, uint32_t value, std::string const& expected) {
  expectRefused(what, [&](FieldSet& f) { std::memcpy(f.table.data() + offset, &value, 4); },
                "field 'layer_table' " + expected);
}

void testFieldValidation() {
  int32_t const fortyTwo = 42;
  expectRefused("missing field", [](FieldSet& f) { f.remove("tokens_per_block"); }, "'tokens_per_block' is missing");
  expectRefused("missing table", [](FieldSet& f) { f.remove("layer_table"); }, "'layer_table' is missing");
  expectRefused("tokens_per_block", [](FieldSet& f) { f.tokensPerBlock = 24; }, "'tokens_per_block' is 24");
  expectRefused("wrong type", [](FieldSet& f) { f.field("tokens_per_block")->type = PluginFieldType::kFLOAT32; },
                "'tokens_per_block' must have type kINT32");
  expectRefused("two values", [](FieldSet& f) { f.field("tokens_per_block")->length = 2; }, "'tokens_per_block'");
  expectRefused("null data", [](FieldSet& f) { f.field("rope_base")->data = nullptr; }, "'rope_base'");
  expectRefused("unknown field", [](FieldSet& f) { f.field("rope_base")->name = "rope_theta"; },
                "field 'rope_theta' is not a field of QuantizedAttention");
  expectRefused("duplicate", [](FieldSet& f) { f.fields.push_back(*f.field("rope_base")); }, "'rope_base' is given twice");
  expectRefused("llama3 without factors", [](FieldSet& f) { f.remove("rope_low_freq_factor"); },
                "'rope_low_freq_factor' is missing");
  expectRefused("bad rope base", [](FieldSet& f) { f.ropeBase = -1.f; }, "'rope_base'");
  expectRefused("table as int32", [](FieldSet& f) { f.field("layer_table")->type = PluginFieldType::kINT32; },
                "'layer_table' must have type kUNKNOWN or kINT8");
  // The fields of version 1 whose values the layer table now carries: named, with what to do.
  for (char const* moved : {"num_q_heads", "num_kv_heads", "head_dim", "layer_idx", "key_width", "value_width",
                            "rotation_seed", "model_fingerprint"}) {
    expectRefused(moved, [&](FieldSet& f) { f.fields.push_back({moved, &fortyTwo, PluginFieldType::kINT32, 1}); },
                  std::string("field '") + moved + "' is not a field of QuantizedAttention version " +
                      creator().getPluginVersion() +
                      ": its value comes from the layer table (field 'layer_table'); rebuild the ONNX graph or "
                      "engine with this tq_trtllm");
  }
  gLogger.last.clear();
  CHECK(creator().createPlugin("x", nullptr, TensorRTPhase::kBUILD) == nullptr);
  CHECK(gLogger.last.find("PluginFieldCollection") != std::string::npos);
}

// Every refusal of the table's contents, with its message after "field 'layer_table' ".
void testTableRefusals() {
  // What the kernels support: head_dim, heads, widths (the header is the only source of these);
  // head_dim and widths in the kernel library's words (tq_codec_codebook_entries, tq_codec_init).
  expectTableRefused("head_dim 96", [](LayerTable& t) { t.headDim = 96; }, "has keys the kernel library cannot encode: ",
                     {"head_dim 96", "64 and 128"});
  expectTableRefused("no KV heads", [](LayerTable& t) { t.numKvHeads = 0; }, "has 0 KV heads; it needs at least 1");
  expectTableRefused("query heads not a multiple", [](LayerTable& t) { t.numQHeads = 7; },
                     "has 7 query heads; the kernels need 1 to " + std::to_string(TQ_MAX_GQA_GROUP) + " times its 2 KV heads");
  expectTableRefused("GQA group too big", [](LayerTable& t) { t.numQHeads = 2 * (TQ_MAX_GQA_GROUP + 1); },
                     "has " + std::to_string(2 * (TQ_MAX_GQA_GROUP + 1)) + " query heads; the kernels need 1 to");
  expectTableRefused("negative layer", [](LayerTable& t) { t.layerIdx = -1; }, "has layer index -1; it must not be negative");
  expectTableRefused("key width 5.5", [](LayerTable& t) { t.keyWidthX2 = 11; }, "has keys the kernel library cannot encode: ",
                     {"width_x2 11", "supported widths are"});
  expectTableRefused("value width 0.5", [](LayerTable& t) { t.valueWidthX2 = 1; },
                     "has values the kernel library cannot encode: ", {"width_x2 1 ", "supported widths are"});
  // The header's own rules (offsets: docs/PLUGIN.md, section "Layer table field").
  expectPatchedTableRefused("reserved word", 68, 1, "has a non-zero reserved header word");
  expectPatchedTableRefused("header size", 12, 64, "has a malformed header (header size 64, not 72)");
  expectPatchedTableRefused("unknown flag", 44, 1u << 12, "sets flag bits this plugin does not know");
  expectRefused("corrupt table", [](FieldSet& f) { f.table[100] ^= 0x40; }, "'layer_table' fails its checksum");
  expectRefused("truncated table", [](FieldSet& f) { f.table.resize(f.table.size() - 4); }, "payload bytes");
  expectRefused("shorter than its header", [](FieldSet& f) { f.table.resize(40); },
                "'layer_table' is 40 bytes, shorter than its 72-byte header");
  expectRefused("not a table", [](FieldSet& f) { f.table.assign(80, 0); }, "'TQCT'");
  // The arrays.
  expectTableRefused("page shift out of range", [](LayerTable& t) {
    t.pageShift.assign(kHq, 0.2f);
    t.pageShift[2] = 9.f;
  }, "has a page shift that is not finite");
  expectTableRefused("perm on integer width", [](LayerTable& t) {
    t = makeTable(6, 6);
    t.key.perm.assign(kHkv * kD, 0);
    for (int32_t i = 0; i < kHkv * kD; ++i) t.key.perm[i] = i % kD;
  }, "has a key perm, but integer width 3");
  expectTableRefused("not a permutation", [](LayerTable& t) { t.value.perm[5] = t.value.perm[6]; },
                     "value perm of KV head 0 is not a permutation");
  expectTableRefused("descending codebook", [](LayerTable& t) { t.key.codebooks[1] = -5.f; },
                     "has a key codebook the kernel library refuses: ", {"entry 1 (group 0, level 1)", "ascending"});
  expectTableRefused("non-finite codebook", [](LayerTable& t) { t.value.codebooks[9] = NAN; },
                     "has a value codebook the kernel library refuses: ", {"entry 9", "finite"});
  expectTableRefused("non-positive scale", [](LayerTable& t) { t.key.scale[3] = 0.f; },
                     "key scale has an entry that is not finite and positive");
}

// The ONNX-importable form of the table (kINT8, what an ONNX node's INT8 tensor gives) creates the
// same plugin, and it serializes the canonical kUNKNOWN.
void testOnnxFieldForms() {
  FieldSet fs;
  PluginFieldCollection const* fc = fs.collection();
  fs.field("layer_table")->type = PluginFieldType::kINT8;
  gLogger.last.clear();
  auto plugin = create(fc, TensorRTPhase::kBUILD);
  if (!plugin) {
    std::printf("FAIL the table as kINT8 refused: %s\n", gLogger.last.c_str());
    ++gFailures;
    return;
  }
  CHECK(plugin->config().tableBytes == fs.table && plugin->config().table.modelFingerprint == kFingerprint);
  PluginFieldCollection const* saved = plugin->getFieldsToSerialize();
  for (int32_t i = 0; i < saved->nbFields; ++i) {
    PluginField const& f = saved->fields[i];
    if (std::strcmp(f.name, "layer_table") == 0)
      CHECK(f.type == PluginFieldType::kUNKNOWN && f.length == int32_t(fs.table.size()));
  }
}

// A table of another table version or packed format version is refused with both versions named.
void testTableVersionsRefused() {
  std::vector<uint8_t> const good = serializeLayerTable(makeTable());
  auto patched = [&](size_t offset, uint32_t value) {
    std::vector<uint8_t> bytes = good;
    std::memcpy(bytes.data() + offset, &value, 4);
    return bytes;
  };
  struct Case { size_t offset; uint32_t value; std::string expected; };
  std::string const readable = "reads versions " + std::to_string(TQ_OLDEST_READABLE_FORMAT_VERSION) + " to " +
                               std::to_string(TQ_FORMAT_VERSION);
  std::string const rebuild = ": rebuild the engine (or ONNX graph) with this tq_trtllm";
  Case const cases[] = {
      {4, 3, "has layer table version 3; this plugin reads version 4" + rebuild},
      {4, kLayerTableVersion + 1, "has layer table version " + std::to_string(kLayerTableVersion + 1) +
                                      "; this plugin reads version " + std::to_string(kLayerTableVersion) + rebuild},
      {8, TQ_FORMAT_VERSION + 1, "was made for packed cache format version " + std::to_string(TQ_FORMAT_VERSION + 1) +
                                     "; this plugin " + readable},
      {8, TQ_OLDEST_READABLE_FORMAT_VERSION - 1, "was made for packed cache format version " +
                                                     std::to_string(TQ_OLDEST_READABLE_FORMAT_VERSION - 1) +
                                                     "; this plugin " + readable},
  };
  LayerTable back;
  std::string error;
  CHECK(parseLayerTable(good.data(), good.size(), back, error));
  for (Case const& c : cases) {
    std::vector<uint8_t> bytes = patched(c.offset, c.value);
    error.clear();
    bool parsed = parseLayerTable(bytes.data(), bytes.size(), back, error);
    if (parsed || error.find(c.expected) == std::string::npos) {
      std::printf("FAIL version refusal (offset %zu = %u): parsed=%d, error: %s\n", c.offset, c.value, parsed,
                  error.c_str());
      ++gFailures;
    }
    expectRefused("table version", [&](FieldSet& f) { f.table = bytes; }, "'layer_table' " + c.expected);
  }
  // A version 3 table is shorter than the version 4 header can be: still refused for its version.
  std::vector<uint8_t> v3 = patched(4, 3);
  v3.resize(64);
  CHECK(!parseLayerTable(v3.data(), v3.size(), back, error) && error.find("has layer table version 3") != std::string::npos);
}

// With an ILoggerFinder set (TensorRT calls setLoggerFinder when it loads the library), messages go
// to the logger it finds; where it finds none, to the logger set before.
class FakeLoggerFinder : public ILoggerFinder {
 public:
  ILogger* findLogger() noexcept override { return logger; }
  ILogger* logger = nullptr;
};

void testMessagesGoThroughTheLoggerFinder() {
  CapturingLogger found;
  FakeLoggerFinder finder;
  finder.logger = &found;
  setLoggerFinder(&finder);
  expectRefusedTo(found, "logged through the finder", [](FieldSet& f) { f.tokensPerBlock = 24; }, {"'tokens_per_block'"});
  CHECK(gLogger.last.empty());
  finder.logger = nullptr;
  found.last.clear();
  expectRefusedTo(gLogger, "finder without a logger", [](FieldSet& f) { f.tokensPerBlock = 24; }, {"'tokens_per_block'"});
  CHECK(found.last.empty());
  setLoggerFinder(nullptr);
}

// Stand-ins for a logger and finder of the other TensorRT line's virtual-table layout
// (plugin_log.h): the plain one of TensorRT 10, the versioned one of TensorRT 11 and TensorRT-RTX.
struct PlainLoggerStandIn {
  virtual void log(int32_t, char const* msg) { last = msg; }
  virtual ~PlainLoggerStandIn() = default;
  std::string last;
};
struct PlainFinderStandIn {
  explicit PlainFinderStandIn(PlainLoggerStandIn* l) : logger(l) {}
  virtual PlainLoggerStandIn* findLogger() { return logger; }
  virtual ~PlainFinderStandIn() = default;
  PlainLoggerStandIn* logger;
};
struct VersionedLoggerStandIn {
  virtual int32_t getAPILanguage() const { return 0; }
  virtual InterfaceInfo getInterfaceInfo() const { return {"ILogger", 1, 0}; }
  virtual ~VersionedLoggerStandIn() = default;
  virtual void log(int32_t, char const* msg) { last = msg; }
  std::string last;
};
struct VersionedFinderStandIn {
  explicit VersionedFinderStandIn(VersionedLoggerStandIn* l) : logger(l) {}
  virtual int32_t getAPILanguage() const { return 0; }
  virtual InterfaceInfo getInterfaceInfo() const { return {"ILoggerFinder", 1, 0}; }
  virtual ~VersionedFinderStandIn() = default;
  virtual VersionedLoggerStandIn* findLogger() { return logger; }
  VersionedLoggerStandIn* logger;
};

// A library built against one TensorRT line logs through the finder and logger of the other.
template <typename Finder, typename Logger>
void checkFinderOfLayout(InterfaceLayout layout) {
  Logger logger;
  Finder finder(&logger);
  useLoggerFinder(reinterpret_cast<ILoggerFinder*>(&finder), layout);
  FieldSet fs;
  fs.tokensPerBlock = 24;
  gLogger.last.clear();
  CHECK(create(fs.collection(), TensorRTPhase::kBUILD) == nullptr);
  CHECK(logger.last.find("field 'tokens_per_block'") != std::string::npos && gLogger.last.empty());
  useLoggerFinder(nullptr);
}

void testLoggerFinderOfEitherLayout() {
  if (kHeadersLayout == InterfaceLayout::kPlain)
    checkFinderOfLayout<VersionedFinderStandIn, VersionedLoggerStandIn>(InterfaceLayout::kVersioned);
  else
    checkFinderOfLayout<PlainFinderStandIn, PlainLoggerStandIn>(InterfaceLayout::kPlain);
  // the layout comes from the name of the library that made the finder
  CHECK(layoutOfLibrary("/usr/lib/x86_64-linux-gnu/libnvinfer.so.10") == InterfaceLayout::kPlain);
  CHECK(layoutOfLibrary("/opt/tensorrt/lib/libnvinfer.so.10.13.0") == InterfaceLayout::kPlain);
  CHECK(layoutOfLibrary("libnvinfer_lean.so.10") == InterfaceLayout::kPlain);
  CHECK(layoutOfLibrary("/opt/tensorrt/lib/libnvinfer.so.11.1.0") == InterfaceLayout::kVersioned);
  CHECK(layoutOfLibrary("/site-packages/tensorrt_rtx_libs/libtensorrt_rtx.so.1") == InterfaceLayout::kVersioned);
  CHECK(layoutOfLibrary("/usr/bin/trtexec") == kHeadersLayout);
}

// A minimal stand-in for TensorRT's expression builder: constants only, which is all the plugin uses.
class FakeDimImpl : public apiv::VDimensionExpr {
 public:
  explicit FakeDimImpl(int64_t v, bool constant = true) : value(v), isConst(constant) {}
  bool isConstant() const override { return isConst; }
  int64_t getConstantValue() const override { return value; }
  bool isSizeTensor() const override { return false; }
  int64_t value;
  bool isConst;
};
class FakeDim : public IDimensionExpr {
 public:
  explicit FakeDim(int64_t v, bool constant = true) : impl(v, constant) { mImpl = &impl; }
  FakeDimImpl impl;
};
class FakeBuilderImpl : public apiv::VExprBuilder {
 public:
  IDimensionExpr const* constant(int64_t v) override { return made.emplace_back(new FakeDim(v)).get(); }
  IDimensionExpr const* operation(DimensionOperation, IDimensionExpr const&, IDimensionExpr const&) override {
    return nullptr;
  }
  IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&, IDimensionExpr const&) override {
    return nullptr;
  }
  std::vector<std::unique_ptr<FakeDim>> made;
};
class FakeBuilder : public IExprBuilder {
 public:
  FakeBuilder() { mImpl = &impl; }
  FakeBuilderImpl impl;
};

// Shapes of the seven inputs for `tokens` tokens, `batch` requests, `maxBlocks` blocks each.
std::vector<Dims> inputDims(int64_t tokens, int64_t batch, int64_t maxBlocks, int64_t qkvWidthValue) {
  auto dims = [](std::initializer_list<int64_t> values) {
    Dims d{};
    d.nbDims = int32_t(values.size());
    int32_t i = 0;
    for (int64_t v : values) d.d[i++] = v;
    return d;
  };
  return {dims({tokens, qkvWidthValue}), dims({batch}), dims({batch}), dims({batch}),
          dims({1, batch, 1, 2, maxBlocks}), dims({1, 2}), dims({32, 2})};
}

void testOutputTypesAndShapes() {
  FieldSet fs;
  auto plugin = create(fs.collection(), TensorRTPhase::kBUILD);
  if (!plugin) return ++gFailures, void();
  CHECK(plugin->getNbOutputs() == 1);
  DataType in[kNumInputs] = {DataType::kHALF, DataType::kINT32, DataType::kINT32, DataType::kINT32,
                             DataType::kINT32, DataType::kINT64, DataType::kINT32};
  DataType out = DataType::kFLOAT;
  CHECK(plugin->getOutputDataTypes(&out, 1, in, kNumInputs) == 0 && out == DataType::kHALF);
  in[kQkv] = DataType::kBF16;
  CHECK(plugin->getOutputDataTypes(&out, 1, in, kNumInputs) == 0 && out == DataType::kBF16);
  in[kQkv] = DataType::kFLOAT;
  CHECK(plugin->getOutputDataTypes(&out, 1, in, kNumInputs) != 0);
  CHECK(plugin->getOutputDataTypes(&out, 1, in, 3) != 0);

  FakeBuilder builder;
  FakeDim tokens(-1, false), width((kHq + 2 * kHkv) * kD), batch(-1, false), one(1), two(2), blocks(-1, false),
      pools(1), layers(32), badWidth(kHq * kD);
  std::vector<DimsExprs> inputs(kNumInputs);
  auto set = [](DimsExprs& e, std::initializer_list<IDimensionExpr const*> d) {
    e.nbDims = int32_t(d.size());
    int32_t i = 0;
    for (auto* x : d) e.d[i++] = x;
  };
  set(inputs[kQkv], {&tokens, &width});
  set(inputs[kHostPastKvLengths], {&batch});
  set(inputs[kHostContextLengths], {&batch});
  set(inputs[kHostRequestTypes], {&batch});
  set(inputs[kBlockOffsets], {&pools, &batch, &one, &two, &blocks});
  set(inputs[kHostPoolPointers], {&pools, &two});
  set(inputs[kHostPoolMapping], {&layers, &two});
  DimsExprs output{};
  CHECK(plugin->getOutputShapes(inputs.data(), kNumInputs, nullptr, 0, &output, 1, builder) == 0);
  CHECK(output.nbDims == 2 && output.d[0] == &tokens);
  CHECK(output.d[1] && output.d[1]->isConstant() && output.d[1]->getConstantValue() == kHq * kD);

  gLogger.last.clear();
  set(inputs[kQkv], {&tokens, &badWidth});
  CHECK(plugin->getOutputShapes(inputs.data(), kNumInputs, nullptr, 0, &output, 1, builder) != 0);
  CHECK(gLogger.last.find("'qkv'") != std::string::npos);
  set(inputs[kQkv], {&tokens, &width});
  set(inputs[kBlockOffsets], {&pools, &batch, &two, &two, &blocks});  // beam width 2
  CHECK(plugin->getOutputShapes(inputs.data(), kNumInputs, nullptr, 0, &output, 1, builder) != 0);
  CHECK(gLogger.last.find("beam width 1") != std::string::npos);
  set(inputs[kBlockOffsets], {&pools, &batch, &one, &two, &blocks});
  FakeDim fewLayers(kLayer);
  set(inputs[kHostPoolMapping], {&fewLayers, &two});
  CHECK(plugin->getOutputShapes(inputs.data(), kNumInputs, nullptr, 0, &output, 1, builder) != 0);
  CHECK(gLogger.last.find("maps 3 layers, but the layer table's layer index is 3") != std::string::npos);
  set(inputs[kHostPoolMapping], {&layers});  // wrong rank
  CHECK(plugin->getOutputShapes(inputs.data(), kNumInputs, nullptr, 0, &output, 1, builder) != 0);
  CHECK(plugin->getOutputShapes(inputs.data(), 5, nullptr, 0, &output, 1, builder) != 0);
}

std::vector<DynamicPluginTensorDesc> descs(std::vector<DataType> const& types, int64_t tokens, int64_t batch,
                                           int64_t maxBlocks) {
  std::vector<Dims> dims = inputDims(tokens, batch, maxBlocks, (kHq + 2 * kHkv) * kD);
  dims.push_back(dims[0]);
  dims.back().d[1] = kHq * kD;
  std::vector<DynamicPluginTensorDesc> d(types.size());
  for (size_t i = 0; i < types.size(); ++i) {
    d[i].desc.type = types[i];
    d[i].desc.format = TensorFormat::kLINEAR;
    d[i].desc.dims = d[i].min = d[i].opt = d[i].max = dims[i];
  }
  return d;
}

void testSupportsFormatCombination() {
  FieldSet fs;
  auto plugin = create(fs.collection(), TensorRTPhase::kBUILD);
  if (!plugin) return ++gFailures, void();
  std::vector<DataType> good = {DataType::kHALF, DataType::kINT32, DataType::kINT32, DataType::kINT32,
                                DataType::kINT32, DataType::kINT64, DataType::kINT32, DataType::kHALF};
  auto d = descs(good, 16, 2, 4);
  for (int32_t pos = 0; pos < 8; ++pos) CHECK(plugin->supportsFormatCombination(pos, d.data(), 7, 1));
  d[kQkv].desc.type = d[7].desc.type = DataType::kBF16;
  CHECK(plugin->supportsFormatCombination(kQkv, d.data(), 7, 1) && plugin->supportsFormatCombination(7, d.data(), 7, 1));
  d[7].desc.type = DataType::kHALF;  // output must follow qkv
  CHECK(!plugin->supportsFormatCombination(7, d.data(), 7, 1));
  d[kQkv].desc.type = DataType::kFLOAT;
  CHECK(!plugin->supportsFormatCombination(kQkv, d.data(), 7, 1));
  d[kQkv].desc.type = DataType::kHALF;
  d[kHostPoolPointers].desc.type = DataType::kINT32;
  CHECK(!plugin->supportsFormatCombination(kHostPoolPointers, d.data(), 7, 1));
  d[kHostPoolPointers].desc.type = DataType::kINT64;
  d[kBlockOffsets].desc.type = DataType::kINT64;
  CHECK(!plugin->supportsFormatCombination(kBlockOffsets, d.data(), 7, 1));
  d[kBlockOffsets].desc.type = DataType::kINT32;
  d[kHostRequestTypes].desc.format = TensorFormat::kCHW32;
  CHECK(!plugin->supportsFormatCombination(kHostRequestTypes, d.data(), 7, 1));
  CHECK(!plugin->supportsFormatCombination(8, d.data(), 7, 1));
  CHECK(!plugin->supportsFormatCombination(0, d.data(), 6, 1));
}

size_t alignUp(size_t n) { return (n + 255) / 256 * 256; }

void testWorkspaceSize() {
  FieldSet fs;
  auto plugin = create(fs.collection(), TensorRTPhase::kBUILD);
  if (!plugin) return ++gFailures, void();
  std::vector<DataType> types = {DataType::kHALF, DataType::kINT32, DataType::kINT32, DataType::kINT32,
                                 DataType::kINT32, DataType::kINT64, DataType::kINT32, DataType::kHALF};
  int64_t const tokens = 4096, batch = 64, maxBlocks = 512;
  auto d = descs(types, tokens, batch, maxBlocks);
  int64_t const maxKv = maxBlocks * kT;
  size_t const fakeContext = size_t(1) * tokens * kHq * 8 + kHkv * kD + maxKv;  // fake_tq_kernels.cpp
  size_t const fakeDecode = size_t(batch) * 1 * kHq * 8 + kHkv * kD + maxKv;
  size_t expected = alignUp(4 * (2 * tokens + batch));
  expected = alignUp(expected + tokens * kHq * kD * 2);
  expected = alignUp(expected + tokens * 2 * kHkv * kD * 2);
  expected = alignUp(expected + std::max(fakeContext, fakeDecode));
  CHECK(plugin->getWorkspaceSize(d.data(), 7, d.data() + 7, 1) == expected);
  CHECK(plugin->getWorkspaceSize(d.data(), 6, d.data() + 7, 1) == 0);
}

void testPoolArithmetic() {
  FieldSet fs;
  auto plugin = create(fs.collection(), TensorRTPhase::kBUILD);
  if (!plugin) return ++gFailures, void();
  // k3 (50 bytes/token at d=128) and v3.5 (60): the pool's head size is the wider, 60.
  CHECK(poolHeadSizeBytes(plugin->config()) == 60);
  CHECK(poolChunkBytes(plugin->config()) == int64_t(kHkv) * kT * 60);
  PluginConfig c = plugin->config();
  c.table.keyWidthX2 = c.table.valueWidthX2 = 6;
  CHECK(poolHeadSizeBytes(c) == 50);
  c.table.headDim = 64;
  c.table.keyWidthX2 = 8;
  CHECK(poolHeadSizeBytes(c) == 34);
}

void testBatchPlan() {
  // two context requests (chunks of 5 and 3; the second continues after 16 cached tokens), then
  // two generation requests with 40 and 7 tokens cached
  int32_t types[] = {0, 0, 1, 1}, past[] = {5, 19, 40, 7}, ctx[] = {5, 3, 99, 99};
  BatchPlan plan;
  std::string error;
  CHECK(planBatch(types, past, ctx, 4, 10, 64, plan, error));
  CHECK(plan.numContext == 2 && plan.numGeneration == 2 && plan.maxGenerationKvLen == 41);
  std::vector<int32_t> expected = {0, 1, 2, 3, 4, 16, 17, 18, 40, 7,  // pos
                                   0, 0, 0, 0, 0, 1, 1, 1, 2, 3,      // seq_idx
                                   5, 19, 41, 8};                     // kv_lens
  CHECK(plan.metadata == expected);
  CHECK(plan.requests[1].tokenBegin == 5 && plan.requests[1].numTokens == 3 && plan.requests[3].tokenBegin == 9);
  CHECK(!planBatch(types, past, ctx, 4, 10, 40, plan, error) && error.find("beyond its block table") != std::string::npos);
  CHECK(!planBatch(types, past, ctx, 4, 11, 64, plan, error) && error.find("11 rows") != std::string::npos);
  int32_t mixed[] = {1, 0, 1, 1};
  CHECK(!planBatch(mixed, past, ctx, 4, 10, 64, plan, error) && error.find("context requests first") != std::string::npos);
  int32_t none[] = {0, 0, 2, 1};
  CHECK(!planBatch(none, past, ctx, 4, 10, 64, plan, error) && error.find("host_request_types is 2") != std::string::npos);
  int32_t badPast[] = {2, 19, 40, 7};
  CHECK(!planBatch(types, badPast, ctx, 4, 10, 64, plan, error) && error.find("inconsistent") != std::string::npos);
}

// `--table FILE`: parse a table written by tq_trtllm/trt/plugin_fields.py and print every value
// read, one array per line ("name count v0 v1 ..."; floats with 9 significant digits, which
// round-trip fp32 exactly), so tests/test_plugin_unit.py can compare each element with Python's.
void printArray(char const* name, std::vector<float> const& v) {
  std::printf("%s %zu", name, v.size());
  for (float x : v) std::printf(" %.9g", double(x));
  std::printf("\n");
}
void printArray(char const* name, std::vector<int32_t> const& v) {
  std::printf("%s %zu", name, v.size());
  for (int32_t x : v) std::printf(" %d", x);
  std::printf("\n");
}

int describeTable(char const* path) {
  std::FILE* f = std::fopen(path, "rb");
  if (!f) return std::printf("cannot open %s\n", path), 2;
  std::vector<uint8_t> bytes;
  for (int c; (c = std::fgetc(f)) != EOF;) bytes.push_back(uint8_t(c));
  std::fclose(f);
  LayerTable t;
  std::string error;
  if (!parseLayerTable(bytes.data(), bytes.size(), t, error)) return std::printf("error: %s\n", error.c_str()), 1;
  std::printf("fingerprint=%llu layer=%d kv_heads=%d q_heads=%d head_dim=%d key_x2=%d value_x2=%d seed=%u "
              "rotary_pairs=%d\n",
              (unsigned long long)t.modelFingerprint, t.layerIdx, t.numKvHeads, t.numQHeads, t.headDim,
              t.keyWidthX2, t.valueWidthX2, t.rotationSeed, t.rotaryPairs);
  for (bool isKey : {true, false}) {
    LayerTableSide const& side = isKey ? t.key : t.value;
    std::string const prefix = isKey ? "key_" : "value_";
    printArray((prefix + "codebooks").c_str(), side.codebooks);
    printArray((prefix + "mean").c_str(), side.mean);
    printArray((prefix + "scale").c_str(), side.scale);
    printArray((prefix + "perm").c_str(), side.perm);
  }
  printArray("page_shift", t.pageShift);
  printArray("rotary_channel", t.rotaryChannel);
  printArray("rotary_freq", t.rotaryFreq);
  printArray("rotary_mean", t.rotaryMean);
  return 0;
}

}  // namespace

// `--fields`: the creator's identity ("plugin NAME NAMESPACE VERSION") and its fields in order
// ("field NAME TYPE", TYPE a PluginFieldType member without its k), as the JSON declares them.
char const* fieldTypeName(PluginFieldType type) {
  switch (type) {
    case PluginFieldType::kFLOAT16: return "FLOAT16";
    case PluginFieldType::kFLOAT32: return "FLOAT32";
    case PluginFieldType::kFLOAT64: return "FLOAT64";
    case PluginFieldType::kINT8: return "INT8";
    case PluginFieldType::kINT16: return "INT16";
    case PluginFieldType::kINT32: return "INT32";
    case PluginFieldType::kCHAR: return "CHAR";
    case PluginFieldType::kDIMS: return "DIMS";
    case PluginFieldType::kUNKNOWN: return "UNKNOWN";
    case PluginFieldType::kBF16: return "BF16";
    case PluginFieldType::kINT64: return "INT64";
    default: return "OTHER";
  }
}

int describeFields() {
  IPluginCreatorV3One& c = creator();
  std::printf("plugin %s %s %s\n", c.getPluginName(), c.getPluginNamespace(), c.getPluginVersion());
  PluginFieldCollection const* fc = c.getFieldNames();
  for (int32_t i = 0; i < fc->nbFields; ++i)
    std::printf("field %s %s\n", fc->fields[i].name, fieldTypeName(fc->fields[i].type));
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--table") return describeTable(argv[2]);
  if (argc == 2 && std::string(argv[1]) == "--fields") return describeFields();
  useLogger(&gLogger);
  testCreatorIdentity();
  testCreateSerializeRecreate();
  testLayerTableRoundTrip();
  testFieldValidation();
  testTableRefusals();
  testOnnxFieldForms();
  testTableVersionsRefused();
  testMessagesGoThroughTheLoggerFinder();
  testLoggerFinderOfEitherLayout();
  testOutputTypesAndShapes();
  testSupportsFormatCombination();
  testWorkspaceSize();
  testPoolArithmetic();
  testBatchPlan();
  std::printf("%s: %d failure(s) (TensorRT headers %d.%d)\n", gFailures ? "FAILED" : "PASSED", gFailures,
              NV_TENSORRT_MAJOR, NV_TENSORRT_MINOR);
  return gFailures ? 1 : 0;
}
