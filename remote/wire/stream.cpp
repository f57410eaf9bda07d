// TLS contexts and endpoint parsing for the remote protocol.
#include "remote/wire/stream.hpp"

#include <charconv>
#include <stdexcept>

namespace backplane::remote::wire {

namespace {

std::unique_ptr<asio::ssl::context> base_context() {
  auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls);
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use);
  return ctx;
}

}  // namespace

std::unique_ptr<asio::ssl::context> server_tls_context(const std::string& cert_file,
                                                       const std::string& key_file) {
  auto ctx = base_context();
  boost::system::error_code ec;
  ctx->use_certificate_chain_file(cert_file, ec);
  if (ec)
    throw std::runtime_error("cannot use the TLS certificate '" + cert_file + "': " + ec.message() +
                             " (give a PEM certificate chain)");
  ctx->use_private_key_file(key_file, asio::ssl::context::pem, ec);
  if (ec)
    throw std::runtime_error("cannot use the TLS private key '" + key_file + "': " + ec.message() +
                             " (give the PEM key of the certificate)");
  return ctx;
}

std::unique_ptr<asio::ssl::context> client_tls_context(const std::string& ca_file) {
  auto ctx = base_context();
  boost::system::error_code ec;
  ctx->load_verify_file(ca_file, ec);
  if (ec)
    throw std::runtime_error("cannot load the TLS CA file '" + ca_file + "': " + ec.message() +
                             " (give the PEM certificate that signed the server's)");
  ctx->set_verify_mode(asio::ssl::verify_peer);
  return ctx;
}

std::pair<std::string, uint16_t> split_endpoint(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size())
    throw std::invalid_argument("endpoint \"" + endpoint + "\" is not HOST:PORT (e.g. \"127.0.0.1:7070\")");
  std::string host = endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_text = endpoint.substr(colon + 1);
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc{} || end != port_text.data() + port_text.size() || port == 0 || port > 65535)
    throw std::invalid_argument("endpoint \"" + endpoint +
                                "\" has no valid port (1..65535) after the last ':'");
  return {host, static_cast<uint16_t>(port)};
}

}  // namespace backplane::remote::wire
