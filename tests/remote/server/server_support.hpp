// Shared pieces of the server's tests: the cpu backend loaded once, a server
// hosting it in-process, the round trip a well-behaved client makes, waiting
// for the server's counters, and a self-signed TLS certificate made at test time.
#ifndef BACKPLANE_TESTS_REMOTE_SERVER_SERVER_SUPPORT_HPP_
#define BACKPLANE_TESTS_REMOTE_SERVER_SERVER_SUPPORT_HPP_

#include "raw_client.hpp"
#include "remote/server/server.hpp"

#include <backplane/hosting.hpp>
#include <backplane/registry.hpp>

#include <doctest/doctest.h>

#include "../self_signed_cert.hpp"

#include <openssl/ssl.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>

#ifndef BP_TEST_PLUGIN_DIR
#error "BP_TEST_PLUGIN_DIR must name the folder of the built plugins"
#endif

namespace rstest {

namespace rs = backplane::remote::server;
namespace fs = std::filesystem;

// The cpu backend, loaded once for the whole test program.
inline std::shared_ptr<const rs::Hosted> cpu_backend() {
  static const std::shared_ptr<const rs::Hosted> hosted = [] {
    const std::string json = std::string(R"({"schema_version": 1, "plugin_dirs": [")") + BP_TEST_PLUGIN_DIR +
                             R"("], "backends": [{"name": "cpu", "library": "backplane_cpu", "required": true,
                                 "options": {"threads": 1}}]})";
    const backplane::Registry registry = backplane::Registry::from_json(json, fs::current_path());
    const backplane::Backend backend = registry.backend("cpu");
    const backplane::HostedPlugin p = backplane::hosted_plugin(backend);
    return std::make_shared<const rs::Hosted>(p.api, p.plugin, backend.name(), backend.version(),
                                              std::make_shared<const backplane::Backend>(backend));
  }();
  return hosted;
}

inline rs::ServerOptions test_options(std::string token = "") {
  rs::ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.token = std::move(token);
  o.server_version = "test";
  o.limits.handshake_timeout = std::chrono::milliseconds(10000);
  o.limits.idle_timeout = std::chrono::milliseconds(60000);
  return o;
}

// Polls `done` until it is true or `timeout` passes (a safety bound, not a timing assertion).
inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// Waits until the server holds nothing: no waiting connection, handshake,
// session, buffer or communicator, and no byte in its memory account.
inline bool server_is_empty(const rs::Server& server) {
  return wait_until([&] {
    const rs::ServerStats s = server.stats();
    return s.waiting == 0 && s.handshakes == 0 && s.sessions == 0 && s.bytes == 0 && s.held == 0 &&
           s.buffers == 0 && s.comms == 0;
  });
}

// A well-behaved session: handshake, three buffers, writes, add, read back, goodbye.
inline void check_round_trip(uint16_t port, const std::string& token = "", SSL_CTX* tls = nullptr) {
  RawClient c(port, tls);
  if (tls != nullptr) REQUIRE(c.tls_ok());
  const auto welcome = c.handshake(token);
  REQUIRE(welcome);
  REQUIRE_MESSAGE(welcome->type() == wire::Body::Welcome, answer_of(*welcome).message);
  const std::vector<float> a{1, 2, 3, 4}, b{10, 20, 30, 40};
  REQUIRE(c.send(msg::alloc(1, 101, 0, 16)));
  REQUIRE(c.send(msg::alloc(2, 102, 0, 16)));
  REQUIRE(c.send(msg::alloc(3, 103, 0, 16)));
  REQUIRE(c.write(4, 101, 0, bytes_of(a)));
  REQUIRE(c.write(5, 102, 0, bytes_of(b)));
  REQUIRE(c.send(msg::execute(6, BP_OP_ADD, {msg::contiguous(101, {4}), msg::contiguous(102, {4})},
                              {msg::contiguous(103, {4})})));
  const auto r = c.request(msg::read(7, 103, 0, 16));
  REQUIRE(r);
  const Answer ans = answer_of(*r);
  REQUIRE_MESSAGE(ans.status == BP_STATUS_OK, ans.message);
  CHECK(r->msg()->id() == 7);
  CHECK(values_of<float>(r->payload) == std::vector<float>{11, 22, 33, 44});
  CHECK(c.send(msg::goodbye(8)));
  CHECK(c.closed_by_peer());
}

// A fresh folder under the system's temporary folder, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ =
        fs::temp_directory_path() / ("bp-remote-server-test-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A self-signed certificate for "localhost" and 127.0.0.1 (P-256), written as PEM files into `dir`.
inline TlsFiles make_self_signed(const fs::path& dir) {
  auto [cert, key] = backplane::remote::testing::write_self_signed(dir);
  return TlsFiles{cert, key};
}

// A client TLS context that trusts exactly `ca_file`.
struct ClientTls {
  explicit ClientTls(const std::string& ca_file) : ctx(SSL_CTX_new(TLS_client_method())) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr);
  }
  ~ClientTls() { SSL_CTX_free(ctx); }
  ClientTls(const ClientTls&) = delete;
  ClientTls& operator=(const ClientTls&) = delete;
  SSL_CTX* ctx;
};

}  // namespace rstest

#endif  // BACKPLANE_TESTS_REMOTE_SERVER_SERVER_SUPPORT_HPP_
