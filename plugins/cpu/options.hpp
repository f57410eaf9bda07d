// The cpu plugin's options (the backend's "options" object in backends.json):
// parsed once by create, immutable afterwards.
#ifndef BACKPLANE_PLUGINS_CPU_OPTIONS_HPP_
#define BACKPLANE_PLUGINS_CPU_OPTIONS_HPP_

#include <cstdint>
#include <string>

#include "collectives.hpp"

namespace backplane::cpu {

// Upper bound of the "threads" option: more would only exhaust the process's threads.
inline constexpr int64_t kMaxThreadsOption = 1024;

struct Options {
  int64_t threads = 0;  // "threads": 0 means one per core the process may use
  bool collective =
      true;  // "collective": false drops BP_CAP_COLLECTIVE (the host's collective_fallback decides)
  NetworkOptions network;  // "hostname" / "interface": where collectives listen (at most one)
};

// Parses the options JSON text ("{}" or "null" for none). Unknown keys and
// values of the wrong type fail with BP_STATUS_INVALID_ARGUMENT naming the key,
// what was given and what is accepted.
Options parse_options(const std::string& json_text);

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_OPTIONS_HPP_
