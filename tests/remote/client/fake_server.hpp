// A small in-test server that speaks the remote protocol (wire/) with a
// scripted behaviour: the handshake with or without a token or TLS, a toy
// memory model (alloc, write, read, f32 add), sticky failures, a key-value
// exchange during CommCreate, and the failures the client must survive (a
// server that closes mid-request, one that stops answering). It counts what
// it receives so that tests can check coalescing. Blocking I/O, one thread
// per connection; stopped by shutting its sockets down.
#ifndef BACKPLANE_TESTS_REMOTE_CLIENT_FAKE_SERVER_HPP_
#define BACKPLANE_TESTS_REMOTE_CLIENT_FAKE_SERVER_HPP_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "remote/wire/frame.hpp"
#include "remote/wire/stream.hpp"

namespace backplane::remote::test {

struct FakeDevice {
  std::string name = "fake device";
  uint64_t capabilities = 0;
  std::vector<std::pair<std::string, std::string>> attributes;
  // Ops the device runs (for every dtype below BP_DTYPE_COUNT_).
  std::vector<int32_t> ops;
};

struct FakeOptions {
  std::string token;                        // "" = no authentication
  wire::asio::ssl::context* tls = nullptr;  // TLS when set
  std::vector<FakeDevice> devices{FakeDevice{}};
  std::string server_version = "9.9.9-fake";
  uint64_t max_frame_bytes = 0;            // announced in the Welcome
  wire::Body close_on = wire::Body::NONE;  // close the connection when this request arrives
  wire::Body stall_on = wire::Body::NONE;  // from this request on, never answer anything
  // During CommCreate: set key_prefix + "probe" to kv_value, read it back,
  // and answer the CommCreate with what came back (failure if it differs).
  std::string kv_value = "rendezvous";
};

class FakeServer {
 public:
  explicit FakeServer(FakeOptions options);
  ~FakeServer();
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  uint16_t port() const noexcept { return port_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

  // What arrived after the handshakes, over all connections.
  uint64_t frames() const noexcept { return frames_; }
  uint64_t reads() const noexcept { return reads_; }  // recv calls that returned data
  std::vector<std::string> bodies() const;            // body names in arrival order
  uint64_t sessions() const noexcept { return sessions_; }
  uint64_t goodbyes() const noexcept { return goodbyes_; }
  // KvReplies received: (status, value as text).
  std::vector<std::pair<int32_t, std::string>> kv_replies() const;

 private:
  struct Conn;
  void accept_loop();
  void serve(std::shared_ptr<Conn> conn);
  bool handshake(Conn& c);
  void session(Conn& c);

  FakeOptions options_;
  wire::asio::io_context io_;
  wire::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::thread acceptor_thread_;

  mutable std::mutex mu_;
  std::vector<std::thread> threads_;
  std::vector<int> open_fds_;  // connections still being served (shut down by the destructor)
  bool stopping_ = false;
  std::vector<std::string> bodies_;
  std::vector<std::pair<int32_t, std::string>> kv_replies_;
  std::atomic<uint64_t> frames_{0};
  std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> sessions_{0};
  std::atomic<uint64_t> goodbyes_{0};
};

// A self-signed certificate for 127.0.0.1 and "localhost" with its key, as
// PEM files written to `dir` (cert.pem, key.pem); made with OpenSSL's API.
void make_self_signed(const std::string& dir);

}  // namespace backplane::remote::test

#endif  // BACKPLANE_TESTS_REMOTE_CLIENT_FAKE_SERVER_HPP_
