// UTF-8 in messages: text read from files (a config, a safetensors header)
// may hold bytes that are not UTF-8, and a message quoting them would carry
// them to a terminal, a log and Python (which cannot decode it). Used by the
// config and safetensors readers on their failure paths only.
#ifndef BACKPLANE_CORE_UTF8_HPP_
#define BACKPLANE_CORE_UTF8_HPP_

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace backplane::detail {

// The length of the well-formed UTF-8 character at s[i] (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or 0 if the bytes
// there are not one.
inline std::size_t utf8_char_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  const unsigned c = b(i);
  const auto cont = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return b(k) >= lo && b(k) <= hi;
  };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80;
    const unsigned hi = c == 0xED ? 0x9F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

// `s` with every byte that is not part of a well-formed UTF-8 character
// written as \xNN, so the result is valid UTF-8 and shows what was there.
inline std::string escape_invalid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (const std::size_t n = utf8_char_length(s, i); n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02X", static_cast<unsigned>(static_cast<unsigned char>(s[i])));
    out += hex;
    ++i;
  }
  return out;
}

// The offset of the first byte of `s` that is not part of a well-formed
// UTF-8 character, or std::string_view::npos.
inline std::size_t first_invalid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_char_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_UTF8_HPP_
