// The cuda backend plugin (libbackplane_cuda_nccl): one device per GPU,
// asynchronous (BP_CAP_ASYNC): ops, copies and collectives are queued on the
// device's streams and errors surface at the next synchronising call
// (buffer_read, synchronize, buffer_pointer). This file is the ABI face of
// the front library: options, devices, capabilities; buffers, ops and
// collectives run in the engine library (engine.hpp), loaded at the first
// real use of a device.
//
// create and device_count never make a CUDA context: create parses options;
// device_count asks the driver (libcuda.so.1, loaded with dlopen; cuInit and
// cuDeviceGetCount make none) and reports BP_STATUS_UNAVAILABLE with the
// reason on a machine without a driver or GPU; device_info reads the
// driver's device attributes, device_memory asks NVML until the device is in
// use. The engine (the CUDA runtime, cuBLAS, NCCL), and with it the context,
// streams and pool of a device, start on a device's first use (buffer_alloc,
// buffer_import, execute, comm_create).
#include <backplane/plugin.hpp>

#include <atomic>
#include <mutex>
#include <string>

#include "driver.hpp"
#include "engine.hpp"
#include "host/options.hpp"
#include "op_dtypes.hpp"

namespace backplane::cuda {
namespace {

using plugin::fail;

class CudaPlugin {
 public:
  using Features = plugin::Features<plugin::Feature::buffer_pointer, plugin::Feature::buffer_import,
                                    plugin::Feature::device_memory, plugin::Feature::synchronize,
                                    plugin::Feature::collectives>;

  explicit CudaPlugin(const plugin::CreateArgs& args) : options_(parse_options(args.options_json)) {}

  ~CudaPlugin() {
    // The engine's devices synchronise and release their streams. A started
    // instance implies a loaded engine.
    if (EngineDevices* e = devices_.load(std::memory_order_acquire))
      loaded_engine.load(std::memory_order_acquire)->destroy(e);
  }

  int32_t device_count() {
    const DeviceCount& c = probe();
    if (!c.unavailable.empty()) fail(BP_STATUS_UNAVAILABLE, c.unavailable);
    return c.count;
  }

  plugin::DeviceInfo device_info(int32_t device) {
    check_index(device);
    return probe_device(device, options_);
  }

  bool supports_op(int32_t device, int32_t op, int32_t dtype) {
    return device >= 0 && device < probe().count && op_supports(op, dtype);
  }

  plugin::MemoryInfo device_memory(int32_t device) {
    check_index(device);
    if (EngineDevices* e = devices_.load(std::memory_order_acquire)) {
      // A started device: the runtime answers.
      plugin::MemoryInfo m;
      bool answered = false;
      rethrow(engine().device_memory(e, device, &m, &answered));
      if (answered) return m;
    }
    // No context yet, and listing devices must not make one: ask NVML.
    std::string why;
    if (auto m = memory_without_context(device, why)) return *m;
    fail(BP_STATUS_UNAVAILABLE, "cuda: device_memory of cuda:" + std::to_string(device) +
                                    " before its first use needs NVML: " + why);
  }

  bp_buffer* buffer_alloc(int32_t device, uint64_t size) {
    check_index(device);
    bp_buffer* buffer = nullptr;
    rethrow(engine().buffer_alloc(start(), device, size, &buffer));
    return buffer;
  }

  void buffer_free(bp_buffer* handle) {
    if (handle == nullptr) return;
    rethrow(engine().buffer_free(for_buffer(handle, "buffer_free"), handle));
  }

  void buffer_write(bp_buffer* handle, uint64_t offset, const void* src, uint64_t size) {
    rethrow(engine().buffer_write(for_buffer(handle, "buffer_write"), handle, offset, src, size));
  }

  void buffer_read(bp_buffer* handle, uint64_t offset, void* dst, uint64_t size) {
    rethrow(engine().buffer_read(for_buffer(handle, "buffer_read"), handle, offset, dst, size));
  }

  // DLPack export: synchronising, so the consumer sees every queued write.
  plugin::BufferPointer buffer_pointer(bp_buffer* handle) {
    plugin::BufferPointer p;
    rethrow(engine().buffer_pointer(for_buffer(handle, "buffer_pointer"), handle, &p));
    return p;
  }

  // DLPack import of device memory on this device (kDLCUDA), without a copy.
  bp_buffer* buffer_import(const bp_buffer_import_args& a) {
    check_index(a.device);
    bp_buffer* buffer = nullptr;
    rethrow(engine().buffer_import(start(), &a, &buffer));
    return buffer;
  }

  void execute(const bp_execute_args& args) {
    check_index(args.device);
    rethrow(engine().execute(start(), &args));
  }

  void synchronize(int32_t device) {
    check_index(device);
    EngineDevices* e = devices_.load(std::memory_order_acquire);
    if (e == nullptr) return;  // nothing ever ran: nothing to wait for
    rethrow(engine().synchronize(e, device));
  }

  bp_comm* comm_create(const bp_comm_create_args& args) {
    if (!options_.collective)
      fail(BP_STATUS_UNSUPPORTED,
           "cuda: comm_create: collectives are switched off by the cuda option \"collective\": false");
    check_index(args.device);
    bp_comm* comm = nullptr;
    rethrow(engine().comm_create(start(), &args, &comm));
    return comm;
  }
  void comm_destroy(bp_comm* comm) { rethrow(engine_for_comm(comm, "comm_destroy").comm_destroy(comm)); }
  void comm_abort(bp_comm* comm) { rethrow(engine_for_comm(comm, "comm_abort").comm_abort(comm)); }
  void all_reduce(bp_comm* comm, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op) {
    rethrow(engine_for_comm(comm, "all_reduce").all_reduce(comm, &in, &out, op));
  }
  void broadcast(bp_comm* comm, const bp_tensor& tensor, int32_t root) {
    rethrow(engine_for_comm(comm, "broadcast").broadcast(comm, &tensor, root));
  }
  void all_gather(bp_comm* comm, const bp_tensor& in, const bp_tensor& out) {
    rethrow(engine_for_comm(comm, "all_gather").all_gather(comm, &in, &out));
  }
  void reduce_scatter(bp_comm* comm, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op) {
    rethrow(engine_for_comm(comm, "reduce_scatter").reduce_scatter(comm, &in, &out, op));
  }
  void barrier(bp_comm* comm) { rethrow(engine_for_comm(comm, "barrier").barrier(comm)); }

 private:
  const DeviceCount& probe() {
    std::call_once(probe_once_, [&] { count_ = probe_device_count(); });
    return count_;
  }

  void check_index(int32_t device) {
    const DeviceCount& c = probe();
    if (device < 0 || device >= c.count) [[unlikely]]
      fail(BP_STATUS_INVALID_ARGUMENT, "cuda: no device " + std::to_string(device) +
                                           " (the cuda backend has " + std::to_string(c.count) + " device" +
                                           (c.count == 1 ? "" : "s") +
                                           (c.unavailable.empty() ? ")" : ": " + c.unavailable + ")"));
  }

  // The engine's devices of this instance, loading the engine and making them
  // on the first call (after check_index, so the count is known).
  EngineDevices* start() {
    if (EngineDevices* e = devices_.load(std::memory_order_acquire)) [[likely]]
      return e;
    return start_slow();
  }
  [[gnu::cold]] EngineDevices* start_slow() {
    std::lock_guard<std::mutex> lock(start_mutex_);
    if (EngineDevices* e = devices_.load(std::memory_order_relaxed)) return e;
    EngineDevices* e = nullptr;
    rethrow(engine().create(&options_, probe().count, &e));
    devices_.store(e, std::memory_order_release);
    return e;
  }

  // A live buffer came from the engine's devices, so before they exist no
  // handle is live (and nothing is loaded to say so).
  EngineDevices* for_buffer(bp_buffer* handle, const char* what) {
    EngineDevices* e = devices_.load(std::memory_order_acquire);
    if (e == nullptr || handle == nullptr) [[unlikely]]
      fail(BP_STATUS_INVALID_ARGUMENT,
           std::string("cuda: ") + what + ": not a live cuda buffer (NULL, freed, or another backend's)");
    return e;
  }

  // Likewise for communicators, which comm_create made in the engine.
  const EngineApi& engine_for_comm(bp_comm* comm, const char* what) {
    const EngineApi* api = loaded_engine.load(std::memory_order_acquire);
    if (api == nullptr || comm == nullptr) [[unlikely]]
      fail(BP_STATUS_INVALID_ARGUMENT,
           std::string("cuda: ") + what +
               ": not a live cuda communicator (NULL, destroyed, or another backend's)");
    return *api;
  }

  const Options options_;
  std::once_flag probe_once_;
  DeviceCount count_;
  std::mutex start_mutex_;
  std::atomic<EngineDevices*> devices_{nullptr};
};

}  // namespace
}  // namespace backplane::cuda

// BACKPLANE_VERSION comes from project() in the top-level CMakeLists.txt.
BP_DEFINE_PLUGIN(backplane::cuda::CudaPlugin, "cuda_nccl", BACKPLANE_VERSION)
