// A self-signed TLS certificate made at test time, for the remote backend's
// server and client tests: P-256, CN "localhost", SANs localhost and
// 127.0.0.1, CA:TRUE so it can be its own trust anchor.
#ifndef BACKPLANE_TESTS_REMOTE_SELF_SIGNED_CERT_HPP_
#define BACKPLANE_TESTS_REMOTE_SELF_SIGNED_CERT_HPP_

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace backplane::remote::testing {

// Writes cert.pem and key.pem into `dir` and returns their paths (cert, key).
// Throws std::runtime_error naming the OpenSSL step that failed.
inline std::pair<std::string, std::string> write_self_signed(const std::filesystem::path& dir) {
  auto check = [](bool ok, const char* step) {
    if (!ok) throw std::runtime_error(std::string("making a self-signed certificate: ") + step + " failed");
  };
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  check(key != nullptr, "EVP_EC_gen");
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), &X509_free);
  check(cert != nullptr, "X509_new");
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("localhost"),
                             -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE"},
                                   std::pair{NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    check(ext != nullptr, "X509V3_EXT_conf_nid");
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  check(X509_sign(cert.get(), key.get(), EVP_sha256()) > 0, "X509_sign");
  std::pair<std::string, std::string> files{(dir / "cert.pem").string(), (dir / "key.pem").string()};
  std::unique_ptr<FILE, decltype(&std::fclose)> c(std::fopen(files.first.c_str(), "w"), &std::fclose);
  check(c != nullptr && PEM_write_X509(c.get(), cert.get()) == 1, "writing cert.pem");
  std::unique_ptr<FILE, decltype(&std::fclose)> k(std::fopen(files.second.c_str(), "w"), &std::fclose);
  check(k != nullptr && PEM_write_PrivateKey(k.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1,
        "writing key.pem");
  return files;
}

}  // namespace backplane::remote::testing

#endif  // BACKPLANE_TESTS_REMOTE_SELF_SIGNED_CERT_HPP_
