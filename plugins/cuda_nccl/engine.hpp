// The seam between the cuda plugin's two libraries. The front,
// libbackplane_cuda_nccl (options, devices through the driver API and NVML
// loaded with dlopen, capabilities; what the host loads), links neither the
// CUDA runtime nor cuBLAS nor NCCL. The engine, libbackplane_cuda_nccl_engine
// (the static CUDA runtime, cuBLAS, NCCL and the kernels: streams, memory,
// ops and collectives), is loaded by the front at the first real use of a
// device (buffer_alloc, buffer_import, execute, comm_create): cuBLAS and NCCL
// take hundreds of milliseconds and megabytes to map, so loading the plugin
// and listing devices (or a job that never touches a GPU) must not pull them
// in.
//
// Both libraries come from one build with one compiler, so C++ types may
// cross; exceptions do not: every entry returns a bp_status* (NULL on
// success) that the front turns back into a plugin::Failure. Every entry may
// be called from any thread (the ABI's rules hold unchanged behind the seam);
// the front has checked device indices against its own count before a call.
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_ENGINE_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_ENGINE_HPP_

#include <backplane/abi.h>
#include <backplane/plugin.hpp>
#include <backplane/plugin/status.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "host/options.hpp"

namespace backplane::cuda {

// The engine library's file name, looked up next to the front library.
inline constexpr const char* kEngineLibrary = "libbackplane_cuda_nccl_engine.so";
// The engine's one exported symbol:
// `const EngineApi* bp_cuda_engine_entry(const bp_host_api* host)`.
inline constexpr const char* kEngineEntrySymbol = "bp_cuda_engine_entry";
// Changes whenever EngineApi changes; a front refuses an engine of another layout.
inline constexpr uint64_t kEngineMagic = 0x62706375646a0001ULL;

// The engine's state for one plugin instance: one Device per GPU (device.hpp).
// Opaque to the front.
struct EngineDevices;

struct EngineApi {
  uint64_t magic;      // kEngineMagic
  size_t struct_size;  // sizeof(EngineApi)
  // The devices 0 .. count - 1 of one plugin instance (count from the front's
  // probe); nothing touches a GPU until a device's first use.
  bp_status* (*create)(const Options* options, int32_t count, EngineDevices** devices);
  // Synchronises the started devices and releases their streams.
  void (*destroy)(EngineDevices* devices);
  // Free/total bytes from the runtime once the device has started
  // (*answered = true); before, *answered = false and no context is made.
  bp_status* (*device_memory)(EngineDevices* devices, int32_t device, plugin::MemoryInfo* memory,
                              bool* answered);
  // The ABI's buffer entries (abi.h), unchanged.
  bp_status* (*buffer_alloc)(EngineDevices* devices, int32_t device, uint64_t size, bp_buffer** buffer);
  bp_status* (*buffer_free)(EngineDevices* devices, bp_buffer* buffer);
  bp_status* (*buffer_write)(EngineDevices* devices, bp_buffer* buffer, uint64_t offset, const void* src,
                             uint64_t size);
  bp_status* (*buffer_read)(EngineDevices* devices, bp_buffer* buffer, uint64_t offset, void* dst,
                            uint64_t size);
  bp_status* (*buffer_pointer)(EngineDevices* devices, bp_buffer* buffer, plugin::BufferPointer* pointer);
  bp_status* (*buffer_import)(EngineDevices* devices, const bp_buffer_import_args* args, bp_buffer** buffer);
  bp_status* (*execute)(EngineDevices* devices, const bp_execute_args* args);
  bp_status* (*synchronize)(EngineDevices* devices, int32_t device);
  // The collectives, forwarded to Communicator (collectives.hpp). comm_create
  // runs only with the option "collective" on (the front checks).
  bp_status* (*comm_create)(EngineDevices* devices, const bp_comm_create_args* args, bp_comm** comm);
  bp_status* (*comm_destroy)(bp_comm* comm);
  bp_status* (*comm_abort)(bp_comm* comm);
  bp_status* (*all_reduce)(bp_comm* comm, const bp_tensor* input, const bp_tensor* output, int32_t reduce_op);
  bp_status* (*broadcast)(bp_comm* comm, const bp_tensor* tensor, int32_t root);
  bp_status* (*all_gather)(bp_comm* comm, const bp_tensor* input, const bp_tensor* output);
  bp_status* (*reduce_scatter)(bp_comm* comm, const bp_tensor* input, const bp_tensor* output,
                               int32_t reduce_op);
  bp_status* (*barrier)(bp_comm* comm);
};

// The engine keeps `host` for plugin::log.
using EngineEntryFn = const EngineApi* (*)(const bp_host_api* host);

// Front side (engine_loader.cpp): the engine once loaded, else null.
extern std::atomic<const EngineApi*> loaded_engine;
// Front side: loads the engine (under a lock; the slow half of engine()).
const EngineApi& load_engine();

// Front side: the engine, loaded on the first call (thread-safe; a failed load
// is retried by the next call). Throws plugin::Failure (BP_STATUS_UNAVAILABLE)
// naming the library and the loader's reason. After the first success: one
// acquire load, inline (it runs on every execute).
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

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_ENGINE_HPP_
