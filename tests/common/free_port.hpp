// A TCP port for a test's server, chosen so that parallel tests do not take
// it first. The kernel's "bind to port 0" answer comes from the ephemeral
// range, the same range every outgoing connection of every other test draws
// its local port from, so between releasing it and the server's bind another
// test's connect can take it (EADDRINUSE). This draws at random below that
// range instead and checks the port is free on every address.
#ifndef BACKPLANE_TESTS_COMMON_FREE_PORT_HPP_
#define BACKPLANE_TESTS_COMMON_FREE_PORT_HPP_

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>

namespace bptest {

// True if nothing is bound to `port` on any IPv4 address.
inline bool port_is_free(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// A port in [20000, 32768), below Linux's default ephemeral range
// (net.ipv4.ip_local_port_range 32768-60999), that nothing is bound to now.
inline uint16_t free_port() {
  std::random_device rd;
  std::uniform_int_distribution<int> pick(20000, 32767);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const auto port = static_cast<uint16_t>(pick(rd));
    if (port_is_free(port)) return port;
  }
  FAIL("no free TCP port in 20000-32767 after 1000 tries");
  return 0;
}

}  // namespace bptest

#endif  // BACKPLANE_TESTS_COMMON_FREE_PORT_HPP_
