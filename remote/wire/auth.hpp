// The remote handshake's proofs: both sides show they hold the token K without
// sending it. HMAC-SHA256 over fresh 32-byte nonces from each side, with a
// label per direction so one side's proof is never valid as the other's;
// compared in constant time. A replayed Proof fails because the server's
// nonce is new on every connection.
//   server_proof = HMAC(K, "backplane remote server" | Nc | Ns)
//   client_proof = HMAC(K, "backplane remote client" | Nc | Ns)
#ifndef BACKPLANE_REMOTE_WIRE_AUTH_HPP_
#define BACKPLANE_REMOTE_WIRE_AUTH_HPP_

#include "remote/wire/frame.hpp"

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

namespace backplane::remote::wire {

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// Fresh random bytes from OpenSSL; throws std::runtime_error if its generator fails.
Nonce random_nonce();
Mac server_proof(std::string_view token, std::span<const uint8_t> client_nonce,
                 std::span<const uint8_t> server_nonce);
Mac client_proof(std::string_view token, std::span<const uint8_t> client_nonce,
                 std::span<const uint8_t> server_nonce);
// Constant-time: false for a proof of another length.
bool same_mac(const Mac& expected, std::span<const uint8_t> received) noexcept;

// A trace's flow ids: both sides derive the session's key from the two
// nonces of its handshake, and request r's flow (client send -> server run)
// is trace_flow_id(key, r): the same on both sides, and unlike any other
// session's. Not secret; nonces shorter than expected count as zeros.
uint64_t trace_flow_key(std::span<const uint8_t> client_nonce,
                        std::span<const uint8_t> server_nonce) noexcept;
inline uint64_t trace_flow_id(uint64_t key, uint64_t request) noexcept {
  uint64_t x = key ^ (request * 0x9e3779b97f4a7c15ULL);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return (x ^ (x >> 31)) & ((uint64_t{1} << 53) - 1);  // exact in a JSON number (a double)
}

}  // namespace backplane::remote::wire

#endif  // BACKPLANE_REMOTE_WIRE_AUTH_HPP_
