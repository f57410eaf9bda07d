// backplane_common's small routines: UniqueFd, edit_distance, the f16/bf16
// conversions (exhaustively against a reference), and the HMAC helpers
// (RFC 4231's test vectors).
#include <backplane_common/crypto.hpp>
#include <backplane_common/edit_distance.hpp>
#include <backplane_common/half.hpp>
#include <backplane_common/hex.hpp>
#include <backplane_common/unique_fd.hpp>

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace bc = backplane::common;

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

std::string hex(std::span<const uint8_t> bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const uint8_t b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

}  // namespace

TEST_CASE("unique_fd: closes what it owns once, moves ownership, releases on request") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  {
    bc::UniqueFd a(fds[0]);
    CHECK(a.valid());
    CHECK(a.get() == fds[0]);
    bc::UniqueFd b(std::move(a));
    CHECK_FALSE(a.valid());
    CHECK(b.get() == fds[0]);
    bc::UniqueFd c;
    CHECK_FALSE(c);
    c = std::move(b);
    CHECK(c.get() == fds[0]);
    CHECK(is_open(fds[0]));
  }
  CHECK_FALSE(is_open(fds[0]));  // closed once, by the last owner

  bc::UniqueFd w(fds[1]);
  const int raw = w.release();
  CHECK(raw == fds[1]);
  CHECK_FALSE(w.valid());
  CHECK(is_open(raw));  // released: not closed
  w.reset(raw);
  w.reset();
  CHECK_FALSE(is_open(raw));
}

TEST_CASE("edit_distance: insertions, deletions and substitutions of one byte") {
  CHECK(bc::edit_distance("", "") == 0);
  CHECK(bc::edit_distance("cpu", "cpu") == 0);
  CHECK(bc::edit_distance("cpu", "cpuu") == 1);
  CHECK(bc::edit_distance("cpu", "gpu") == 1);
  CHECK(bc::edit_distance("", "abc") == 3);
  CHECK(bc::edit_distance("kitten", "sitting") == 3);
  CHECK(bc::edit_distance("conect_timeout_ms", "connect_timeout_ms") == 1);
  CHECK(bc::edit_distance("ab", "ba") == 2);  // a transposition is two edits
}

TEST_CASE("half: every f16 value converts to f32 exactly and back to itself") {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = bc::f16_to_f32(bits);
    const uint32_t exponent = (h >> 10) & 0x1f;
    const uint32_t mantissa = h & 0x3ff;
    if (exponent == 0x1f && mantissa != 0) {
      REQUIRE(std::isnan(f));
      continue;
    }
    // The reference: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m for subnormals.
    const double magnitude = exponent == 0x1f ? std::numeric_limits<double>::infinity()
                             : exponent == 0
                                 ? std::ldexp(static_cast<double>(mantissa), -24)
                                 : std::ldexp(static_cast<double>(mantissa + 1024), int(exponent) - 25);
    REQUIRE(static_cast<double>(f) == ((h & 0x8000) != 0 ? -magnitude : magnitude));
    REQUIRE(std::signbit(f) == ((h & 0x8000) != 0));
    REQUIRE(bc::f32_to_f16(f) == bits);
  }
}

TEST_CASE("half: f32 to f16 and bf16 round to nearest even, overflow to infinity, NaN stays NaN") {
  CHECK(bc::f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie, even stays
  CHECK(bc::f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie, odd rounds up
  CHECK(bc::f32_to_f16(65504.0f) == 0x7bff);
  CHECK(bc::f32_to_f16(65520.0f) == 0x7c00);
  CHECK(bc::f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(bc::f32_to_f16(std::ldexp(3.0f, -26)) == 0x0001);
  CHECK(bc::f32_to_f16(-2.0f) == 0xc000);
  CHECK((bc::f32_to_f16(std::nanf("")) & 0x7e00) == 0x7e00);
  CHECK(bc::f32_to_bf16(1.0f) == 0x3f80);
  CHECK(bc::f32_to_bf16(std::bit_cast<float>(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(bc::f32_to_bf16(std::bit_cast<float>(0x3f818000u)) == 0x3f82);  // tie, odd rounds up
  CHECK(bc::f32_to_bf16(std::bit_cast<float>(0x7f7fffffu)) == 0x7f80);  // rounds to inf
  CHECK(std::isnan(bc::bf16_to_f32(bc::f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = bc::bf16_to_f32(static_cast<uint16_t>(h));
    REQUIRE(std::bit_cast<uint32_t>(f) == h << 16);
    if (!std::isnan(f)) REQUIRE(bc::f32_to_bf16(f) == h);
  }
}

TEST_CASE("crypto: HMAC-SHA256 matches RFC 4231, over parts as over their concatenation") {
  // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
  const auto whole = bc::hmac_sha256("Jefe", {bc::bytes_of("what do ya want for nothing?")});
  REQUIRE(whole.has_value());
  CHECK(hex(*whole) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const auto parts = bc::hmac_sha256(
      "Jefe", {bc::bytes_of("what do ya "), bc::bytes_of(""), bc::bytes_of("want for nothing?")});
  REQUIRE(parts.has_value());
  CHECK(*parts == *whole);
  // An empty key is defined (zero-padded) and differs from a one-byte zero key only in length.
  const auto empty = bc::hmac_sha256("", {bc::bytes_of("m")});
  REQUIRE(empty.has_value());
  CHECK(*empty != *whole);
}

TEST_CASE("crypto: Sha256Hasher matches FIPS 180-2's digests, over pieces as over the whole") {
  {
    bc::Sha256Hasher h;
    const auto d = h.finish();
    REQUIRE(d.has_value());
    CHECK(bc::to_hex(*d) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK_FALSE(h.finish().has_value());  // spent
    CHECK_FALSE(h.update(bc::bytes_of("x")));
  }
  bc::Sha256Hasher whole, pieces;
  REQUIRE(whole.update(bc::bytes_of("abc")));
  REQUIRE(pieces.update(bc::bytes_of("a")));
  REQUIRE(pieces.update(bc::bytes_of("")));
  REQUIRE(pieces.update(bc::bytes_of("bc")));
  const auto a = whole.finish();
  const auto b = pieces.finish();
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(bc::to_hex(*a) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(*a == *b);
}

TEST_CASE("crypto: equal_constant_time compares bytes and lengths, random_bytes fills") {
  const std::vector<uint8_t> a{1, 2, 3};
  const std::vector<uint8_t> b{1, 2, 3};
  const std::vector<uint8_t> c{1, 2, 4};
  const std::vector<uint8_t> shorter{1, 2};
  CHECK(bc::equal_constant_time(a, b));
  CHECK_FALSE(bc::equal_constant_time(a, c));
  CHECK_FALSE(bc::equal_constant_time(a, shorter));
  CHECK(bc::equal_constant_time({}, {}));
  std::vector<uint8_t> x(32), y(32);
  REQUIRE(bc::random_bytes(x));
  REQUIRE(bc::random_bytes(y));
  CHECK(x != y);  // 2^-256 to fail
}
