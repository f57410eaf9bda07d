// The cuda plugin's engine library (engine.hpp): one plugin instance's
// devices and the ABI entries that use them (buffers, DLPack, execute,
// synchronize, collectives), with the queue discipline: each call takes its
// device's queue mutex, so calls take effect in the order they enter. Ops are
// in ops.cpp / matmul.cpp, collectives in collectives.cpp.
#include "engine.hpp"

#include <backplane/plugin.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives.hpp"
#include "device.hpp"
#include "ops.hpp"

namespace backplane::cuda {

using plugin::fail;

struct EngineDevices {
  EngineDevices(const Options& options, int32_t count) : options_(options) {
    for (int32_t i = 0; i < count; ++i) devices_.push_back(std::make_unique<Device>(i, options_));
  }
  ~EngineDevices() = default;  // devices synchronise and release their streams

  // Free/total from the runtime once a context exists; false before (the
  // front then asks NVML, since making a context here would cost the GPU
  // memory of one).
  bool device_memory(int32_t device, plugin::MemoryInfo& memory) {
    Device& d = at(device);
    std::lock_guard<std::mutex> lock(d.queue);
    if (!d.started()) return false;
    d.enter();
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    d.check(cudaMemGetInfo(&free_bytes, &total_bytes), "device_memory");
    memory = {free_bytes, total_bytes};
    return true;
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

 private:
  Device& at(int32_t device) {
    if (device < 0 || static_cast<size_t>(device) >= devices_.size()) [[unlikely]]
      fail(BP_STATUS_INVALID_ARGUMENT, "cuda: no device " + std::to_string(device) +
                                           " (the cuda backend has " + std::to_string(devices_.size()) +
                                           " device" + (devices_.size() == 1 ? ")" : "s)"));
    return *devices_[static_cast<size_t>(device)];
  }

  const Options options_;
  std::vector<std::unique_ptr<Device>> devices_;
};

namespace {

// A collective on the communicator's device, under that device's queue.
template <class Fn>
bp_status* collective(bp_comm* comm, const char* op, Fn&& fn) {
  return plugin::guard([&] {
    Communicator& c = Communicator::from_handle(comm, op);
    Device& d = c.device();
    std::lock_guard<std::mutex> lock(d.queue);
    d.enter();
    d.set_last_op(op);
    fn(c);
  });
}

bp_status* create(const Options* options, int32_t count, EngineDevices** devices) {
  return plugin::guard([&] { *devices = new EngineDevices(*options, count); });
}
void destroy(EngineDevices* devices) { delete devices; }
bp_status* device_memory(EngineDevices* e, int32_t device, plugin::MemoryInfo* memory, bool* answered) {
  return plugin::guard([&] { *answered = e->device_memory(device, *memory); });
}
bp_status* buffer_alloc(EngineDevices* e, int32_t device, uint64_t size, bp_buffer** buffer) {
  return plugin::guard([&] { *buffer = e->buffer_alloc(device, size); });
}
bp_status* buffer_free(EngineDevices* e, bp_buffer* buffer) {
  return plugin::guard([&] { e->buffer_free(buffer); });
}
bp_status* buffer_write(EngineDevices* e, bp_buffer* buffer, uint64_t offset, const void* src,
                        uint64_t size) {
  return plugin::guard([&] { e->buffer_write(buffer, offset, src, size); });
}
bp_status* buffer_read(EngineDevices* e, bp_buffer* buffer, uint64_t offset, void* dst, uint64_t size) {
  return plugin::guard([&] { e->buffer_read(buffer, offset, dst, size); });
}
bp_status* buffer_pointer(EngineDevices* e, bp_buffer* buffer, plugin::BufferPointer* pointer) {
  return plugin::guard([&] { *pointer = e->buffer_pointer(buffer); });
}
bp_status* buffer_import(EngineDevices* e, const bp_buffer_import_args* args, bp_buffer** buffer) {
  return plugin::guard([&] { *buffer = e->buffer_import(*args); });
}
bp_status* execute(EngineDevices* e, const bp_execute_args* args) {
  return plugin::guard([&] { e->execute(*args); });
}
bp_status* synchronize(EngineDevices* e, int32_t device) {
  return plugin::guard([&] { e->synchronize(device); });
}
bp_status* comm_create(EngineDevices* e, const bp_comm_create_args* args, bp_comm** comm) {
  return plugin::guard([&] { *comm = e->comm_create(*args); });
}
bp_status* comm_destroy(bp_comm* comm) {
  return plugin::guard([&] { delete &Communicator::from_handle(comm, "comm_destroy"); });
}
bp_status* comm_abort(bp_comm* comm) {
  return plugin::guard(
      [&] { Communicator::from_handle(comm, "comm_abort").abort("aborted by the host (comm_abort)"); });
}
bp_status* all_reduce(bp_comm* comm, const bp_tensor* in, const bp_tensor* out, int32_t op) {
  return collective(comm, "all_reduce", [&](Communicator& c) { c.all_reduce(*in, *out, op); });
}
bp_status* broadcast(bp_comm* comm, const bp_tensor* tensor, int32_t root) {
  return collective(comm, "broadcast", [&](Communicator& c) { c.broadcast(*tensor, root); });
}
bp_status* all_gather(bp_comm* comm, const bp_tensor* in, const bp_tensor* out) {
  return collective(comm, "all_gather", [&](Communicator& c) { c.all_gather(*in, *out); });
}
bp_status* reduce_scatter(bp_comm* comm, const bp_tensor* in, const bp_tensor* out, int32_t op) {
  return collective(comm, "reduce_scatter", [&](Communicator& c) { c.reduce_scatter(*in, *out, op); });
}
bp_status* barrier(bp_comm* comm) {
  return collective(comm, "barrier", [&](Communicator& c) { c.barrier(); });
}

constexpr EngineApi kApi = {kEngineMagic,   sizeof(EngineApi), &create,       &destroy,     &device_memory,
                            &buffer_alloc,  &buffer_free,      &buffer_write, &buffer_read, &buffer_pointer,
                            &buffer_import, &execute,          &synchronize,  &comm_create, &comm_destroy,
                            &comm_abort,    &all_reduce,       &broadcast,    &all_gather,  &reduce_scatter,
                            &barrier};

}  // namespace
}  // namespace backplane::cuda

extern "C" __attribute__((visibility("default"))) const backplane::cuda::EngineApi* bp_cuda_engine_entry(
    const bp_host_api* host) {
  backplane::plugin::host_api().store(host, std::memory_order_release);
  return &backplane::cuda::kApi;
}
