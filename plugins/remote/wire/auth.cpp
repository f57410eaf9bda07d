// HMAC-SHA256 proofs and nonces for the remote handshake (OpenSSL's libcrypto).
#include "auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdexcept>
#include <vector>

namespace backplane::remote::wire {

namespace {

Mac hmac(std::string_view label, std::string_view token, std::span<const uint8_t> a,
         std::span<const uint8_t> b) {
  std::vector<uint8_t> message(label.begin(), label.end());
  message.insert(message.end(), a.begin(), a.end());
  message.insert(message.end(), b.begin(), b.end());
  Mac out{};
  unsigned int len = 0;
  static const uint8_t kEmpty = 0;  // HMAC with an empty key is defined (zero-padded)
  const void* key = token.empty() ? static_cast<const void*>(&kEmpty) : token.data();
  if (HMAC(EVP_sha256(), key, static_cast<int>(token.size()), message.data(), message.size(), out.data(),
           &len) == nullptr ||
      len != kMacBytes)
    throw std::runtime_error("HMAC-SHA256 failed in OpenSSL's libcrypto");
  return out;
}

}  // namespace

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
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
  return received.size() == expected.size() &&
         CRYPTO_memcmp(expected.data(), received.data(), kMacBytes) == 0;
}

}  // namespace backplane::remote::wire
