// What the cpu plugin says about its one device: name, capability flags,
// attributes and memory. Probing is cheap and starts nothing: no thread pool,
// no BLAS (attributes about the kernel library come from build-time facts), so
// listing devices costs microseconds.
#ifndef BACKPLANE_PLUGINS_CPU_DEVICE_HPP_
#define BACKPLANE_PLUGINS_CPU_DEVICE_HPP_

#include <backplane/plugin.hpp>

#include <cstdint>

#include "options.hpp"

namespace backplane::cpu {

// Threads the kernels use when the "threads" option is 0: OMP_NUM_THREADS when
// set, else the cores this process may run on (as OpenMP would pick).
int default_thread_count() noexcept;

// name "host (N threads)", BP_CAP_HOST_VISIBLE, BP_CAP_MATMUL when `ops` holds
// matmul and `dtypes` a dtype it takes, the dtype flags `dtypes` (options
// "ops" / "dtypes"; by default every dtype the device holds), BP_CAP_COLLECTIVE
// when `collective`, and attributes (threads, blas, blas_threads, simd,
// vector_math, rng, collectives, openmp, max_ndim, cpu_model; ops and dtypes when
// the options narrow them; flush_denormals when that option is on).
plugin::DeviceInfo probe_device(int threads, bool collective, bool shared_memory, const OpSet& ops,
                                uint64_t dtypes, bool flush_denormals);

// MemAvailable / MemTotal of /proc/meminfo (sysinfo where that cannot be read).
plugin::MemoryInfo host_memory();

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_DEVICE_HPP_
