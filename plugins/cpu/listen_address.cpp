// The choice of listen address (see listen_address.hpp).
#include "listen_address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <backplane/plugin.hpp>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace backplane::cpu {
namespace {}  // namespace

// The core's rendezvous store applies the same rule (store_server.cpp,
// is_loopback); the plugin never links the core, hence this copy.
bool is_loopback(const sockaddr* address) {
  if (address == nullptr) return false;
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

namespace {

// True when `host` resolves to an address this machine can bind (as PyTorch
// decides whether to use the hostname); `loopback_only` tells whether every
// address it resolves to is a loopback address.
bool resolves_to_usable_address(const std::string& host, bool& loopback_only) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) return false;
  bool usable = false;
  loopback_only = true;
  for (addrinfo* a = list; a != nullptr; a = a->ai_next)
    loopback_only = loopback_only && is_loopback(a->ai_addr);
  for (addrinfo* a = list; a != nullptr && !usable; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    usable = bind(fd, a->ai_addr, a->ai_addrlen) == 0;  // the port in ai_addr is 0: any free one
    close(fd);
  }
  freeaddrinfo(list);
  return usable;
}

// Checks that interface `name` has an IPv4 or IPv6 address, as Gloo will look
// for one. (Checked here because Gloo's own lookup leaks its interface list
// when the name is unknown.)
void check_interface(const std::string& name, const std::string& source) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return;  // let Gloo report it
  bool found = false;
  std::vector<std::string> usable;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
      continue;
    if (name == i->ifa_name) found = true;
    if (std::find(usable.begin(), usable.end(), i->ifa_name) == usable.end())
      usable.emplace_back(i->ifa_name);
  }
  freeifaddrs(list);
  if (found) return;
  std::string names;
  for (const auto& u : usable) names += (names.empty() ? "" : ", ") + u;
  plugin::fail(BP_STATUS_INVALID_ARGUMENT,
               source + " names interface \"" + name +
                   "\", which does not exist or has no IP address (interfaces with one: " +
                   (names.empty() ? "none" : names) + ")");
}

}  // namespace

ListenAddress choose_listen_address(const NetworkOptions& network) {
  ListenAddress out;
  if (const char* env = std::getenv("GLOO_SOCKET_IFNAME"); env != nullptr && *env != '\0') {
    const std::string name = env;
    if (name.find(',') != std::string::npos)
      plugin::fail(BP_STATUS_INVALID_ARGUMENT,
                   "GLOO_SOCKET_IFNAME=\"" + name +
                       "\" names several interfaces; the cpu backend listens on one: "
                       "set it to a single interface name");
    check_interface(name, "GLOO_SOCKET_IFNAME");
    out.attr.iface = name;
    out.description = "interface " + name + " (from GLOO_SOCKET_IFNAME)";
  } else if (!network.interface.empty()) {
    check_interface(network.interface, "the cpu option \"interface\"");
    out.attr.iface = network.interface;
    out.description = "interface " + network.interface + " (cpu option \"interface\")";
  } else if (!network.hostname.empty()) {
    out.attr.hostname = network.hostname;
    out.description = "hostname " + network.hostname + " (cpu option \"hostname\")";
  } else {
    // Resolved once per process: with no entry in /etc/hosts the lookup goes
    // to DNS, which can take seconds, and every communicator would pay it
    // inside its rendezvous timeout.
    static char name[256] = {};
    static bool named = false;
    static bool usable = false;
    static bool loopback_only = false;
    static std::once_flag resolved;
    std::call_once(resolved, [] {
      named = gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0';
      usable = named && resolves_to_usable_address(name, loopback_only);
    });
    if (usable) {
      out.attr.hostname = name;
      out.description = std::string("hostname ") + name + " (this machine's name" +
                        (loopback_only ? ", which resolves to a loopback address here)" : ")");
      if (loopback_only) {
        // Debian maps the machine's name to 127.0.1.1: peers on other machines cannot reach that.
        static std::once_flag warned_loopback;
        std::call_once(warned_loopback, [&] {
          plugin::log(BP_LOG_WARNING, "cpu: collectives listen on " + out.description +
                                          "; only ranks on this machine can connect. For jobs that span "
                                          "machines set GLOO_SOCKET_IFNAME or the cpu option \"interface\"");
        });
      }
    } else {
      out.attr.hostname = "127.0.0.1";
      out.description = std::string("127.0.0.1 (this machine's name") +
                        (named ? std::string(" '") + name + "'" : "") +
                        " does not resolve to an address it can listen on)";
      static std::once_flag warned;
      std::call_once(warned, [&] {
        plugin::log(BP_LOG_WARNING, "cpu: collectives listen on " + out.description +
                                        "; only ranks on this machine can connect. For jobs that span "
                                        "machines set GLOO_SOCKET_IFNAME or the cpu option \"interface\"");
      });
    }
  }
  return out;
}

}  // namespace backplane::cpu
