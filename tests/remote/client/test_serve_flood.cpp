// A real `backplane serve` (default options) under a flood of silent
// connections, held open and reopened whenever the server closes one: from
// the clients' own address (127.0.0.1), and spread over 20 loopback
// addresses. A remote-plugin client with default options still gets in.
#include <backplane/backplane.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "client_support.hpp"
#include "serve_process.hpp"

namespace bp = backplane;
using namespace backplane::remote::test;

namespace {

// `count` connections to 127.0.0.1:port that never send a byte, from the
// `sources` in turn; one the server closes is opened again at once, until
// the flood is destroyed.
class SilentFlood {
 public:
  SilentFlood(uint16_t port, std::vector<std::string> sources, int count)
      : port_(port), sources_(std::move(sources)) {
    for (int i = 0; i < count; ++i) {
      const std::string& from = sources_[static_cast<std::size_t>(i) % sources_.size()];
      fds_.push_back(open_from(from));
      from_.push_back(from);
    }
    thread_ = std::thread([this] { run(); });
  }
  ~SilentFlood() {
    stop_ = true;
    thread_.join();
    for (const int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  SilentFlood(const SilentFlood&) = delete;
  SilentFlood& operator=(const SilentFlood&) = delete;

 private:
  int open_from(const std::string& source) const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw std::runtime_error("socket() failed");
    sockaddr_in from{};
    from.sin_family = AF_INET;
    if (::inet_pton(AF_INET, source.c_str(), &from.sin_addr) != 1 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
      ::close(fd);
      throw std::runtime_error("cannot bind to " + source);
    }
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port_);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // Non-blocking: a full listen queue must not stall the flood.
    ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to);
    return fd;
  }

  void run() {
    std::vector<pollfd> polled(fds_.size());
    while (!stop_) {
      for (std::size_t i = 0; i < fds_.size(); ++i) polled[i] = pollfd{fds_[i], POLLIN, 0};
      if (::poll(polled.data(), polled.size(), 50) <= 0) continue;
      for (std::size_t i = 0; i < fds_.size(); ++i) {
        if (polled[i].revents == 0) continue;
        char byte = 0;
        const ssize_t n = ::recv(fds_[i], &byte, 1, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        ::close(fds_[i]);
        fds_[i] = open_from(from_[i]);
      }
    }
  }

  uint16_t port_;
  std::vector<std::string> sources_;
  std::vector<int> fds_;
  std::vector<std::string> from_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

uint16_t port_of(const std::string& endpoint) {
  return static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
}

std::vector<std::string> loopback_addresses(int first, int count) {
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) out.push_back("127.0.0." + std::to_string(first + i));
  return out;
}

// A remote-plugin client with default options (no connect_timeout_ms):
// loading the backend connects and runs the handshake; then one op.
void default_client_gets_in(const std::string& endpoint) {
  const bp::Registry r = bp::Registry::from_json(
      R"({"schema_version": 1, "backends": [{"name": "remote", "library": "backplane_remote", "required": true, )"
      R"("options": {"endpoints": [")" +
          endpoint + R"("], "token_env": "BP_TEST_REMOTE_NO_SUCH_TOKEN"}}]})",
      BP_TEST_PLUGIN_DIR, "test_serve_flood");
  const bp::Backend b = r.backend("remote");
  REQUIRE(b.device_count() == 1);
  const bp::Tensor x = bp::Tensor::from_vector(b.device(0), bp::Shape{3}, std::vector<float>{1, 2, 3});
  CHECK((x + x).to_vector<float>() == std::vector<float>{2, 4, 6});
}

void flood_then_client(const std::vector<std::string>& sources, int count) {
  TempDir dir;
  ServeProcess server(dir.path);
  SilentFlood flood(port_of(server.endpoint()), sources, count);
  // The flood is in place (the kernel has taken every connection) before the client starts.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  default_client_gets_in(server.endpoint());
}

}  // namespace

TEST_CASE(
    "serve flood: 16 silent connections from the clients' own address leave a default client a way in") {
  flood_then_client({"127.0.0.1"}, 16);
}

TEST_CASE(
    "serve flood: 200 silent connections from the clients' own address leave a default client a way in") {
  flood_then_client({"127.0.0.1"}, 200);
}

TEST_CASE("serve flood: 200 silent connections over 20 loopback addresses leave a default client a way in") {
  flood_then_client(loopback_addresses(2, 20), 200);
}
