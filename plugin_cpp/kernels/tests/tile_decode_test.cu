// Host-side check of tile_decode.cuh: decode_pairs and decode_token_pairs (register look-up tables)
// give, in run_slot_coord order, the centroid of every code that CodeRun::code extracts; with grid
// tables (fp16 kGridBias + i) also when they look up only the low bytes (kFixedHi), from low planes
// in the paired form for 4- and 5-bit codes; decode_bytes gives each code's low-plane byte (the
// levels of grid key tables). Runs on the CPU (byte_perm has a host form, sign fill included), so
// CI checks the bit tricks without a GPU.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../tile_decode.cuh"

namespace {

uint16_t half_bits(float x) {
  const __half h = __float2half(x);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

template <int BITS, int CNT, bool GRID>
int check_run(unsigned seed) {
  // A 16-token tile of one group of 4 * CNT or 8 * CNT coordinates: take n = 8 * CNT (any part).
  constexpr int n = 8 * CNT;
  tq::GroupLayout g{};
  g.dim = n;
  g.bits = BITS;
  g.lo_bits = tq::low_plane_bits(BITS);
  g.lo_row_bytes = n * g.lo_bits / 8;
  g.lo_off = 0;
  g.hi_row_bytes = g.lo_bits != BITS ? n / 8 : 0;
  g.hi_off = g.lo_bits != BITS ? 16 * g.lo_row_bytes : -1;
  std::vector<uint8_t> tile(16 * (g.lo_row_bytes + g.hi_row_bytes) + 16);
  srand(seed);
  for (auto& b : tile) b = uint8_t(rand());
  tq::ByteTables parts[2]{};  // entries 0..15, then 16..31 (code_tables of codebook 0)
  uint16_t centroid[1 << TQ_MAX_BITS];
  constexpr int n_levels = 1 << BITS;
  for (int k = 0; k < (1 << TQ_MAX_BITS); ++k) {
    // grid: ascending i in [-127, 127], the lower half negative (as a symmetric codebook's)
    const int i = -127 + 254 * k / (n_levels - 1) + (k < n_levels / 2 ? -(rand() % 3) : rand() % 3);
    centroid[k] = GRID ? half_bits(tq::kGridBias + float(k < n_levels ? std::clamp(i, -127, 127) : 0))
                       : half_bits(0.002f * float(k * k) - 0.7f + 0.001f * float(rand() % 100));
    parts[k / 16].lo[k % 16 / 4] |= uint32_t(centroid[k] & 0xff) << (8 * (k % 4));
    parts[k / 16].hi[k % 16 / 4] |= uint32_t(centroid[k] >> 8) << (8 * (k % 4));
  }
  const tq::CodeTables<BITS> t = tq::code_tables<BITS>(parts, 0);
  // grid tables as fill_byte_tables writes them: 4- and 5-bit low planes paired
  tq::ByteTables paired[2] = {parts[0], parts[1]};
  for (int h = 0; BITS >= 4 && h < 2; ++h)
    for (int w = 0; w < 4; ++w) paired[h].lo[w] = tq::paired_word(parts[h].lo, w);
  const tq::CodeTables<BITS> tp = tq::code_tables<BITS>(paired, 0);
  int bad = 0;
  for (int row = 0; row < 16; ++row)
    for (int part = 0; part < 8; ++part) {
      tq::CodeRun<BITS, CNT> run;
      run.load(tile.data(), g, row, part);
      uint32_t pairs[CNT / 2];
      tq::decode_pairs(run, t, pairs);
      uint32_t bytes[CNT / 4];
      if (GRID) tq::decode_bytes(run, tp, bytes);
      for (int k = 0; k < CNT; ++k) {
        const int i = tq::run_slot_coord(BITS, CNT, k);
        const uint16_t got = uint16_t(pairs[k / 2] >> (16 * (k % 2)));
        // the code straight from the page bytes (FORMAT.md section 3)
        const int coord = part * CNT + i;
        const int lo_bit = coord * g.lo_bits;
        const uint8_t* lo_row = tile.data() + g.lo_off + row * g.lo_row_bytes;
        uint32_t word;
        std::memcpy(&word, lo_row + 4 * (lo_bit / 32), 4);
        int code = (word >> (lo_bit % 32)) & ((1 << g.lo_bits) - 1);
        if (g.hi_off >= 0) {
          std::memcpy(&word, tile.data() + g.hi_off + row * g.hi_row_bytes + 4 * (coord / 32), 4);
          code |= ((word >> tq::hi_plane_bit(BITS, coord % 32)) & 1) << g.lo_bits;
        }
        if (got != centroid[code] || int(run.code(i)) != code) ++bad;
        if (GRID && ((bytes[k / 4] >> (8 * (k % 4))) & 0xff) != (centroid[code] & 0xffu)) ++bad;
        if (tq::run_coord_slot(BITS, CNT, i) != k) ++bad;  // the inverse map
      }
      // decode_token_pairs: this row and the next (cyclically), slot by slot in the two halves
      tq::CodeRun<BITS, CNT> next;
      next.load(tile.data(), g, (row + 1) % 16, part);
      uint32_t two[CNT];
      tq::decode_token_pairs<GRID>(run, next, GRID ? tp : t, two);
      for (int k = 0; k < CNT; ++k) {
        const int i = tq::run_slot_coord(BITS, CNT, k);
        if (uint16_t(two[k]) != centroid[run.code(i)] || uint16_t(two[k] >> 16) != centroid[next.code(i)])
          ++bad;
      }
    }
  if (bad) std::printf("FAIL bits %d run %d grid %d: %d wrong centroids\n", BITS, CNT, int(GRID), bad);
  return bad;
}

template <int BITS, int CNT>
int check(unsigned seed) {
  return check_run<BITS, CNT, false>(seed) + check_run<BITS, CNT, true>(seed);
}

}  // namespace

int main() {
  int bad = 0;
  for (unsigned seed = 1; seed <= 3; ++seed) {
    bad += check<1, 4>(seed) + check<1, 8>(seed) + check<1, 16>(seed) + check<1, 32>(seed);
    bad += check<2, 4>(seed) + check<2, 8>(seed) + check<2, 16>(seed) + check<2, 32>(seed);
    bad += check<3, 4>(seed) + check<3, 8>(seed) + check<3, 16>(seed) + check<3, 32>(seed);
    bad += check<4, 4>(seed) + check<4, 8>(seed) + check<4, 16>(seed) + check<4, 32>(seed);
    bad += check<5, 4>(seed) + check<5, 8>(seed) + check<5, 16>(seed) + check<5, 32>(seed);
  }
  std::printf(bad ? "tile_decode_test: FAILED\n" : "tile_decode_test: ok\n");
  return bad ? 1 : 0;
}
