// Bytes as lowercase hex digits (digests, secrets, random names).
#ifndef BACKPLANE_COMMON_HEX_HPP_
#define BACKPLANE_COMMON_HEX_HPP_

#include <cstdint>
#include <span>
#include <string>

namespace backplane::common {

// Two lowercase hex digits per byte, in order.
inline std::string to_hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * bytes.size());
  for (const uint8_t b : bytes) {
    hex += kDigits[b >> 4];
    hex += kDigits[b & 15];
  }
  return hex;
}

}  // namespace backplane::common

#endif  // BACKPLANE_COMMON_HEX_HPP_
