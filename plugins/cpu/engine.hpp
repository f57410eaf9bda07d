// The seam between the cpu plugin's two libraries. The front, libbackplane_cpu
// (options, device probing, buffers; what the host loads), links nothing heavy.
// The engine, libbackplane_cpu_engine (the kernels with OpenMP, OpenBLAS, libmvec,
// and Gloo collectives), is loaded by the front on a device's first use
// (buffer_alloc, execute, comm_create, a large buffer copy): OpenBLAS starts its
// thread pool in a library constructor and Gloo costs milliseconds to load, so
// loading the plugin and listing devices must not pull them in.
//
// Both libraries come from one build with one compiler, so C++ types may cross;
// exceptions do not: every entry returns a bp_status* (NULL on success) that the
// front turns back into a plugin::Failure. Every entry may be called from any
// thread (the ABI's rules hold unchanged behind the seam).
#ifndef BACKPLANE_PLUGINS_CPU_ENGINE_HPP_
#define BACKPLANE_PLUGINS_CPU_ENGINE_HPP_

#include <backplane/abi.h>
#include <backplane/plugin/status.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "collectives.hpp"

namespace backplane::cpu {

// The engine library's file name, looked up next to the front library.
inline constexpr const char* kEngineLibrary = "libbackplane_cpu_engine.so";
// The engine's one exported symbol:
// `const EngineApi* bp_cpu_engine_entry(const bp_host_api* host)`.
inline constexpr const char* kEngineEntrySymbol = "bp_cpu_engine_entry";
// Changes whenever EngineApi or the entry changes; a front refuses an engine of
// another layout.
inline constexpr uint64_t kEngineMagic = 0x62706370750003ULL;

struct EngineApi {
  uint64_t magic;      // kEngineMagic
  size_t struct_size;  // sizeof(EngineApi)
  // A validated op (abi.h's execute) on `threads` threads at most.
  bp_status* (*execute)(const bp_execute_args* args, int threads);
  // memcpy of `size` bytes, threaded when large; dst and src do not overlap.
  bp_status* (*copy)(void* dst, const void* src, uint64_t size, int threads);
  // The collectives, forwarded to Communicator (collectives.hpp).
  bp_status* (*comm_create)(const bp_comm_create_args* args, const NetworkOptions* network, bp_comm** comm);
  bp_status* (*comm_destroy)(bp_comm* comm);
  bp_status* (*comm_abort)(bp_comm* comm);
  bp_status* (*all_reduce)(bp_comm* comm, const bp_tensor* input, const bp_tensor* output, int32_t reduce_op);
  bp_status* (*broadcast)(bp_comm* comm, const bp_tensor* tensor, int32_t root);
  bp_status* (*all_gather)(bp_comm* comm, const bp_tensor* input, const bp_tensor* output);
  bp_status* (*reduce_scatter)(bp_comm* comm, const bp_tensor* input, const bp_tensor* output,
                               int32_t reduce_op);
  bp_status* (*barrier)(bp_comm* comm);
};

// The engine keeps `host` for plugin::log (its collectives' warnings).
using EngineEntryFn = const EngineApi* (*)(const bp_host_api* host);

// Front side (engine_loader.cpp): the engine once loaded, else null.
extern std::atomic<const EngineApi*> loaded_engine;
// Front side: loads the engine (under a lock; the slow half of engine()).
const EngineApi& load_engine();

// Front side: the engine, loaded on the first call (thread-safe; a failed load
// is retried by the next call). Throws plugin::Failure (BP_STATUS_UNAVAILABLE)
// naming the library and the loader's reason. After the first success: one
// acquire load, inline (it runs on every buffer_alloc and execute).
inline const EngineApi& engine() {
  if (const EngineApi* api = loaded_engine.load(std::memory_order_acquire)) [[likely]]
    return *api;
  return load_engine();
}

// Front side: throws the engine's status as a plugin::Failure (and frees it); a
// NULL status returns.
inline void rethrow(bp_status* status) {
  if (status == nullptr) [[likely]]
    return;
  const auto code = static_cast<bp_status_code>(plugin::status_code(status));
  std::string message = plugin::status_message(status);
  plugin::status_free(status);
  plugin::fail(code, std::move(message));
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_ENGINE_HPP_
