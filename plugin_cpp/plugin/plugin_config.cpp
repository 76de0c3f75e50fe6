#include "plugin_config.h"

#include "codec_layout.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

namespace tq::plugin {

using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

namespace {

// How a field's value is carried. Most are one value of one type; two fields also accept the
// forms an ONNX node's attributes can carry (the ONNX parser's plugin fallback makes kINT32,
// kFLOAT32, kCHAR and kINT8 fields only), so the same plugin imports from an ONNX graph.
enum class FieldForm {
  kScalar,       // exactly one value of `type`
  kFingerprint,  // kINT64 x1, or kINT32 x2 (low, high 32 bits), or kCHAR (hexadecimal text)
  kBytes,        // kUNKNOWN or kINT8, one or more bytes
};

// One field: its name, its canonical type (the one serialized), whether it must be given, and
// where it lives in PluginConfig.
struct FieldSpec {
  char const* name;
  PluginFieldType type;
  bool required;
  size_t offset;  // offsetof(PluginConfig, member); unused for the table
  FieldForm form;
};

#define TQ_FIELD(name, type, required, member) \
  {name, PluginFieldType::type, required, offsetof(PluginConfig, member), FieldForm::kScalar}
constexpr char kTableField[] = "calibration_table";
FieldSpec const kFields[] = {
    TQ_FIELD("num_q_heads", kINT32, true, numQHeads),
    TQ_FIELD("num_kv_heads", kINT32, true, numKvHeads),
    TQ_FIELD("head_dim", kINT32, true, headDim),
    TQ_FIELD("layer_idx", kINT32, true, layerIdx),
    TQ_FIELD("tokens_per_block", kINT32, true, tokensPerBlock),
    TQ_FIELD("key_width", kFLOAT32, true, keyWidth),
    TQ_FIELD("value_width", kFLOAT32, true, valueWidth),
    TQ_FIELD("rotation_seed", kINT32, true, rotationSeed),
    {"model_fingerprint", PluginFieldType::kINT64, true, offsetof(PluginConfig, modelFingerprint),
     FieldForm::kFingerprint},
    TQ_FIELD("rope_base", kFLOAT32, true, rope.base),
    // Scaling fields are needed only by the scaling type that reads them (checked below).
    TQ_FIELD("rope_scaling_type", kINT32, false, rope.scaling),
    TQ_FIELD("rope_scaling_factor", kFLOAT32, false, rope.factor),
    TQ_FIELD("rope_low_freq_factor", kFLOAT32, false, rope.low_freq_factor),
    TQ_FIELD("rope_high_freq_factor", kFLOAT32, false, rope.high_freq_factor),
    TQ_FIELD("rope_original_max_positions", kINT32, false, rope.original_max_positions),
    {kTableField, PluginFieldType::kUNKNOWN, true, 0, FieldForm::kBytes},
};
#undef TQ_FIELD

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

// `text` as it may be quoted in a one-line message: at most 40 characters, unprintable ones as '?'.
std::string quoted(std::string const& text) {
  std::string out;
  for (char ch : text.substr(0, 40)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return "'" + out + (text.size() > 40 ? "...'" : "'");
}

// The model fingerprint in any of its forms (FieldForm::kFingerprint).
bool readFingerprint(PluginField const& f, int64_t& value, std::string& error) {
  char const* const name = f.name;
  switch (f.type) {
    case PluginFieldType::kINT64:
      if (f.length != 1) return fail(error, name, "of type kINT64 must hold exactly one value");
      std::memcpy(&value, f.data, sizeof(value));
      return true;
    case PluginFieldType::kINT32: {
      if (f.length != 2)
        return fail(error, name, "of type kINT32 must hold two values (low, high 32 bits), not " +
                                     std::to_string(f.length));
      uint32_t half[2];
      std::memcpy(half, f.data, sizeof(half));
      value = int64_t(uint64_t(half[0]) | uint64_t(half[1]) << 32);
      return true;
    }
    case PluginFieldType::kCHAR: {
      auto const* chars = static_cast<char const*>(f.data);
      std::string text(chars, chars + f.length);
      if (!text.empty() && text.back() == '\0') text.pop_back();  // the ONNX parser appends one
      bool prefixed = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
      std::string digits = prefixed ? text.substr(2) : text;
      if (digits.empty() || digits.size() > 16 || digits.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        return fail(error, name, "is " + quoted(text) + ", not a 64-bit hexadecimal number (1 to 16 hex digits, "
                                 "optionally after 0x)");
      value = int64_t(std::stoull(digits, nullptr, 16));
      return true;
    }
    default:
      return fail(error, name, "must have type kINT64 (one value), kINT32 (two values: low, high 32 bits) or "
                               "kCHAR (hexadecimal text)");
  }
}

std::string floatText(float value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", double(value));
  return text;
}

bool widthX2Of(float width, char const* field, int32_t& widthX2, std::string& error) {
  double twice = double(width) * 2.0;
  widthX2 = int32_t(std::lround(twice));
  if (!std::isfinite(twice) || std::fabs(twice - widthX2) > 1e-6 || !isSupportedWidthX2(widthX2))
    return fail(error, field, "is " + floatText(width) + ", not a supported width (" +
                                  supportedWidthsText() + ")");
  return true;
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

// Fields against each other and against the kernels' limits.
bool checkShapes(PluginConfig const& c, std::string& error) {
  if (c.headDim != 64 && c.headDim != 128)
    return fail(error, "head_dim", "is " + std::to_string(c.headDim) + "; the kernels support 64 and 128");
  if (c.numKvHeads <= 0) return fail(error, "num_kv_heads", "must be positive");
  if (c.numQHeads <= 0 || c.numQHeads % c.numKvHeads || c.numQHeads / c.numKvHeads > TQ_MAX_GQA_GROUP)
    return fail(error, "num_q_heads", "is " + std::to_string(c.numQHeads) + "; it must be 1 to " +
                std::to_string(TQ_MAX_GQA_GROUP) + " times num_kv_heads (" + std::to_string(c.numKvHeads) + ")");
  if (c.layerIdx < 0) return fail(error, "layer_idx", "must not be negative");
  if (c.tokensPerBlock <= 0 || c.tokensPerBlock % 16)
    return fail(error, "tokens_per_block", "is " + std::to_string(c.tokensPerBlock) + "; it must be a positive multiple of 16");
  return true;
}

// The table must be this layer's, of this model, at these widths.
bool checkTableMatches(PluginConfig const& c, std::string& error) {
  CalibTable const& t = c.table;
  auto mismatch = [&](std::string const& what, std::string const& tableValue, std::string const& field,
                      std::string const& fieldValue) {
    return fail(error, kTableField, "was made for " + what + " " + tableValue + ", but field '" + field +
                                        "' is " + fieldValue + " (a table of another layer or model)");
  };
  if (t.modelFingerprint != uint64_t(c.modelFingerprint))
    return mismatch("model fingerprint", std::to_string(t.modelFingerprint), "model_fingerprint",
                    std::to_string(uint64_t(c.modelFingerprint)));
  if (t.layerIdx != c.layerIdx) return mismatch("layer", std::to_string(t.layerIdx), "layer_idx", std::to_string(c.layerIdx));
  if (t.numKvHeads != c.numKvHeads)
    return mismatch("KV heads", std::to_string(t.numKvHeads), "num_kv_heads", std::to_string(c.numKvHeads));
  if (t.numQHeads != c.numQHeads)
    return mismatch("query heads", std::to_string(t.numQHeads), "num_q_heads", std::to_string(c.numQHeads));
  if (t.headDim != c.headDim) return mismatch("head_dim", std::to_string(t.headDim), "head_dim", std::to_string(c.headDim));
  if (t.keyWidthX2 != c.keyWidthX2)
    return mismatch("key width", widthText(t.keyWidthX2), "key_width", widthText(c.keyWidthX2));
  if (t.valueWidthX2 != c.valueWidthX2)
    return mismatch("value width", widthText(t.valueWidthX2), "value_width", widthText(c.valueWidthX2));
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
    if (!spec) return fail(error, f.name, "is not a field of QuantizedAttention");
    if (!given.insert(f.name).second) return fail(error, f.name, "is given twice");
    if (!f.data || f.length <= 0) return fail(error, f.name, "holds no value");
    switch (spec->form) {
      case FieldForm::kScalar:
        if (f.type != spec->type) return fail(error, f.name, std::string("must have type ") + typeName(spec->type));
        if (f.length != 1) return fail(error, f.name, "must hold exactly one value");
        std::memcpy(reinterpret_cast<char*>(&c) + spec->offset, f.data, 4);
        break;
      case FieldForm::kFingerprint:
        if (!readFingerprint(f, c.modelFingerprint, error)) return false;
        break;
      case FieldForm::kBytes:
        if (f.type != PluginFieldType::kUNKNOWN && f.type != PluginFieldType::kINT8)
          return fail(error, f.name, "must have type kUNKNOWN or kINT8 (its bytes)");
        c.tableBytes.assign(static_cast<uint8_t const*>(f.data), static_cast<uint8_t const*>(f.data) + f.length);
        break;
    }
  }
  for (FieldSpec const& spec : kFields)
    if (spec.required && !given.count(spec.name)) return fail(error, spec.name, "is missing");

  if (!checkShapes(c, error) || !widthX2Of(c.keyWidth, "key_width", c.keyWidthX2, error) ||
      !widthX2Of(c.valueWidth, "value_width", c.valueWidthX2, error) || !checkRope(c.rope, given, error))
    return false;
  std::string tableError;
  if (!parseCalibTable(c.tableBytes.data(), c.tableBytes.size(), c.table, tableError))
    return fail(error, kTableField, tableError);
  if (!checkTableMatches(c, error)) return false;
  config = std::move(c);
  return true;
}

std::vector<PluginField> configFields(PluginConfig const& config) {
  std::vector<PluginField> fields;
  for (FieldSpec const& spec : kFields) {
    if (spec.form == FieldForm::kBytes)
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
