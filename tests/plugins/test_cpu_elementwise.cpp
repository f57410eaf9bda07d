// The cpu plugin's elementwise fast paths (cpu/elementwise.hpp) against its
// element-by-element loop: where (SelectOp) on dense operands and on every mix
// of dense and broadcast ones, on one thread and on a team, and over strided
// layouts whose rows take the fast paths.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "cpu/elementwise.hpp"

using namespace backplane::cpu;

namespace {

// Deterministic operands: a mask with runs of both values, a and b that differ everywhere.
template <class E>
struct Operands {
  std::vector<uint8_t> c;
  std::vector<E> a, b;
  explicit Operands(int64_t n)
      : c(static_cast<size_t>(n)), a(static_cast<size_t>(n)), b(static_cast<size_t>(n)) {
    uint64_t s = 12345;
    for (int64_t i = 0; i < n; ++i) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      // Some non-zero mask bytes other than 1: where reads any non-zero byte as true.
      c[static_cast<size_t>(i)] = (s >> 60) < 7 ? 0 : static_cast<uint8_t>(1 + (s >> 33) % 3);
      a[static_cast<size_t>(i)] = static_cast<E>(2 * i + 1);
      b[static_cast<size_t>(i)] = static_cast<E>(~static_cast<uint64_t>(i));
    }
  }
};

// where over n dense elements with each of c, a, b dense or its element 0
// broadcast (bit 0: c, bit 1: a, bit 2: b), through map3_flat and through
// the strided loop; the number of elements that differ.
template <class E>
int64_t flat_mismatches(int64_t n, int broadcast, int threads) {
  const Operands<E> in(n);
  const bool cs = (broadcast & 1) != 0, as = (broadcast & 2) != 0, bs = (broadcast & 4) != 0;
  std::vector<E> fast(static_cast<size_t>(n)), slow(static_cast<size_t>(n));
  map3_flat(SelectOp{}, in.c.data(), cs, in.a.data(), as, in.b.data(), bs, fast.data(), n, threads);
  map3_row_strided(SelectOp{}, in.c.data(), cs ? 0 : 1, in.a.data(), as ? 0 : 1, in.b.data(), bs ? 0 : 1,
                   slow.data(), 1, n);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const E want = (cs ? in.c[0] : in.c[static_cast<size_t>(i)]) != 0
                       ? (as ? in.a[0] : in.a[static_cast<size_t>(i)])
                       : (bs ? in.b[0] : in.b[static_cast<size_t>(i)]);
    mismatches += fast[static_cast<size_t>(i)] != slow[static_cast<size_t>(i)];
    mismatches += slow[static_cast<size_t>(i)] != want;
  }
  return mismatches;
}

}  // namespace

TEST_CASE("cpu elementwise: where's flat path matches the strided loop for dense and broadcast operands") {
  // Lengths around the vector widths and the threading threshold; 1 and 2 threads.
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1001}, kParallelMinElements * 3 + 5})
    for (int broadcast = 0; broadcast < 8; ++broadcast)
      for (int threads : {1, 2}) {
        CAPTURE(n);
        CAPTURE(broadcast);
        CAPTURE(threads);
        CHECK(flat_mismatches<uint8_t>(n, broadcast, threads) == 0);
        CHECK(flat_mismatches<uint16_t>(n, broadcast, threads) == 0);
        CHECK(flat_mismatches<uint32_t>(n, broadcast, threads) == 0);
        CHECK(flat_mismatches<uint64_t>(n, broadcast, threads) == 0);
      }
}

TEST_CASE("cpu elementwise: where over a layout with a broadcast row and a transposed operand") {
  // out [rows, cols] dense; c dense; a a row vector broadcast down the rows
  // (stride 0 on dim 0); b the transpose of a dense [cols, rows] (strides 1, rows).
  constexpr int64_t rows = 37, cols = 45;
  const Operands<uint32_t> in(rows * cols);
  for (int variant = 0; variant < 2; ++variant) {
    CAPTURE(variant);
    StridedLayout<4> l;
    l.ndim = 2;
    l.shape[0] = rows;
    l.shape[1] = cols;
    l.strides[0][0] = cols, l.strides[0][1] = 1;  // out
    l.strides[1][0] = cols, l.strides[1][1] = 1;  // c
    l.strides[2][0] = 0, l.strides[2][1] = 1;     // a: one row for all
    if (variant == 0)
      l.strides[3][0] = 1, l.strides[3][1] = rows;  // b: transposed (the strided loop)
    else
      l.strides[3][0] = 0, l.strides[3][1] = 0;  // b: one element (map3_scalar_b on every row)
    coalesce(l);
    std::vector<uint32_t> out(static_cast<size_t>(rows * cols));
    map3(l, SelectOp{}, in.c.data(), in.a.data(), in.b.data(), out.data(), 2);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const uint32_t b = variant == 0 ? in.b[static_cast<size_t>(j * rows + i)] : in.b[0];
        const uint32_t want = in.c[static_cast<size_t>(i * cols + j)] != 0 ? in.a[static_cast<size_t>(j)] : b;
        mismatches += out[static_cast<size_t>(i * cols + j)] != want;
      }
    CHECK(mismatches == 0);
  }
}
