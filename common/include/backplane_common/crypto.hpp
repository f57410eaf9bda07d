// HMAC-SHA256, constant-time comparison and random bytes, over OpenSSL's
// libcrypto: what the rendezvous store's and the remote handshake's proofs
// are made of. Link backplane_common_crypto for these. Thread-safe.
// Nothing here throws: each caller reports a failure in its own terms.
#ifndef BACKPLANE_COMMON_CRYPTO_HPP_
#define BACKPLANE_COMMON_CRYPTO_HPP_

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace backplane::common {

inline constexpr std::size_t kSha256Bytes = 32;
using Sha256 = std::array<uint8_t, kSha256Bytes>;

// HMAC-SHA256 under `key` (empty is allowed: the key is then zero-padded, as
// HMAC defines) of the concatenation of `parts`. nullopt when libcrypto fails.
std::optional<Sha256> hmac_sha256(std::string_view key,
                                  std::initializer_list<std::span<const uint8_t>> parts);

// SHA-256 of data given in pieces (a checkpoint's tensors, one by one).
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;
  // False once libcrypto failed; the hasher then stays failed.
  bool update(std::span<const uint8_t> bytes) noexcept;
  // The digest of everything given; nullopt when libcrypto failed. After it,
  // the hasher is spent: update() and finish() fail.
  std::optional<Sha256> finish() noexcept;

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

// Whether a and b hold the same bytes, in time that depends only on their
// length; false when the lengths differ.
bool equal_constant_time(std::span<const uint8_t> a, std::span<const uint8_t> b) noexcept;

// Fills `out` from OpenSSL's random generator; false when it fails.
[[nodiscard]] bool random_bytes(std::span<uint8_t> out) noexcept;

// The bytes of a string, for hmac_sha256's parts.
inline std::span<const uint8_t> bytes_of(std::string_view text) noexcept {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

}  // namespace backplane::common

#endif  // BACKPLANE_COMMON_CRYPTO_HPP_
