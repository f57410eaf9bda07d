// The cuda backend plugin (libbackplane_cuda_nccl): one device per GPU,
// asynchronous (BP_CAP_ASYNC): ops, copies and collectives are queued on the
// device's streams and errors surface at the next synchronising call
// (buffer_read, synchronize, buffer_pointer). This file is the ABI face:
// options, devices, buffers, DLPack, and the queue discipline (each call
// takes its device's queue mutex, so calls take effect in the order they
// enter). Ops are in ops.cpp / matmul.cpp, collectives in collectives.cpp.
//
// create and device_count never make a CUDA context: create parses options;
// device_count asks cudaGetDeviceCount (which makes none) and reports
// BP_STATUS_UNAVAILABLE with the reason on a machine without a driver or GPU;
// device_info reads properties (no context). The context, streams, pool and
// cuBLAS start on a device's first use (buffer_alloc, execute, comm_create).
#include <backplane/plugin.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives.hpp"
#include "device.hpp"
#include "host/options.hpp"
#include "ops.hpp"

namespace backplane::cuda {
namespace {

using plugin::fail;

class CudaPlugin {
 public:
  using Features = plugin::Features<plugin::Feature::buffer_pointer, plugin::Feature::buffer_import,
                                    plugin::Feature::device_memory, plugin::Feature::synchronize,
                                    plugin::Feature::collectives>;

  explicit CudaPlugin(const plugin::CreateArgs& args) : options_(parse_options(args.options_json)) {}

  ~CudaPlugin() = default;  // devices synchronise and release their streams

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
    Device& d = at(device);
    {
      std::lock_guard<std::mutex> lock(d.queue);
      if (d.started()) {  // a context exists: ask the runtime
        d.enter();
        size_t free_bytes = 0;
        size_t total_bytes = 0;
        d.check(cudaMemGetInfo(&free_bytes, &total_bytes), "device_memory");
        return {free_bytes, total_bytes};
      }
    }
    // No context yet, and listing devices must not make one: ask NVML.
    std::string why;
    if (auto m = memory_without_context(device, why)) return *m;
    fail(BP_STATUS_UNAVAILABLE, "cuda: device_memory of cuda:" + std::to_string(device) +
                                    " before its first use needs NVML: " + why);
  }

  bp_buffer* buffer_alloc(int32_t device, uint64_t size) {
    Device& d = at(device);
    std::lock_guard<std::mutex> lock(d.queue);
    d.enter();
    auto b = std::make_unique<Buffer>();
    b->device = device;
    b->size = size;
    b->data = d.allocate(size, "buffer_alloc");
    b->magic = kBufferLiveMagic;
    return handle_of(b.release());
  }

  void buffer_free(bp_buffer* handle) {
    if (handle == nullptr) return;
    Buffer& b = live_buffer(handle, "buffer_free");
    Device& d = at(b.device);
    std::lock_guard<std::mutex> lock(d.queue);
    b.magic = kBufferDeadMagic;
    std::unique_ptr<Buffer> owned(&b);
    d.enter();
    d.order_after_comm(b);  // a collective may still use it
    if (b.imported) {
      // The producer's memory: hand it back once queued work no longer reads it.
      d.check(cudaStreamSynchronize(d.compute()), "buffer_free of an imported buffer");
      if (b.release != nullptr) b.release(b.release_ctx);
    } else {
      d.free_async(b.data);  // stream-ordered: reused only after queued work
    }
    if (b.comm_done != nullptr) cudaEventDestroy(b.comm_done);
  }

  void buffer_write(bp_buffer* handle, uint64_t offset, const void* src, uint64_t size) {
    Buffer& b = live_buffer(handle, "buffer_write");
    Device& d = at(b.device);
    std::lock_guard<std::mutex> lock(d.queue);
    d.enter();
    d.set_last_op("buffer_write");
    d.write(b, offset, src, size);
  }

  void buffer_read(bp_buffer* handle, uint64_t offset, void* dst, uint64_t size) {
    Buffer& b = live_buffer(handle, "buffer_read");
    Device& d = at(b.device);
    std::lock_guard<std::mutex> lock(d.queue);
    d.enter();
    d.read(b, offset, dst, size);
  }

  // DLPack export: synchronising, so the consumer sees every queued write.
  plugin::BufferPointer buffer_pointer(bp_buffer* handle) {
    Buffer& b = live_buffer(handle, "buffer_pointer");
    Device& d = at(b.device);
    std::lock_guard<std::mutex> lock(d.queue);
    d.enter();
    d.order_after_comm(b);
    d.synchronize("buffer_pointer");
    return {b.data, BP_DL_CUDA, b.device};
  }

  // DLPack import of device memory on this device (kDLCUDA), without a copy.
  // Only the buffer built last owns `release`; on a throw the host keeps it.
  bp_buffer* buffer_import(const bp_buffer_import_args& a) {
    Device& d = at(a.device);
    if (a.dl_device_type != BP_DL_CUDA)
      fail(BP_STATUS_UNSUPPORTED,
           "cuda: buffer_import: DLPack device type " + std::to_string(a.dl_device_type) +
               " is not CUDA device memory; the cuda backend imports kDLCUDA (2) only: "
               "host memory is copied in with to()");
    if (a.dl_device_id != a.device)
      fail(BP_STATUS_UNSUPPORTED,
           "cuda: buffer_import: the memory is on CUDA device " + std::to_string(a.dl_device_id) +
               ", not cuda:" + std::to_string(a.device) + "; import it on its own device");
    if (a.data == nullptr && a.size > 0)
      fail(BP_STATUS_INVALID_ARGUMENT,
           "cuda: buffer_import: data is NULL but size is " + std::to_string(a.size));
    std::lock_guard<std::mutex> lock(d.queue);
    d.enter();
    if (a.size > 0) {
      cudaPointerAttributes attr{};
      const cudaError_t e = cudaPointerGetAttributes(&attr, a.data);
      if (e != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
          attr.device != a.device) {
        cudaGetLastError();
        fail(BP_STATUS_UNSUPPORTED,
             "cuda: buffer_import: the pointer is not device memory of cuda:" + std::to_string(a.device) +
                 " (the CUDA runtime says type " + std::to_string(static_cast<int>(attr.type)) + ", device " +
                 std::to_string(attr.device) + ")");
      }
    }
    auto b = std::make_unique<Buffer>();
    b->device = a.device;
    b->size = a.size;
    b->data = a.data;
    b->imported = true;
    b->release = a.release;
    b->release_ctx = a.release_ctx;
    b->magic = kBufferLiveMagic;
    return handle_of(b.release());
  }

  void execute(const bp_execute_args& args) {
    Device& d = at(args.device);
    std::lock_guard<std::mutex> lock(d.queue);
    d.enter();
    d.set_last_op(bp_op_name(args.op) != nullptr ? bp_op_name(args.op) : "an unknown op");
    run_op(OpCall{d, args});
  }

  void synchronize(int32_t device) {
    Device& d = at(device);
    std::lock_guard<std::mutex> lock(d.queue);
    if (!d.started()) return;  // nothing ever ran: nothing to wait for
    d.enter();
    d.synchronize("synchronize");
  }

  bp_comm* comm_create(const bp_comm_create_args& args) {
    if (!options_.collective)
      fail(BP_STATUS_UNSUPPORTED,
           "cuda: comm_create: collectives are switched off by the cuda option \"collective\": false");
    Device& d = at(args.device);
    {
      // The device starts under its queue; the join itself (which blocks
      // until every rank arrives) does not hold it.
      std::lock_guard<std::mutex> lock(d.queue);
      d.enter();
    }
    cudaSetDevice(args.device);
    return Communicator::create(d, args).release()->handle();
  }
  void comm_destroy(bp_comm* comm) {
    Communicator& c = Communicator::from_handle(comm, "comm_destroy");
    delete &c;
  }
  void comm_abort(bp_comm* comm) {
    Communicator::from_handle(comm, "comm_abort").abort("aborted by the host (comm_abort)");
  }
  void all_reduce(bp_comm* comm, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op) {
    collective(comm, "all_reduce", in.device, [&](Communicator& c) { c.all_reduce(in, out, op); });
  }
  void broadcast(bp_comm* comm, const bp_tensor& tensor, int32_t root) {
    collective(comm, "broadcast", tensor.device, [&](Communicator& c) { c.broadcast(tensor, root); });
  }
  void all_gather(bp_comm* comm, const bp_tensor& in, const bp_tensor& out) {
    collective(comm, "all_gather", in.device, [&](Communicator& c) { c.all_gather(in, out); });
  }
  void reduce_scatter(bp_comm* comm, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op) {
    collective(comm, "reduce_scatter", in.device, [&](Communicator& c) { c.reduce_scatter(in, out, op); });
  }
  void barrier(bp_comm* comm) {
    Communicator& c = Communicator::from_handle(comm, "barrier");
    collective(comm, "barrier", -1, [&](Communicator&) { c.barrier(); });
  }

 private:
  const DeviceCount& probe() {
    std::call_once(probe_once_, [&] {
      count_ = probe_device_count();
      for (int32_t i = 0; i < count_.count; ++i) devices_.push_back(std::make_unique<Device>(i, options_));
    });
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

  Device& at(int32_t device) {
    check_index(device);
    return *devices_[static_cast<size_t>(device)];
  }

  // A collective on the communicator's device, under that device's queue.
  template <class Fn>
  void collective(bp_comm* comm, const char* op, int32_t tensor_device, Fn&& fn) {
    Communicator& c = Communicator::from_handle(comm, op);
    (void)tensor_device;
    Device& d = c.device();
    std::lock_guard<std::mutex> lock(d.queue);
    d.enter();
    d.set_last_op(op);
    fn(c);
  }

  const Options options_;
  std::once_flag probe_once_;
  DeviceCount count_;
  std::vector<std::unique_ptr<Device>> devices_;
};

}  // namespace
}  // namespace backplane::cuda

// BACKPLANE_VERSION comes from project() in the top-level CMakeLists.txt.
BP_DEFINE_PLUGIN(backplane::cuda::CudaPlugin, "cuda_nccl", BACKPLANE_VERSION)
