// Where this rank listens for its peers: GLOO_SOCKET_IFNAME, else the cpu
// options "interface" or "hostname", else this machine's name when it
// resolves to an address that can be bound, else loopback (with a warning).
#ifndef BACKPLANE_PLUGINS_CPU_LISTEN_ADDRESS_HPP_
#define BACKPLANE_PLUGINS_CPU_LISTEN_ADDRESS_HPP_

#include <gloo/transport/tcp/attr.h>
#include <sys/socket.h>

#include <string>

#include "collectives.hpp"

namespace backplane::cpu {

// 127.0.0.0/8, ::1 and IPv4-mapped 127.x (::ffff:127.0.0.1): the rule the
// core's rendezvous store uses to decide whether it listens on loopback only.
bool is_loopback(const sockaddr* address);

struct ListenAddress {
  gloo::transport::tcp::attr attr;
  std::string description;  // for messages: what was chosen and why
};

// Fails (INVALID_ARGUMENT) when the interface named does not exist or has no
// IP address, naming the interfaces that do.
ListenAddress choose_listen_address(const NetworkOptions& network);

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_LISTEN_ADDRESS_HPP_
