// IEEE binary16 (f16) and bfloat16 (bf16) <-> f32, round to nearest even,
// on the bits (uint16_t). f16 and bf16 values are all exact in f32, so
// widening is exact; narrowing rounds once. NaN stays NaN (quiet), an
// overflow rounds to infinity, subnormals are kept. Inline: the cpu plugin's
// reductions call them per element.
#ifndef BACKPLANE_COMMON_HALF_HPP_
#define BACKPLANE_COMMON_HALF_HPP_

#include <bit>
#include <cstdint>

namespace backplane::common {

inline float f16_to_f32(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24 is exact in f32.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
}

inline uint16_t f32_to_f16(float f) noexcept {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN stays NaN (quiet)
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 2^16: inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal or zero. Adding 0.5
    // (2^-1) aligns the value so that f32's own rounding leaves the half's
    // subnormal mantissa, correctly rounded, in the low bits.
    const float aligned = std::bit_cast<float>(magnitude) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(aligned) - 0x3f000000u));
  }
  // Normal: rebias the exponent, then round the 13 dropped bits to nearest even.
  const uint32_t odd = (magnitude >> 13) & 1u;
  const uint32_t rounded = magnitude - (uint32_t{112} << 23) + 0xfffu + odd;
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

inline float bf16_to_f32(uint16_t h) noexcept { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) noexcept {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  const uint32_t odd = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + odd) >> 16);
}

}  // namespace backplane::common

#endif  // BACKPLANE_COMMON_HALF_HPP_
