#include "layer_table.h"

#include "codec_layout.h"
#include "tq/tq_kernels.h"

#include <cmath>
#include <cstring>

namespace tq::plugin {

namespace {

constexpr char kMagic[4] = {'T', 'Q', 'C', 'T'};
constexpr uint32_t kKnownFlags =
    kKeyMean | kKeyScale | kKeyPerm | kValueMean | kValueScale | kValuePerm | kPageShift | kKeyRotary;

// Header field offsets (docs/PLUGIN.md); little-endian, as on every CUDA host.
enum HeaderOffset : size_t {
  kOffMagic = 0, kOffTableVersion = 4, kOffFormatVersion = 8, kOffHeaderBytes = 12,
  kOffFingerprint = 16, kOffLayer = 24, kOffKvHeads = 28, kOffHeadDim = 32, kOffKeyWidth = 36,
  kOffValueWidth = 40, kOffFlags = 44, kOffPayloadBytes = 48, kOffChecksum = 56, kOffQHeads = 60,
  kOffSeed = 64, kOffReserved = 68,
};

uint32_t fnv1a(uint8_t const* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

template <typename T> T load(uint8_t const* base, size_t offset) {
  T v;
  std::memcpy(&v, base + offset, sizeof(T));
  return v;
}
template <typename T> void store(std::vector<uint8_t>& out, size_t offset, T v) {
  std::memcpy(out.data() + offset, &v, sizeof(T));
}

// The arrays in payload order, with the flag that marks each present.
struct ArrayRef {
  char const* name;
  uint32_t flag;  // 0: always present
  bool isKey;
  int kind;       // 0 codebooks, 1 mean, 2 scale, 3 perm
};
constexpr ArrayRef kArrays[] = {
    {"key codebooks", 0, true, 0},      {"value codebooks", 0, false, 0},
    {"key mean", kKeyMean, true, 1},    {"key scale", kKeyScale, true, 2},
    {"key perm", kKeyPerm, true, 3},    {"value mean", kValueMean, false, 1},
    {"value scale", kValueScale, false, 2}, {"value perm", kValuePerm, false, 3},
};

// Codebook entries of K and V (tq_codec_codebook_entries).
struct CodebookEntries {
  int32_t key, value;
  int32_t of(bool isKey) const { return isKey ? key : value; }
};

size_t elementCount(ArrayRef const& a, LayerTable const& t, CodebookEntries const& entries) {
  if (a.kind == 0) return size_t(entries.of(a.isKey));
  return size_t(t.numKvHeads) * t.headDim;
}

LayerTableSide& sideOf(LayerTable& t, bool isKey) { return isKey ? t.key : t.value; }
LayerTableSide const& sideOf(LayerTable const& t, bool isKey) { return isKey ? t.key : t.value; }

// The array `a` names inside a side, as raw 4-byte elements (float or int32).
void const* arrayData(LayerTableSide const& s, int kind) {
  switch (kind) {
    case 0: return s.codebooks.data();
    case 1: return s.mean.data();
    case 2: return s.scale.data();
    default: return s.perm.data();
  }
}
void* arrayData(LayerTableSide& s, int kind) {
  return const_cast<void*>(arrayData(static_cast<LayerTableSide const&>(s), kind));
}
size_t arraySize(LayerTableSide const& s, int kind) {
  switch (kind) {
    case 0: return s.codebooks.size();
    case 1: return s.mean.size();
    case 2: return s.scale.size();
    default: return s.perm.size();
  }
}
void arrayResize(LayerTableSide& s, int kind, size_t n) {
  switch (kind) {
    case 0: return s.codebooks.resize(n);
    case 1: return s.mean.resize(n);
    case 2: return s.scale.resize(n);
    default: return s.perm.resize(n);
  }
}

bool checkRows(LayerTableSide const& s, int32_t headDim, std::string const& what, std::string& error) {
  for (size_t i = 0; i < s.mean.size(); ++i)
    if (!std::isfinite(s.mean[i])) return error = what + " mean has a non-finite entry", false;
  for (size_t i = 0; i < s.scale.size(); ++i)
    if (!(std::isfinite(s.scale[i]) && s.scale[i] > 0.f))
      return error = what + " scale has an entry that is not finite and positive", false;
  for (size_t row = 0; row * headDim < s.perm.size(); ++row) {
    std::vector<bool> seen(headDim, false);
    for (int32_t j = 0; j < headDim; ++j) {
      int32_t c = s.perm[row * headDim + j];
      if (c < 0 || c >= headDim || seen[c])
        return error = what + " perm of KV head " + std::to_string(row) +
                       " is not a permutation of 0.." + std::to_string(headDim - 1), false;
      seen[c] = true;
    }
  }
  return true;
}

// Pairs (a, a + headDim/2) with distinct a in [0, headDim/2) per head, frequencies in (0, pi],
// finite means.
bool checkRotary(LayerTable const& t, std::string& error) {
  for (int32_t h = 0; h < t.numKvHeads; ++h) {
    std::vector<bool> seen(t.headDim / 2, false);
    for (int32_t i = 0; i < t.rotaryPairs; ++i) {
      size_t k = size_t(h) * t.rotaryPairs + i;
      int32_t a = t.rotaryChannel[k];
      if (a < 0 || a >= t.headDim / 2 || seen[a])
        return error = "has rotary mean channels that are not distinct pairs of 0.." +
                       std::to_string(t.headDim / 2 - 1), false;
      seen[a] = true;
      if (!(t.rotaryFreq[k] > 0.f && t.rotaryFreq[k] <= 3.14159265f) ||
          !std::isfinite(t.rotaryMean[2 * k]) || !std::isfinite(t.rotaryMean[2 * k + 1]))
        return error = "has a rotary mean frequency outside (0, pi] or a non-finite mean", false;
    }
  }
  return true;
}

}  // namespace

bool parseLayerTable(void const* data, size_t bytes, LayerTable& table, std::string& error) {
  auto const* p = static_cast<uint8_t const*>(data);
  // Magic and version first: a table of another version says so, whatever its header size.
  if (!p || bytes < kOffFormatVersion)
    return error = "is " + std::to_string(bytes) + " bytes, too short for a layer table", false;
  if (std::memcmp(p + kOffMagic, kMagic, 4) != 0)
    return error = "does not start with the magic 'TQCT' (not a tq_trtllm layer table)", false;
  uint32_t version = load<uint32_t>(p, kOffTableVersion);
  if (version != kLayerTableVersion)
    return error = "has layer table version " + std::to_string(version) + "; this plugin reads version " +
                   std::to_string(kLayerTableVersion) + ": rebuild the engine (or ONNX graph) with this tq_trtllm",
           false;
  if (bytes < kLayerTableHeaderBytes)
    return error = "is " + std::to_string(bytes) + " bytes, shorter than its " +
                   std::to_string(kLayerTableHeaderBytes) + "-byte header", false;
  int32_t formatVersion = int32_t(load<uint32_t>(p, kOffFormatVersion));
  if (!TQ_READS_FORMAT_VERSION(formatVersion))
    return error = "was made for packed cache format version " + std::to_string(formatVersion) +
                   "; this plugin reads versions " + std::to_string(TQ_OLDEST_READABLE_FORMAT_VERSION) +
                   " to " + std::to_string(TQ_FORMAT_VERSION), false;
  if (load<uint32_t>(p, kOffHeaderBytes) != kLayerTableHeaderBytes)
    return error = "has a malformed header (header size " + std::to_string(load<uint32_t>(p, kOffHeaderBytes)) +
                   ", not " + std::to_string(kLayerTableHeaderBytes) + ")", false;
  if (load<uint32_t>(p, kOffReserved) != 0)
    return error = "has a non-zero reserved header word (a newer writer, or corrupt)", false;

  LayerTable t;
  t.modelFingerprint = load<uint64_t>(p, kOffFingerprint);
  t.layerIdx = load<int32_t>(p, kOffLayer);
  t.numKvHeads = load<int32_t>(p, kOffKvHeads);
  t.numQHeads = load<int32_t>(p, kOffQHeads);
  t.headDim = load<int32_t>(p, kOffHeadDim);
  t.keyWidthX2 = load<int32_t>(p, kOffKeyWidth);
  t.valueWidthX2 = load<int32_t>(p, kOffValueWidth);
  t.rotationSeed = load<uint32_t>(p, kOffSeed);
  uint32_t flags = load<uint32_t>(p, kOffFlags);
  // What the kernels support; head_dim and the widths are the kernel library's to judge.
  if (t.numKvHeads <= 0) return error = "has " + std::to_string(t.numKvHeads) + " KV heads; it needs at least 1", false;
  if (t.numQHeads <= 0 || t.numQHeads % t.numKvHeads || t.numQHeads / t.numKvHeads > TQ_MAX_GQA_GROUP)
    return error = "has " + std::to_string(t.numQHeads) + " query heads; the kernels need 1 to " +
                   std::to_string(TQ_MAX_GQA_GROUP) + " times its " + std::to_string(t.numKvHeads) + " KV heads",
           false;
  if (t.layerIdx < 0)
    return error = "has layer index " + std::to_string(t.layerIdx) + "; it must not be negative", false;
  CodebookEntries entries{};
  for (bool isKey : {true, false}) {
    int32_t& n = isKey ? entries.key : entries.value;
    n = tq_codec_codebook_entries(t.headDim, isKey ? t.keyWidthX2 : t.valueWidthX2);
    if (n < 0)
      return error = std::string("has ") + (isKey ? "keys" : "values") + " the kernel library cannot encode: " +
                     tq_last_error(), false;
  }
  if (flags & ~kKnownFlags) return error = "sets flag bits this plugin does not know", false;

  uint64_t payload = load<uint64_t>(p, kOffPayloadBytes);
  uint64_t expected = 0;
  for (ArrayRef const& a : kArrays)
    if (!a.flag || (flags & a.flag)) expected += elementCount(a, t, entries) * 4;
  if (flags & kPageShift) expected += size_t(t.numQHeads) * 4;
  if (flags & kKeyRotary) {  // its pair count leads its block, after everything above
    if (bytes < kLayerTableHeaderBytes + expected + 4)
      return error = "is too short for the rotary mean its flags announce", false;
    t.rotaryPairs = load<int32_t>(p, kLayerTableHeaderBytes + expected);
    if (t.rotaryPairs < 1 || t.rotaryPairs > TQ_MAX_ROTARY_PAIRS)
      return error = "has " + std::to_string(t.rotaryPairs) + " rotary mean pairs; supported: 1 to " +
                     std::to_string(TQ_MAX_ROTARY_PAIRS), false;
    expected += 4 + size_t(t.numKvHeads) * t.rotaryPairs * 16;
  }
  if (payload != expected || bytes != kLayerTableHeaderBytes + payload)
    return error = "holds " + std::to_string(bytes - kLayerTableHeaderBytes) +
                   " payload bytes where its header and shapes call for " + std::to_string(expected), false;
  if (fnv1a(p + kLayerTableHeaderBytes, payload) != load<uint32_t>(p, kOffChecksum))
    return error = "fails its checksum (corrupt or truncated)", false;

  size_t at = kLayerTableHeaderBytes;
  for (ArrayRef const& a : kArrays) {
    if (a.flag && !(flags & a.flag)) continue;
    size_t n = elementCount(a, t, entries);
    LayerTableSide& s = sideOf(t, a.isKey);
    arrayResize(s, a.kind, n);
    std::memcpy(arrayData(s, a.kind), p + at, n * 4);
    at += n * 4;
  }
  if (flags & kPageShift) {  // after the sides' arrays
    t.pageShift.resize(t.numQHeads);
    std::memcpy(t.pageShift.data(), p + at, t.pageShift.size() * 4);
    for (float x : t.pageShift)
      if (!(std::fabs(x) <= kMaxPageShift))
        return error = "has a page shift that is not finite or lies beyond +-" + std::to_string(kMaxPageShift), false;
    at += t.pageShift.size() * 4;
  }
  if (flags & kKeyRotary) {  // int32 P, int32 channel [H][P], float freq [H][P], float mean [H][P][2]
    size_t n = size_t(t.numKvHeads) * t.rotaryPairs;
    at += 4;
    t.rotaryChannel.resize(n);
    t.rotaryFreq.resize(n);
    t.rotaryMean.resize(2 * n);
    std::memcpy(t.rotaryChannel.data(), p + at, n * 4);
    std::memcpy(t.rotaryFreq.data(), p + at + n * 4, n * 4);
    std::memcpy(t.rotaryMean.data(), p + at + n * 8, n * 8);
    if (!checkRotary(t, error)) return false;
  }
  for (bool isKey : {true, false}) {
    std::string what = isKey ? "key" : "value";
    int32_t widthX2 = isKey ? t.keyWidthX2 : t.valueWidthX2;
    LayerTableSide const& s = sideOf(t, isKey);
    if (!s.perm.empty() && widthX2 % 2 == 0)
      return error = "has a " + what + " perm, but integer width " + widthText(widthX2) +
                     " has one group and no outlier channels", false;
    tq_codec codec;  // the library checks the codebooks (finite, each group's strictly ascending)
    std::string why;
    if (!initCodec(codec, t.headDim, widthX2, t.rotationSeed, s.codebooks.data(), int32_t(s.codebooks.size()), why))
      return error = "has a " + what + " codebook the kernel library refuses: " + why, false;
    if (!checkRows(s, t.headDim, what, error)) return false;
  }
  table = std::move(t);
  return true;
}

std::vector<uint8_t> serializeLayerTable(LayerTable const& t) {
  uint32_t flags = 0;
  size_t payload = 0;
  for (ArrayRef const& a : kArrays) {
    size_t n = arraySize(sideOf(t, a.isKey), a.kind);
    if (a.flag && n) flags |= a.flag;
    payload += n * 4;
  }
  if (!t.pageShift.empty()) flags |= kPageShift;
  payload += t.pageShift.size() * 4;
  if (t.rotaryPairs) flags |= kKeyRotary;
  if (t.rotaryPairs) payload += 4 + t.rotaryChannel.size() * 4 + t.rotaryFreq.size() * 4 + t.rotaryMean.size() * 4;
  std::vector<uint8_t> out(kLayerTableHeaderBytes + payload, 0);
  std::memcpy(out.data() + kOffMagic, kMagic, 4);
  store<uint32_t>(out, kOffTableVersion, kLayerTableVersion);
  store<uint32_t>(out, kOffFormatVersion, TQ_FORMAT_VERSION);
  store<uint32_t>(out, kOffHeaderBytes, kLayerTableHeaderBytes);
  store<uint64_t>(out, kOffFingerprint, t.modelFingerprint);
  store<int32_t>(out, kOffLayer, t.layerIdx);
  store<int32_t>(out, kOffKvHeads, t.numKvHeads);
  store<int32_t>(out, kOffQHeads, t.numQHeads);
  store<int32_t>(out, kOffHeadDim, t.headDim);
  store<int32_t>(out, kOffKeyWidth, t.keyWidthX2);
  store<int32_t>(out, kOffValueWidth, t.valueWidthX2);
  store<uint32_t>(out, kOffSeed, t.rotationSeed);
  store<uint32_t>(out, kOffFlags, flags);
  store<uint64_t>(out, kOffPayloadBytes, payload);
  size_t at = kLayerTableHeaderBytes;
  for (ArrayRef const& a : kArrays) {
    LayerTableSide const& side = sideOf(t, a.isKey);
    size_t n = arraySize(side, a.kind);
    if (n) std::memcpy(out.data() + at, arrayData(side, a.kind), n * 4);
    at += n * 4;
  }
  if (!t.pageShift.empty()) std::memcpy(out.data() + at, t.pageShift.data(), t.pageShift.size() * 4);
  at += t.pageShift.size() * 4;
  if (t.rotaryPairs) {
    store<int32_t>(out, at, t.rotaryPairs);
    at += 4;
    for (auto const* v : {static_cast<void const*>(t.rotaryChannel.data()), static_cast<void const*>(t.rotaryFreq.data())}) {
      std::memcpy(out.data() + at, v, t.rotaryFreq.size() * 4);
      at += t.rotaryFreq.size() * 4;
    }
    std::memcpy(out.data() + at, t.rotaryMean.data(), t.rotaryMean.size() * 4);
  }
  store<uint32_t>(out, kOffChecksum, fnv1a(out.data() + kLayerTableHeaderBytes, payload));
  return out;
}

}  // namespace tq::plugin
