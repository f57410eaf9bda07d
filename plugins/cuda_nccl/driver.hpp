// What the cuda plugin's front library knows about the GPUs without the CUDA
// runtime, cuBLAS or NCCL: the driver API (libcuda.so.1) and NVML
// (libnvidia-ml.so.1), both loaded with dlopen on the first question, so that
// loading the plugin needs neither and a machine without a driver reports why.
// Nothing here makes a CUDA context: cuInit and the device queries do not.
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_DRIVER_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_DRIVER_HPP_

#include <backplane/plugin.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "host/options.hpp"

namespace backplane::cuda {

// What the driver says about the devices, once per instance: their count, or
// why there are none (BP_STATUS_UNAVAILABLE with "CUDA driver not found: ...",
// "no CUDA GPU found: ..." or "CUDA initialisation failed: ...").
struct DeviceCount {
  int32_t count = 0;
  std::string unavailable;  // non-empty: the reason there are no devices
};
DeviceCount probe_device_count();
// Name, capabilities and attributes from the driver's device queries (no
// context). The runtime, cuBLAS and NCCL versions are those the engine
// library was built with (their headers): asking them would load them.
plugin::DeviceInfo probe_device(int32_t ordinal, const Options& options);
// The capability flags of every device (constant for the instance).
uint64_t device_capabilities(const Options& options);
// Free/total bytes without a context (NVML, loaded on demand); nullopt with
// `why` when NVML cannot say.
std::optional<plugin::MemoryInfo> memory_without_context(int32_t ordinal, std::string& why);

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_DRIVER_HPP_
