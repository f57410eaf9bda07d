// Counter-based random numbers for the cpu plugin's rand_uniform and randn:
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
// Element i of a tensor draws from counter i under the key `seed`, so its value depends
// only on (seed, i): not on the thread count, the chunking, or the SIMD path.
// Everything here is integer arithmetic or basic IEEE operations (+ - * / sqrt, no
// libm), so every code path and every x86-64 machine gives bit-identical values.
#ifndef BACKPLANE_PLUGINS_CPU_PHILOX_HPP_
#define BACKPLANE_PLUGINS_CPU_PHILOX_HPP_

#include <bit>
#include <cstdint>

namespace backplane::cpu {

struct Philox4x32 {
  uint32_t v[4];
};

// Philox4x32 with 10 rounds on counter c under key k (Random123's philox4x32_10).
[[gnu::always_inline]] inline Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) noexcept {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c.v[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c.v[2];
    c = {{static_cast<uint32_t>(p1 >> 32) ^ c.v[1] ^ k0, static_cast<uint32_t>(p1),
          static_cast<uint32_t>(p0 >> 32) ^ c.v[3] ^ k1, static_cast<uint32_t>(p0)}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// The four words of element `index` for `seed`.
[[gnu::always_inline]] inline Philox4x32 philox_words(uint64_t seed, uint64_t index) noexcept {
  return philox4x32_10({{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0}},
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// 53 random bits from two words, as k * 2^-53 in [0, 1) (plus `add` ulps: add = 1
// gives (0, 1]). The int32 detour lets the conversion vectorise.
[[gnu::always_inline]] inline double unit_double(uint32_t hi, uint32_t lo, double add = 0.0) noexcept {
  const double a = static_cast<double>(static_cast<int32_t>(hi >> 5));  // 27 bits
  const double b = static_cast<double>(static_cast<int32_t>(lo >> 6));  // 26 bits
  return (a * 67108864.0 + b + add) * (1.0 / 9007199254740992.0);
}

// log(x) for normal x > 0 (fdlibm's e_log.c kernel; error below 1 ulp).
[[gnu::always_inline]] inline double philox_log(double x) noexcept {
  constexpr double ln2_hi = 6.93147180369123816490e-01;
  constexpr double ln2_lo = 1.90821492927058770002e-10;
  constexpr double lg1 = 6.666666666666735130e-01, lg2 = 3.999999999940941908e-01,
                   lg3 = 2.857142874366239149e-01, lg4 = 2.222219843214978396e-01,
                   lg5 = 1.818357216161805012e-01, lg6 = 1.531383769920937332e-01,
                   lg7 = 1.479819860511658591e-01;
  // x = 2^k * m with m in [sqrt(2)/2, sqrt(2)).
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  uint32_t hx = static_cast<uint32_t>(bits >> 32) + (0x3ff00000u - 0x3fe6a09eu);
  const int32_t k = static_cast<int32_t>(hx >> 20) - 0x3ff;
  hx = (hx & 0x000fffffu) + 0x3fe6a09eu;
  const double m = std::bit_cast<double>((uint64_t{hx} << 32) | (bits & 0xffffffffu));
  const double f = m - 1.0;
  const double hfsq = 0.5 * f * f;
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double w = z * z;
  const double t1 = w * (lg2 + w * (lg4 + w * lg6));
  const double t2 = z * (lg1 + w * (lg3 + w * (lg5 + w * lg7)));
  const double r = t2 + t1;
  const double dk = static_cast<double>(k);
  return s * (hfsq + r) + dk * ln2_lo - hfsq + f + dk * ln2_hi;
}

// cos(2 pi u) for u in [0, 1) (fdlibm's sin/cos kernels on [-pi/4, pi/4]).
[[gnu::always_inline]] inline double philox_cos_2pi(double u) noexcept {
  constexpr double s1 = -1.66666666666666324348e-01, s2 = 8.33333333332248946124e-03,
                   s3 = -1.98412698298579493134e-04, s4 = 2.75573137070700676789e-06,
                   s5 = -2.50507602534068634195e-08, s6 = 1.58969099521155010221e-10;
  constexpr double c1 = 4.16666666666666019037e-02, c2 = -1.38888888888741095749e-03,
                   c3 = 2.48015872894767294178e-05, c4 = -2.75573143513906633035e-07,
                   c5 = 2.08757232129817482790e-09, c6 = -1.13596475577881948265e-11;
  constexpr double half_pi = 1.57079632679489661923;
  const double t = u * 4.0;                                 // quarter turns, exact
  const int32_t q = static_cast<int32_t>(t + 0.5);          // nearest quadrant
  const double a = (t - static_cast<double>(q)) * half_pi;  // [-pi/4, pi/4]
  const double z = a * a;
  const double sin_a = a + a * z * (s1 + z * (s2 + z * (s3 + z * (s4 + z * (s5 + z * s6)))));
  const double cos_a = 1.0 - 0.5 * z + z * z * (c1 + z * (c2 + z * (c3 + z * (c4 + z * (c5 + z * c6)))));
  // cos(q pi/2 + a): q mod 4 = 0: cos a, 1: -sin a, 2: -cos a, 3: sin a. Blended
  // arithmetically: a ?: between the two polynomials would become a branch (each is
  // used in one arm only) and keep the loop from vectorising.
  const double odd = static_cast<double>(q & 1);
  const double sign = static_cast<double>(1 - ((q + 1) & 2));
  return sign * (odd * sin_a + (1.0 - odd) * cos_a);
}

// Uniform double in [0, 1) for element `index`.
[[gnu::always_inline]] inline double philox_uniform(uint64_t seed, uint64_t index) noexcept {
  const Philox4x32 w = philox_words(seed, index);
  return unit_double(w.v[0], w.v[1]);
}

// Standard normal double for element `index` (Box-Muller on the element's own four
// words; one of the pair it could give is dropped so that i maps to one counter).
[[gnu::always_inline]] inline double philox_normal(uint64_t seed, uint64_t index) noexcept {
  const Philox4x32 w = philox_words(seed, index);
  const double u1 = unit_double(w.v[0], w.v[1], 1.0);  // (0, 1]: log is finite
  const double u2 = unit_double(w.v[2], w.v[3]);       // [0, 1)
  const double radius = __builtin_sqrt(-2.0 * philox_log(u1));
  return radius * philox_cos_2pi(u2);
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_PHILOX_HPP_
