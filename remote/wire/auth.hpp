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

}  // namespace backplane::remote::wire

#endif  // BACKPLANE_REMOTE_WIRE_AUTH_HPP_
