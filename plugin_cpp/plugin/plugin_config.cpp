#include "plugin_config.h"

#include "quantized_attention_fields.h"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <set>
#include <type_traits>
#include <utility>

namespace tq::plugin {

using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

namespace {

// One field as quantized_attention_fields.json declares it: its name, its canonical type (the one
// serialized), whether it must be given, and where its value lives in PluginConfig.
struct FieldSpec {
  char const* name;
  PluginFieldType type;
  bool required;
  size_t offset;  // offsetof(PluginConfig, member); unused for the bytes field
  bool isBytes;   // the layer table: kUNKNOWN, or kINT8 (what an ONNX node's INT8 tensor gives)
};

// The C++ type a scalar field's PluginFieldType holds: the JSON's type must match the member's.
template <PluginFieldType T> struct ScalarOf;
template <> struct ScalarOf<PluginFieldType::kINT32> { using type = int32_t; };
template <> struct ScalarOf<PluginFieldType::kFLOAT32> { using type = float; };

#define TQ_FIELD(fieldName, fieldType, isRequired, member)                                                 \
  static_assert(std::is_same_v<std::remove_reference_t<decltype(std::declval<PluginConfig&>().member)>,  \
                               ScalarOf<PluginFieldType::fieldType>::type>,                              \
                "quantized_attention_fields.json: the type of " fieldName " does not match PluginConfig::" #member);
#define TQ_BYTES_FIELD(fieldName, fieldType, isRequired)                 \
  static_assert(PluginFieldType::fieldType == PluginFieldType::kUNKNOWN, \
                "quantized_attention_fields.json: the bytes field " fieldName " must have type UNKNOWN");
TQ_QUANTIZED_ATTENTION_FIELDS(TQ_FIELD, TQ_BYTES_FIELD)
#undef TQ_FIELD
#undef TQ_BYTES_FIELD

#define TQ_FIELD(fieldName, fieldType, isRequired, member) \
  {fieldName, PluginFieldType::fieldType, isRequired, offsetof(PluginConfig, member), false},
#define TQ_BYTES_FIELD(fieldName, fieldType, isRequired) {fieldName, PluginFieldType::fieldType, isRequired, 0, true},
constexpr FieldSpec kFields[] = {TQ_QUANTIZED_ATTENTION_FIELDS(TQ_FIELD, TQ_BYTES_FIELD)};
#undef TQ_FIELD
#undef TQ_BYTES_FIELD

constexpr int32_t countBytesFields() {
  int32_t n = 0;
  for (FieldSpec const& spec : kFields) n += spec.isBytes;
  return n;
}
static_assert(countBytesFields() == 1, "quantized_attention_fields.json must declare one bytes field (member null)");

char const* bytesFieldName() {
  for (FieldSpec const& spec : kFields)
    if (spec.isBytes) return spec.name;
  return "";
}

// The fields of plugin version 1 whose values now come from the layer table's header only.
constexpr char const* kFieldsFromTheTable[] = {"num_q_heads",   "num_kv_heads", "head_dim",      "layer_idx",
                                               "key_width",     "value_width",  "rotation_seed", "model_fingerprint"};

bool cameFromTheTable(char const* name) {
  for (char const* moved : kFieldsFromTheTable)
    if (std::strcmp(moved, name) == 0) return true;
  return false;
}

char const* typeName(PluginFieldType type) {
  switch (type) {
    case PluginFieldType::kINT32: return "kINT32";
    case PluginFieldType::kFLOAT32: return "kFLOAT32";
    default: return "another type";
  }
}

FieldSpec const* findSpec(char const* name) {
  for (FieldSpec const& spec : kFields)
    if (std::strcmp(spec.name, name) == 0) return &spec;
  return nullptr;
}

bool fail(std::string& error, std::string const& field, std::string const& why) {
  error = "field '" + field + "' " + why;
  return false;
}

bool checkRope(tq_rope_params const& r, std::set<std::string> const& given, std::string& error) {
  if (!(std::isfinite(r.base) && r.base > 1.f)) return fail(error, "rope_base", "must be a finite number above 1");
  if (r.scaling == TQ_ROPE_SCALING_NONE) return true;
  if (r.scaling != TQ_ROPE_SCALING_LINEAR && r.scaling != TQ_ROPE_SCALING_LLAMA3)
    return fail(error, "rope_scaling_type", "is " + std::to_string(r.scaling) + "; use 0 (none), 1 (linear) or 2 (llama3)");
  std::vector<char const*> needed = {"rope_scaling_factor"};
  if (r.scaling == TQ_ROPE_SCALING_LLAMA3)
    needed.insert(needed.end(), {"rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_positions"});
  for (char const* name : needed)
    if (!given.count(name)) return fail(error, name, "is missing; rope_scaling_type " + std::to_string(r.scaling) + " needs it");
  if (!(std::isfinite(r.factor) && r.factor > 0.f)) return fail(error, "rope_scaling_factor", "must be finite and positive");
  if (r.scaling == TQ_ROPE_SCALING_LINEAR) return true;
  if (!(std::isfinite(r.low_freq_factor) && r.low_freq_factor > 0.f))
    return fail(error, "rope_low_freq_factor", "must be finite and positive");
  if (!(std::isfinite(r.high_freq_factor) && r.high_freq_factor > r.low_freq_factor))
    return fail(error, "rope_high_freq_factor", "must be finite and above rope_low_freq_factor");
  if (r.original_max_positions <= 0) return fail(error, "rope_original_max_positions", "must be positive");
  return true;
}

}  // namespace

bool parsePluginConfig(nvinfer1::PluginFieldCollection const* fc, PluginConfig& config, std::string& error) {
  if (!fc || fc->nbFields < 0 || (fc->nbFields > 0 && !fc->fields))
    return fail(error, "(collection)", "is missing: no PluginFieldCollection was given");
  PluginConfig c;
  c.rope.scaling = TQ_ROPE_SCALING_NONE;
  std::set<std::string> given;
  for (int32_t i = 0; i < fc->nbFields; ++i) {
    PluginField const& f = fc->fields[i];
    if (!f.name) return fail(error, "#" + std::to_string(i), "has no name");
    FieldSpec const* spec = findSpec(f.name);
    if (!spec && cameFromTheTable(f.name))
      return fail(error, f.name, std::string("is not a field of QuantizedAttention version ") + kPluginVersion +
                                     ": its value comes from the layer table (field '" + bytesFieldName() +
                                     "'); rebuild the ONNX graph or engine with this tq_trtllm");
    if (!spec) return fail(error, f.name, "is not a field of QuantizedAttention");
    if (!given.insert(f.name).second) return fail(error, f.name, "is given twice");
    if (!f.data || f.length <= 0) return fail(error, f.name, "holds no value");
    if (spec->isBytes) {
      if (f.type != PluginFieldType::kUNKNOWN && f.type != PluginFieldType::kINT8)
        return fail(error, f.name, "must have type kUNKNOWN or kINT8 (its bytes)");
      c.tableBytes.assign(static_cast<uint8_t const*>(f.data), static_cast<uint8_t const*>(f.data) + f.length);
      continue;
    }
    if (f.type != spec->type) return fail(error, f.name, std::string("must have type ") + typeName(spec->type));
    if (f.length != 1) return fail(error, f.name, "must hold exactly one value");
    std::memcpy(reinterpret_cast<char*>(&c) + spec->offset, f.data, 4);  // int32 or float (static_assert above)
  }
  for (FieldSpec const& spec : kFields)
    if (spec.required && !given.count(spec.name)) return fail(error, spec.name, "is missing");

  if (c.tokensPerBlock <= 0 || c.tokensPerBlock % 16)
    return fail(error, "tokens_per_block", "is " + std::to_string(c.tokensPerBlock) + "; it must be a positive multiple of 16");
  if (!checkRope(c.rope, given, error)) return false;
  std::string tableError;
  if (!parseLayerTable(c.tableBytes.data(), c.tableBytes.size(), c.table, tableError))
    return fail(error, bytesFieldName(), tableError);
  config = std::move(c);
  return true;
}

std::vector<PluginField> configFields(PluginConfig const& config) {
  std::vector<PluginField> fields;
  for (FieldSpec const& spec : kFields) {
    if (spec.isBytes)
      fields.emplace_back(spec.name, config.tableBytes.data(), spec.type, int32_t(config.tableBytes.size()));
    else
      fields.emplace_back(spec.name, reinterpret_cast<char const*>(&config) + spec.offset, spec.type, 1);
  }
  return fields;
}

std::vector<PluginField> fieldDeclarations() {
  std::vector<PluginField> fields;
  for (FieldSpec const& spec : kFields) fields.emplace_back(spec.name, nullptr, spec.type, 0);
  return fields;
}

}  // namespace tq::plugin
