// A raw loopback client of the rendezvous store, for tests that send what no
// well-behaved client sends: bytes, half frames, floods, and the handshake
// through the real codec (distributed/store_wire.hpp). Reads give up after a
// few seconds, so a server that fails to answer fails the test.
#ifndef BACKPLANE_TESTS_CORE_STORE_RAW_CLIENT_HPP_
#define BACKPLANE_TESTS_CORE_STORE_RAW_CLIENT_HPP_

#include "distributed/store_wire.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace bptest {

class RawStoreClient {
 public:
  explicit RawStoreClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~RawStoreClient() { ::close(fd_); }
  RawStoreClient(const RawStoreClient&) = delete;
  RawStoreClient& operator=(const RawStoreClient&) = delete;

  // False when the peer is gone.
  bool send(const void* data, std::size_t n) {
    return ::send(fd_, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
  }
  // Fails the test when the bytes cannot be sent.
  void send(const std::vector<uint8_t>& data) { REQUIRE(send(data.data(), data.size())); }
  // Exactly n bytes, or fewer when the peer closed or the read timed out.
  std::vector<uint8_t> read(std::size_t n) {
    std::vector<uint8_t> out(n);
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    out.resize(got);
    return out;
  }
  // True when the server closed the connection (EOF or reset), false when
  // it kept it open past the read timeout.
  bool closed_by_peer() {
    uint8_t b;
    for (;;) {
      const ssize_t r = ::recv(fd_, &b, 1, 0);
      if (r == 0) return true;
      if (r < 0) return errno == ECONNRESET;
    }
  }
  // The store's handshake with the job secret, through the real codec: the
  // verdict, or -1 when the server sent none.
  int authenticate(int32_t rank, int32_t world_size, std::string_view secret) {
    namespace w = backplane::store_wire;
    const w::Nonce nonce = w::random_nonce();
    const auto h = w::make_hello(nonce);
    send(h.data(), h.size());
    const std::vector<uint8_t> challenge = read(w::kChallengeBytes);
    if (challenge.size() != w::kChallengeBytes) return -1;
    w::Nonce server_nonce{};
    std::memcpy(server_nonce.data(), challenge.data() + w::kHelloPrefixBytes, w::kNonceBytes);
    const auto p =
        w::make_proof(w::client_proof(secret, nonce, server_nonce, rank, world_size), rank, world_size);
    send(p.data(), p.size());
    const std::vector<uint8_t> verdict = read(w::kVerdictBytes);
    if (verdict.size() != w::kVerdictBytes) return -1;
    return w::get_u16(verdict.data() + 6);
  }

 private:
  int fd_ = -1;
};

}  // namespace bptest

#endif  // BACKPLANE_TESTS_CORE_STORE_RAW_CLIENT_HPP_
