// The cpu plugin's options (the backend's "options" object in backends.json):
// parsed once by create, immutable afterwards.
#ifndef BACKPLANE_PLUGINS_CPU_OPTIONS_HPP_
#define BACKPLANE_PLUGINS_CPU_OPTIONS_HPP_

#include <backplane/abi.h>

#include <bitset>
#include <cstdint>
#include <string>

#include "collectives.hpp"
#include "op_dtypes.hpp"

namespace backplane::cpu {

// Upper bound of the "threads" option: more would only exhaust the process's threads.
inline constexpr int64_t kMaxThreadsOption = 1024;
// Upper bound of "shared_memory_pair_rings": 32 ranks already need 992 rings,
// 62 MiB of /dev/shm at their smallest.
inline constexpr int32_t kMaxPairRingsOption = 32;

// A set of ops: bit i stands for bp_op i.
using OpSet = std::bitset<BP_OP_COUNT_>;

struct Options {
  int64_t threads = 0;  // "threads": 0 means one per core the process may use
  bool collective =
      true;  // "collective": false drops BP_CAP_COLLECTIVE (the host's collective_fallback decides)
  NetworkOptions network;  // "hostname" / "interface": where collectives listen (at most one)
  // "ops" and "dtypes" narrow what the device claims, so tests and benchmarks can
  // model a partial backend (and the host's op_fallback) with the real kernels.
  OpSet ops = OpSet().set();                     // "ops": the ops supports_op may accept
  uint64_t dtypes = HeldDTypes::capabilities();  // "dtypes": the BP_CAP_DTYPE flags the device declares
  // "flush_denormals": ops read subnormal floats as zero and give zero for
  // them (fp_mode.hpp); off (the default): IEEE, as PyTorch.
  bool flush_denormals = false;
};

// Parses the options JSON text ("{}" or "null" for none). Unknown keys and
// values of the wrong type fail with BP_STATUS_INVALID_ARGUMENT naming the key,
// what was given and what is accepted.
Options parse_options(const std::string& json_text);

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_OPTIONS_HPP_
