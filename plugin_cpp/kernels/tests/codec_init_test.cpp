// Host-side checks of tq_codec_init, tq_codec_codebook_entries and tq_codec_token_bytes
// (codec.cpp), run on the CPU with no CUDA at all: every width's groups at head_dim 64 and 128,
// its codebook entries and its bytes per token against docs/FORMAT.md section 2's table, the
// codebooks copied exactly, and each bad input refused with its status and a message naming the
// value and what is supported. Built with codec.cpp and last_error.cpp (the tq_codec_host target;
// tests/test_codec_init.py compiles and runs it).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "tq/tq_kernels.h"

namespace {

int failures = 0;

void expect(bool ok, const char* what, int width_x2 = 0, int head_dim = 0) {
  if (!ok) {
    ++failures;
    std::printf("FAIL %s (width_x2 %d, head_dim %d; last error: %s)\n", what, width_x2, head_dim, tq_last_error());
  }
}

bool says(const char* text) { return std::strstr(tq_last_error(), text) != nullptr; }

// FORMAT.md section 2's bytes per token per head, widths 1, 1.5, ..., 5 (width_x2 2..10).
constexpr int kBytes64[] = {10, 16, 18, 24, 26, 32, 34, 40, 42};
constexpr int kBytes128[] = {18, 28, 34, 44, 50, 60, 66, 76, 82};

void test_every_width() {
  for (int d : {64, 128}) {
    for (int w = 2; w <= 10; ++w) {
      const bool fractional = w % 2;
      const int bits0 = (w + 1) / 2, bits1 = w / 2;  // ceil and floor of the width
      const int entries = fractional ? (1 << bits0) + (1 << bits1) : 1 << bits0;
      expect(tq_codec_codebook_entries(d, w) == entries, "codebook entries", w, d);
      std::vector<float> books(entries);
      for (int i = 0; i < entries; ++i) books[i] = 0.25f * i - 3.0f;  // ascending within each group
      if (fractional)  // the second group's levels start over (each group ascends on its own)
        for (int k = 0; k < (1 << bits1); ++k) books[(1 << bits0) + k] = 0.5f * k - 1.0f;
      tq_codec c;
      std::memset(&c, 0xAB, sizeof(c));
      expect(tq_codec_init(&c, d, w, 0x1234u, books.data(), entries) == TQ_OK, "tq_codec_init", w, d);
      expect(c.head_dim == d && c.seed == 0x1234u, "head_dim and seed", w, d);
      expect(c.num_groups == (fractional ? 2 : 1), "the number of groups", w, d);
      expect(c.group_dim[0] == (fractional ? d / 2 : d) && c.group_bits[0] == bits0, "group 0", w, d);
      expect(!fractional || (c.group_dim[1] == d / 2 && c.group_bits[1] == bits1), "group 1: the outlier half first", w, d);
      expect(!c.perm && !c.mean && !c.scale && c.rotary_pairs == 0 && !c.rotary_channel && !c.rotary_freq &&
                 !c.rotary_mean, "the device pointers are NULL", w, d);
      for (int g = 0, first = 0; g < c.num_groups; first += 1 << c.group_bits[g], ++g)
        expect(std::memcmp(c.codebook[g], &books[first], sizeof(float) << c.group_bits[g]) == 0,
               "the codebooks copied exactly, group by group", w, d);
      const int bytes = (d == 64 ? kBytes64 : kBytes128)[w - 2];
      expect(tq_codec_token_bytes(&c) == bytes, "bytes per token: FORMAT.md section 2's table", w, d);
      tq_codec zeros;
      expect(tq_codec_init(&zeros, d, w, 7u, nullptr, 0) == TQ_OK, "without codebooks", w, d);
      expect(zeros.codebook[0][0] == 0.0f && zeros.codebook[0][1] == 0.0f && zeros.seed == 7u, "zeros", w, d);
      expect(tq_codec_token_bytes(&zeros) == bytes, "bytes per token without codebooks", w, d);
    }
  }
}

void test_bad_inputs() {
  const tq_codec before = [] {
    tq_codec c;
    std::memset(&c, 0x5A, sizeof(c));
    return c;
  }();
  tq_codec c = before;
  float books[32] = {};
  for (int i = 0; i < 32; ++i) books[i] = float(i);
  expect(tq_codec_init(nullptr, 128, 6, 0, books, 8) == TQ_ERR_NULL_POINTER && says("codec is NULL"), "NULL codec");
  for (int d : {0, 32, 96, 256, -64}) {
    expect(tq_codec_init(&c, d, 6, 0, books, 8) == TQ_ERR_UNSUPPORTED_HEAD_DIM && says("supported head dims are 64 and 128"),
           "bad head_dim", 6, d);
    expect(tq_codec_codebook_entries(d, 6) == -1 && says("head_dim"), "entries: bad head_dim", 6, d);
  }
  for (int w : {-2, 0, 1, 11, 12, 1000}) {
    expect(tq_codec_init(&c, 128, w, 0, books, 8) == TQ_ERR_UNSUPPORTED_BITS &&
               says("supported widths are 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5 and 5 (width_x2 2 to 10)"),
           "bad width_x2", w, 128);
    expect(tq_codec_codebook_entries(128, w) == -1 && says("width_x2"), "entries: bad width_x2", w, 128);
  }
  expect(tq_codec_init(&c, 128, 11, 0, books, 8) != TQ_OK && says("width_x2 11 (a width of 5.5 bits)"),
         "the message names the width", 11, 128);
  expect(tq_codec_init(&c, 128, 6, 0, books, 7) == TQ_ERR_INVALID_ARGUMENT &&
             says("num_codebook_entries 7, but width 3 at head_dim 128 takes 8"), "too few entries", 6, 128);
  expect(tq_codec_init(&c, 64, 7, 0, books, 16) == TQ_ERR_INVALID_ARGUMENT && says("takes 24") &&
             says("32 x 4 bits, 32 x 3 bits"), "fractional: entries of both groups", 7, 64);
  expect(tq_codec_init(&c, 128, 6, 0, nullptr, 8) == TQ_ERR_NULL_POINTER && says("codebooks is NULL"),
         "NULL codebooks with entries", 6, 128);
  float bad[8] = {0, 1, 2, 3, 4, 4, 6, 7};
  expect(tq_codec_init(&c, 128, 6, 0, bad, 8) == TQ_ERR_INVALID_ARGUMENT &&
             says("entry 5 (group 0, level 5) is 4, not above the level before it (4)"), "not strictly ascending", 6, 128);
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  expect(tq_codec_init(&c, 128, 6, 0, bad, 8) == TQ_ERR_INVALID_ARGUMENT && says("entry 5") && says("must be finite"),
         "NaN", 6, 128);
  float two[12] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, -std::numeric_limits<float>::infinity()};
  expect(tq_codec_init(&c, 128, 5, 0, two, 12) == TQ_ERR_INVALID_ARGUMENT && says("entry 11 (group 1, level 3)"),
         "the second group's levels are checked", 5, 128);
  expect(std::memcmp(&c, &before, sizeof(c)) == 0, "a refused call leaves the codec unchanged");

  expect(tq_codec_token_bytes(nullptr) == -1 && says("codec is NULL"), "token bytes: NULL");
  tq_codec ok;
  tq_codec_init(&ok, 128, 5, 0, nullptr, 0);
  tq_codec odd = ok;
  odd.group_bits[0] = 2, odd.group_bits[1] = 3;  // the outlier half must come first
  expect(tq_codec_token_bytes(&odd) == -1 && says("are not those of a width") && says("width 2.5 has 64 x 3 bits, 64 x 2 bits"),
         "token bytes: groups of no width");
  odd = ok;
  odd.group_dim[0] = 96, odd.group_dim[1] = 32;
  expect(tq_codec_token_bytes(&odd) == -1 && says("96 x 3 bits, 32 x 2 bits"), "token bytes: unequal halves");
  odd = ok;
  odd.head_dim = 256;
  expect(tq_codec_token_bytes(&odd) == -1 && says("head_dim 256"), "token bytes: head_dim");
  odd = ok;
  odd.num_groups = 3;
  expect(tq_codec_token_bytes(&odd) == -1 && says("3 groups"), "token bytes: groups");
  odd = ok;
  odd.group_bits[1] = 6;
  expect(tq_codec_token_bytes(&odd) == -1 && says("6 bits per coordinate; use 1 to 5"), "token bytes: bits");
}

}  // namespace

int main() {
  test_every_width();
  test_bad_inputs();
  std::printf(failures ? "codec_init_test: FAILED\n" : "codec_init_test: ok\n");
  return failures ? 1 : 0;
}
