// HMAC-SHA256 through OpenSSL's one-shot HMAC(), SHA-256 through its EVP digest
// interface, CRYPTO_memcmp and RAND_bytes.
#include "backplane_common/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>
#include <memory>
#include <string>
#include <vector>

namespace backplane::common {

std::optional<Sha256> hmac_sha256(std::string_view key,
                                  std::initializer_list<std::span<const uint8_t>> parts) {
  std::vector<uint8_t> message;
  for (const auto& part : parts) message.insert(message.end(), part.begin(), part.end());
  if (key.size() > static_cast<std::size_t>(INT_MAX)) return std::nullopt;
  static const uint8_t kEmpty = 0;  // HMAC with an empty key is defined (zero-padded)
  const void* key_bytes = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  Sha256 out{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()), message.data(), message.size(), out.data(),
           &len) == nullptr ||
      len != kSha256Bytes)
    return std::nullopt;
  return out;
}

struct Sha256Hasher::Context {
  EVP_MD_CTX* ctx = nullptr;
  bool ok = false;
};

Sha256Hasher::Sha256Hasher() : context_(std::make_unique<Context>()) {
  context_->ctx = EVP_MD_CTX_new();
  context_->ok = context_->ctx != nullptr && EVP_DigestInit_ex(context_->ctx, EVP_sha256(), nullptr) == 1;
}

Sha256Hasher::~Sha256Hasher() { EVP_MD_CTX_free(context_->ctx); }

bool Sha256Hasher::update(std::span<const uint8_t> bytes) noexcept {
  if (context_->ok && !bytes.empty())
    context_->ok = EVP_DigestUpdate(context_->ctx, bytes.data(), bytes.size()) == 1;
  return context_->ok;
}

std::optional<Sha256> Sha256Hasher::finish() noexcept {
  if (!context_->ok) return std::nullopt;
  context_->ok = false;
  Sha256 out{};
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(context_->ctx, out.data(), &len) != 1 || len != kSha256Bytes) return std::nullopt;
  return out;
}

bool equal_constant_time(std::span<const uint8_t> a, std::span<const uint8_t> b) noexcept {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool random_bytes(std::span<uint8_t> out) noexcept {
  if (out.size() > static_cast<std::size_t>(INT_MAX)) return false;
  return out.empty() || RAND_bytes(out.data(), static_cast<int>(out.size())) == 1;
}

}  // namespace backplane::common
