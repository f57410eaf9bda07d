// The arithmetic the cpu plugin's collectives reduce with (cpu/collective_math.hpp):
// half-precision conversions against exhaustive and reference checks, and the
// combine / divide functions per dtype, including wrap-around and NaN.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/collective_math.hpp"

using namespace backplane::cpu;

TEST_CASE("collective_math: f16 to f32 and back is exact for every f16") {
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (nan) {
      if (!std::isnan(f) || (f32_to_f16(f) & 0x7c00u) != 0x7c00u || (f32_to_f16(f) & 0x3ffu) == 0)
        ++mismatches;
    } else if (f32_to_f16(f) != h) {
      ++mismatches;
    }
  }
  CHECK(mismatches == 0);
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(f16_to_f32(0x7bff) == 65504.0f);               // largest finite
  CHECK(std::isinf(f16_to_f32(0xfc00)));
  CHECK(std::signbit(f16_to_f32(0x8000)));
}

TEST_CASE("collective_math: f32 to f16 rounds to nearest even") {
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);                          // tie, even stays
  CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);                      // tie, odd rounds up
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3c01);  // above the tie
  CHECK(f32_to_f16(65519.0f) == 0x7bff);               // below the overflow tie
  CHECK(f32_to_f16(65520.0f) == 0x7c00);               // the tie rounds to inf
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // half the smallest subnormal: even (0)
  CHECK(f32_to_f16(std::ldexp(3.0f, -26)) == 0x0001);  // 0.75 of it rounds up
  CHECK(f32_to_f16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)) == 0x0400);  // rounds up into the normals
  CHECK(f32_to_f16(-0.0f) == 0x8000);
  CHECK(f32_to_f16(std::numeric_limits<float>::infinity()) == 0x7c00);
#ifdef __FLT16_MAX__
  // Against the compiler's own conversion over a sweep of bit patterns.
  int mismatches = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 9973) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (std::isnan(f)) continue;
    const auto want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    if (f32_to_f16(f) != want) ++mismatches;
  }
  CHECK(mismatches == 0);
#endif
}

TEST_CASE("collective_math: bf16 rounds to nearest even and keeps NaN") {
  CHECK(bf16_to_f32(0x3f80) == 1.0f);
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(std::bit_cast<float>(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(f32_to_bf16(std::bit_cast<float>(0x3f818000u)) == 0x3f82);  // tie, odd rounds up
  CHECK(f32_to_bf16(std::bit_cast<float>(0x3f808001u)) == 0x3f81);  // above the tie
  CHECK(f32_to_bf16(std::bit_cast<float>(0x7f7fffffu)) == 0x7f80);  // rounds to inf
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the dropped bits must stay NaN, not become inf.
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));
}

TEST_CASE("collective_math: combine covers every reduce op and dtype it accepts") {
  for (int32_t dtype : {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_I8, BP_DTYPE_U8,
                        BP_DTYPE_F16, BP_DTYPE_BF16})
    for (int32_t op : {BP_REDUCE_SUM, BP_REDUCE_MEAN, BP_REDUCE_MIN, BP_REDUCE_MAX, BP_REDUCE_PROD}) {
      CAPTURE(dtype);
      CAPTURE(op);
      CHECK(static_cast<bool>(combine_for(dtype, op)));
      CHECK(static_cast<bool>(divide_for(dtype)));
    }
  CHECK(static_cast<bool>(combine_for(BP_DTYPE_BOOL, BP_REDUCE_SUM)) == false);
  CHECK(static_cast<bool>(combine_for(77, BP_REDUCE_SUM)) == false);
  CHECK(static_cast<bool>(combine_for(BP_DTYPE_F32, 9)) == false);
  CHECK(static_cast<bool>(divide_for(BP_DTYPE_BOOL)) == false);
}

TEST_CASE("collective_math: integer sums and products wrap, mean truncates toward zero") {
  const std::vector<int8_t> a{127, -128, 100, -7};
  const std::vector<int8_t> b{1, -1, 3, 2};
  std::vector<int8_t> out(4);
  combine_for(BP_DTYPE_I8, BP_REDUCE_SUM)(out.data(), a.data(), b.data(), 4);
  CHECK(out == std::vector<int8_t>{-128, 127, 103, -5});
  combine_for(BP_DTYPE_I8, BP_REDUCE_PROD)(out.data(), a.data(), b.data(), 4);
  CHECK(out == std::vector<int8_t>{127, -128, 44, -14});  // 300 wraps to 44
  const std::vector<int64_t> big{std::numeric_limits<int64_t>::max(), -9};
  std::vector<int64_t> big_out(2);
  combine_for(BP_DTYPE_I64, BP_REDUCE_SUM)(big_out.data(), big.data(), big.data(), 2);
  CHECK(big_out[0] == -2);
  CHECK(big_out[1] == -18);
  divide_for(BP_DTYPE_I64)(big_out.data(), 2, 4);
  CHECK(big_out[0] == 0);   // -2 / 4 truncates toward zero
  CHECK(big_out[1] == -4);  // -18 / 4 = -4.5 -> -4
  std::vector<uint8_t> u{250, 10};
  const std::vector<uint8_t> v{10, 3};
  combine_for(BP_DTYPE_U8, BP_REDUCE_SUM)(u.data(), u.data(), v.data(), 2);  // in place
  CHECK(u == std::vector<uint8_t>{4, 13});
}

TEST_CASE("collective_math: float min and max propagate NaN from either side") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> a{1, nan, 3, -0.5f};
  const std::vector<float> b{2, 5, nan, -1};
  std::vector<float> out(4);
  combine_for(BP_DTYPE_F32, BP_REDUCE_MAX)(out.data(), a.data(), b.data(), 4);
  CHECK(out[0] == 2);
  CHECK(std::isnan(out[1]));
  CHECK(std::isnan(out[2]));
  CHECK(out[3] == -0.5f);
  combine_for(BP_DTYPE_F32, BP_REDUCE_MIN)(out.data(), a.data(), b.data(), 4);
  CHECK(out[0] == 1);
  CHECK(std::isnan(out[1]));
  CHECK(std::isnan(out[2]));
  CHECK(out[3] == -1);
}

TEST_CASE("collective_math: f16 and bf16 reduce in f32 and round once") {
  const std::vector<uint16_t> a{f32_to_f16(1.5f), f32_to_f16(-2.0f), f32_to_f16(2048.0f)};
  const std::vector<uint16_t> b{f32_to_f16(2.25f), f32_to_f16(3.0f), f32_to_f16(1.0f)};
  std::vector<uint16_t> out(3);
  combine_for(BP_DTYPE_F16, BP_REDUCE_SUM)(out.data(), a.data(), b.data(), 3);
  CHECK(f16_to_f32(out[0]) == 3.75f);
  CHECK(f16_to_f32(out[1]) == 1.0f);
  CHECK(f16_to_f32(out[2]) == 2048.0f);  // 2049 is a tie between 2048 and 2050: even wins
  combine_for(BP_DTYPE_F16, BP_REDUCE_PROD)(out.data(), a.data(), b.data(), 3);
  CHECK(f16_to_f32(out[1]) == -6.0f);
  divide_for(BP_DTYPE_F16)(out.data(), 3, 3);
  CHECK(f16_to_f32(out[1]) == -2.0f);
  const std::vector<uint16_t> x{f32_to_bf16(1.0f), f32_to_bf16(-4.0f)};
  const std::vector<uint16_t> y{f32_to_bf16(2.0f), f32_to_bf16(0.5f)};
  combine_for(BP_DTYPE_BF16, BP_REDUCE_MAX)(out.data(), x.data(), y.data(), 2);
  CHECK(bf16_to_f32(out[0]) == 2.0f);
  CHECK(bf16_to_f32(out[1]) == 0.5f);
}

TEST_CASE("collective_math: the float mean's division gives the bits of x / n for every world size") {
  // Powers of two take a multiply by 1/n: it must round exactly as the
  // division, subnormals, infinities and NaN included.
  std::vector<float> f;
  std::vector<double> g;
  uint32_t bits = 0x9e3779b9U;
  for (int i = 0; i < 4000; ++i) {
    bits = bits * 1664525U + 1013904223U;  // every exponent, subnormals and NaNs among them
    f.push_back(std::bit_cast<float>(bits));
    g.push_back(std::bit_cast<double>((static_cast<uint64_t>(bits) << 32) | (bits ^ 0x5bd1e995U)));
  }
  for (float v : {0.0f, -0.0f, 1e-45f, -3e-39f, 3.4e38f, std::numeric_limits<float>::infinity()})
    f.push_back(v);
  for (int64_t n : {1, 2, 3, 4, 5, 8, 64, 1024}) {
    CAPTURE(n);
    std::vector<float> fo = f;
    divide_for(BP_DTYPE_F32)(fo.data(), fo.size(), n);
    std::vector<double> go = g;
    divide_for(BP_DTYPE_F64)(go.data(), go.size(), n);
    int wrong = 0;
    for (std::size_t i = 0; i < f.size(); ++i) {
      const float want = f[i] / static_cast<float>(n);
      if (std::bit_cast<uint32_t>(fo[i]) != std::bit_cast<uint32_t>(want) &&
          !(std::isnan(want) && std::isnan(fo[i])))
        ++wrong;
    }
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double want = g[i] / static_cast<double>(n);
      if (std::bit_cast<uint64_t>(go[i]) != std::bit_cast<uint64_t>(want) &&
          !(std::isnan(want) && std::isnan(go[i])))
        ++wrong;
    }
    CHECK(wrong == 0);
    std::vector<uint16_t> h, b;
    for (std::size_t i = 0; i < 2000; ++i) {
      h.push_back(static_cast<uint16_t>(i * 33));
      b.push_back(static_cast<uint16_t>(i * 33));
    }
    std::vector<uint16_t> ho = h, bo = b;
    divide_for(BP_DTYPE_F16)(ho.data(), ho.size(), n);
    divide_for(BP_DTYPE_BF16)(bo.data(), bo.size(), n);
    for (std::size_t i = 0; i < h.size(); ++i) {
      const uint16_t want_h = f32_to_f16(f16_to_f32(h[i]) / static_cast<float>(n));
      const uint16_t want_b = f32_to_bf16(bf16_to_f32(b[i]) / static_cast<float>(n));
      if (ho[i] != want_h && !std::isnan(f16_to_f32(want_h))) ++wrong;
      if (bo[i] != want_b && !std::isnan(bf16_to_f32(want_b))) ++wrong;
    }
    CHECK(wrong == 0);
  }
}
