// HMAC-SHA256 proofs and nonces for the remote handshake (backplane_common_crypto).
#include "remote/wire/auth.hpp"

#include <backplane_common/crypto.hpp>

#include <optional>
#include <stdexcept>

namespace backplane::remote::wire {

namespace {

Mac hmac(std::string_view label, std::string_view token, std::span<const uint8_t> a,
         std::span<const uint8_t> b) {
  const std::optional<common::Sha256> mac = common::hmac_sha256(token, {common::bytes_of(label), a, b});
  if (!mac) throw std::runtime_error("HMAC-SHA256 failed in OpenSSL's libcrypto");
  return *mac;
}

}  // namespace

Nonce random_nonce() {
  Nonce n{};
  if (!common::random_bytes(n))
    throw std::runtime_error("OpenSSL's random generator (RAND_bytes) failed; cannot make a nonce");
  return n;
}

Mac server_proof(std::string_view token, std::span<const uint8_t> client_nonce,
                 std::span<const uint8_t> server_nonce) {
  return hmac("backplane remote server", token, client_nonce, server_nonce);
}

Mac client_proof(std::string_view token, std::span<const uint8_t> client_nonce,
                 std::span<const uint8_t> server_nonce) {
  return hmac("backplane remote client", token, client_nonce, server_nonce);
}

bool same_mac(const Mac& expected, std::span<const uint8_t> received) noexcept {
  return common::equal_constant_time(expected, received);
}

uint64_t trace_flow_key(std::span<const uint8_t> client_nonce,
                        std::span<const uint8_t> server_nonce) noexcept {
  uint64_t key = 0x6a09e667f3bcc908ULL;
  for (const std::span<const uint8_t> nonce : {client_nonce, server_nonce})
    for (const uint8_t b : nonce) key = trace_flow_id(key, b);
  return key;
}

}  // namespace backplane::remote::wire
