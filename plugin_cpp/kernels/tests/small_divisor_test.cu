// Host-side check of quotient() (attention_common.cuh): the float product with its correction equals
// integer division over the whole range the kernels promise (0 <= x < kSmallDividendLimit), every
// x for the GQA groups 1..8, and near every multiple of larger divisors (row tiles). Runs on the CPU.
#include <cstdio>

#include "../attention_common.cuh"

namespace {

int check(int d, int step) {
  const tq::SmallDivisor s = tq::small_divisor(d);
  int bad = 0;
  auto one = [&](int x) {
    if (x >= 0 && x < tq::kSmallDividendLimit && tq::quotient(x, s) != x / d) {
      if (bad++ < 5) std::printf("FAIL %d / %d: got %d\n", x, d, tq::quotient(x, s));
    }
  };
  for (int x = 0; x < tq::kSmallDividendLimit; x += step) {
    one(x);
    const int m = x / d * d;  // the multiples on either side, where a rounding error would show
    one(m - 1), one(m), one(m + d - 1), one(m + d);
  }
  one(tq::kSmallDividendLimit - 1);
  return bad;
}

}  // namespace

int main() {
  int bad = 0;
  for (int d = 1; d <= 8; ++d) bad += check(d, 1);
  for (int d : {9, 16, 17, 63, 100, 1000, 4095, 65535, 1 << 20, (1 << 24) - 1}) bad += check(d, 9973);
  std::printf(bad ? "small_divisor_test: FAILED\n" : "small_divisor_test: ok\n");
  return bad ? 1 : 0;
}
