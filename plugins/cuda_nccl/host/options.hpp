// The cuda plugin's options (the backend's "options" object in backends.json):
// parsed once by create, immutable afterwards. Plain C++, no CUDA: the CPU
// tests check the parser without a GPU.
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_HOST_OPTIONS_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_HOST_OPTIONS_HPP_

#include <cstdint>
#include <string>

namespace backplane::cuda {

// Bounds of the integer options, so that a typo cannot pin all host memory.
inline constexpr int64_t kMaxStagingMiB = 1024;

struct Options {
  // "tf32": f32 matmul may use TF32 tensor cores (10-bit mantissa products,
  // about 1e-3 relative error). Off by default: f32 matmul is then exact to
  // f32 rounding, as on the cpu backend.
  bool tf32 = false;
  // "collective": false drops BP_CAP_COLLECTIVE (the host's
  // collective_fallback decides); NCCL is then never initialised.
  bool collective = true;
  // "staging_mib": pinned host memory per device for buffer_write/read of
  // large transfers (two halves, double-buffered). 0: copies go straight
  // from/to pageable memory through the driver's own staging.
  int64_t staging_mib = 16;
  // "pool_keep_mib": bytes the stream-ordered allocator keeps cached when the
  // device synchronises; -1 (no option) keeps everything, so that per-op
  // allocations never return to the driver.
  int64_t pool_keep_mib = -1;
};

// Parses the options JSON text ("{}" or "null" for none). Unknown keys and
// values of the wrong type fail with BP_STATUS_INVALID_ARGUMENT naming the
// key, what was given and what is accepted.
Options parse_options(const std::string& json_text);

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_HOST_OPTIONS_HPP_
