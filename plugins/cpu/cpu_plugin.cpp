// The cpu backend plugin (libbackplane_cpu): one host device whose buffers are
// host memory, OpenMP kernels, OpenBLAS gemm and Gloo collectives. This file is
// the ABI face: options, the device, buffers; ops and collectives run in the
// engine library (engine.hpp), loaded on the device's first use. Every op runs
// synchronously, so the device does not declare BP_CAP_ASYNC.
#include <backplane/plugin.hpp>
#include <backplane_common/memory_room.hpp>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "device.hpp"
#include "engine.hpp"
#include "fp_mode.hpp"
#include "host_buffer.hpp"
#include "op_dtypes.hpp"
#include "options.hpp"

namespace backplane::cpu {
namespace {

using plugin::fail;

// Copies below this size run inline; larger ones go to the engine's threaded copy.
constexpr uint64_t kInlineCopyBytes = uint64_t{1} << 20;

[[noreturn, gnu::cold]] void no_device(int32_t device) {
  fail(BP_STATUS_INVALID_ARGUMENT,
       "cpu: no device " + std::to_string(device) + " (the cpu backend has 1 device)");
}

inline void check_device(int32_t device) {
  if (device != 0) [[unlikely]]
    no_device(device);
}

// Immutable after construction, so every entry may run concurrently.
class CpuPlugin {
 public:
  using Features = plugin::Features<plugin::Feature::buffer_pointer, plugin::Feature::buffer_import,
                                    plugin::Feature::device_memory, plugin::Feature::collectives>;

  explicit CpuPlugin(const plugin::CreateArgs& args) {
    Options options = parse_options(args.options_json);
    threads_ = options.threads > 0 ? static_cast<int>(options.threads) : default_thread_count();
#ifndef BACKPLANE_CPU_HAVE_OPENMP
    threads_ = 1;  // built without OpenMP (the TSan build): kernels run on the calling thread
#endif
    collective_ = options.collective;
    ops_ = options.ops;
    dtypes_ = options.dtypes;
    narrowed_ = !ops_.all() || dtypes_ != HeldDTypes::capabilities();
    network_ = std::move(options.network);
    fp_mode_ = options.flush_denormals ? kFlushDenormalBits : 0u;
    special_ = narrowed_ || fp_mode_ != 0;
  }

  int32_t device_count() { return 1; }

  plugin::DeviceInfo device_info(int32_t device) {
    check_device(device);
    return probe_device(threads_, collective_, network_.shared_memory, ops_, dtypes_, fp_mode_ != 0);
  }

  bool supports_op(int32_t device, int32_t op, int32_t dtype) {
    // op_supports first: it answers false to unknown values, so op and dtype index safely below.
    return device == 0 && op_supports(op, dtype) && ops_.test(op) && (dtypes_ & BP_CAP_DTYPE(dtype)) != 0;
  }

  plugin::MemoryInfo device_memory(int32_t device) {
    check_device(device);
    return host_memory();
  }

  bp_buffer* buffer_alloc(int32_t device, uint64_t size) {
    check_device(device);
    engine();  // the device's first use starts the kernels (and their threads)
    // A large block comes from the block cache, or is admitted against the
    // room the process has left (BlockCache, host_buffer.hpp).
    bool refused = false;
    bp_buffer* buffer = allocate_buffer(size, refused);
    if (buffer == nullptr) [[unlikely]]
      no_memory(size, refused);
    return buffer;
  }

  [[noreturn, gnu::cold]] static void no_memory(uint64_t size, bool refused) {
    const std::string what =
        "cpu: cannot allocate " + common::byte_size_text(size) + " (" + std::to_string(size) + " bytes)";
    if (!refused) fail(BP_STATUS_OUT_OF_MEMORY, what + " of host memory");
    const common::MemoryRoom room = common::memory_room();
    fail(BP_STATUS_OUT_OF_MEMORY,
         what + ": this process may take only " + room.describe() + " more before the kernel kills it, and " +
             common::byte_size_text(BlockCache::kReserve) +
             " of that stays free for the rest of the process (freed blocks the cpu backend kept for reuse "
             "were released first); free tensors, use a smaller size, or raise the memory limit");
  }

  void buffer_free(bp_buffer* buffer) {
    if (buffer == nullptr) return;
    if (!is_live(buffer)) [[unlikely]]  // leaking beats corrupting the heap on a double free
      not_live_free();
    free_buffer(buffer);
  }
  [[noreturn, gnu::cold, gnu::noinline]] static void not_live_free() {
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: buffer_free: not a live cpu buffer (freed twice?); ignored");
  }

  void buffer_write(bp_buffer* buffer, uint64_t offset, const void* src, uint64_t size) {
    copy(buffer_data(live(buffer, "buffer_write")) + offset, src, size);
  }

  void buffer_read(bp_buffer* buffer, uint64_t offset, void* dst, uint64_t size) {
    copy(dst, buffer_data(live(buffer, "buffer_read")) + offset, size);
  }

  plugin::BufferPointer buffer_pointer(bp_buffer* buffer) {
    return {buffer_data(live(buffer, "buffer_pointer")), BP_DL_CPU, 0};
  }

  // DLPack import: adopts host memory without copying. Only the buffer built
  // last owns `release` (free_buffer calls it exactly once); on any failure
  // release is never called and the host keeps the memory.
  bp_buffer* buffer_import(const bp_buffer_import_args& a) {
    check_device(a.device);
    if ((a.dl_device_type != BP_DL_CPU && a.dl_device_type != BP_DL_CUDA_HOST) ||
        (a.data == nullptr && a.size > 0)) [[unlikely]]
      bad_import(a);
    bp_buffer* buffer = wrap_buffer(a.data, a.size, a.release, a.release_ctx);
    if (buffer == nullptr) [[unlikely]]
      fail(BP_STATUS_OUT_OF_MEMORY, "cpu: buffer_import: cannot allocate a buffer header");
    return buffer;
  }
  // Placement imports on every op that falls back to this backend: the
  // messages are built only here.
  [[noreturn, gnu::cold, gnu::noinline]] static void bad_import(const bp_buffer_import_args& a) {
    if (a.dl_device_type != BP_DL_CPU && a.dl_device_type != BP_DL_CUDA_HOST)
      fail(BP_STATUS_UNSUPPORTED,
           "cpu: buffer_import: DLPack device type " + std::to_string(a.dl_device_type) +
               " is not host memory; the cpu backend imports kDLCPU (1) and kDLCUDAHost (3) "
               "only: copy the tensor to host memory first");
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: buffer_import: data is NULL but size is " + std::to_string(a.size) + " bytes");
  }

  // engine() loads the kernels (with OpenBLAS's threads) in the host's mode
  // at the first use.
  void execute(const bp_execute_args& args) {
    if (special_) [[unlikely]]
      return execute_special(args);
    rethrow(engine().execute(&args, threads_));
  }

  // Collectives: forwarded to the Communicator (collectives.hpp) inside the engine.
  bp_comm* comm_create(const bp_comm_create_args& args) {
    if (!collective_)
      fail(BP_STATUS_UNSUPPORTED,
           "cpu: comm_create: collectives are switched off by the cpu option \"collective\": false");
    bp_comm* comm = nullptr;
    rethrow(engine().comm_create(&args, &network_, &comm));
    return comm;
  }
  void comm_destroy(bp_comm* comm) { rethrow(engine().comm_destroy(comm)); }
  void comm_abort(bp_comm* comm) { rethrow(engine().comm_abort(comm)); }
  void all_reduce(bp_comm* comm, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op) {
    rethrow(engine().all_reduce(comm, &in, &out, op));
  }
  void broadcast(bp_comm* comm, const bp_tensor& tensor, int32_t root) {
    rethrow(engine().broadcast(comm, &tensor, root));
  }
  void all_gather(bp_comm* comm, const bp_tensor& in, const bp_tensor& out) {
    rethrow(engine().all_gather(comm, &in, &out));
  }
  void reduce_scatter(bp_comm* comm, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op) {
    rethrow(engine().reduce_scatter(comm, &in, &out, op));
  }
  void barrier(bp_comm* comm) { rethrow(engine().barrier(comm)); }

 private:
  // The host passes only live handles of this plugin; the magic check turns a
  // stale one (a use after free) into a status instead of a wild write.
  static bp_buffer* live(bp_buffer* buffer, const char* what) {
    if (!is_live(buffer)) [[unlikely]]
      fail(BP_STATUS_INVALID_ARGUMENT,
           std::string("cpu: ") + what + ": not a live cpu buffer (NULL, freed, or another backend's)");
    return buffer;
  }

  // execute on a device narrowed by "ops" / "dtypes" or that flushes
  // subnormals: one test on the path of every op of a default device.
  [[gnu::noinline]] void execute_special(const bp_execute_args& args) {
    if (narrowed_) check_claimed(args);
    const EngineApi& kernels = engine();
    std::optional<FpModeScope> fp;  // only with "flush_denormals": else the host's mode stands
    if (fp_mode_ != 0) fp.emplace(fp_mode_);
    rethrow(kernels.execute(&args, threads_));
  }

  // The host sends only what the device claims (abi.h, "Trust contract"), and the
  // kernels would run the rest correctly. But a device narrowed by "ops" / "dtypes"
  // stands for a backend that cannot: refusing here makes a host that sends an
  // unclaimed op fail the test that models it instead of passing unnoticed.
  void check_claimed(const bp_execute_args& args) const {
    if (args.op <= 0 || args.op >= BP_OP_COUNT_ || !ops_.test(args.op))
      fail(BP_STATUS_UNSUPPORTED, "cpu: " + plugin::op_name(args.op) +
                                      " is left out by the cpu option \"ops\" (supports_op refuses it)");
    const auto check = [&](const bp_tensor* tensors, int32_t count) {
      for (int32_t i = 0; i < count; ++i) {
        const int32_t d = tensors[i].dtype;
        if (d <= 0 || d >= BP_DTYPE_COUNT_ || (dtypes_ & BP_CAP_DTYPE(d)) == 0)
          fail(BP_STATUS_UNSUPPORTED,
               "cpu: " + plugin::op_name(args.op) + ": dtype " + plugin::dtype_name(d) +
                   " is left out by the cpu option \"dtypes\" (the device lacks its flag)");
      }
    };
    check(args.inputs, args.num_inputs);
    check(args.outputs, args.num_outputs);
  }

  // Offsets and sizes are host-checked against the buffer (abi.h, "Trust contract").
  void copy(void* dst, const void* src, uint64_t size) const {
    if (size == 0) return;
    if (size < kInlineCopyBytes) {
      std::memcpy(dst, src, static_cast<size_t>(size));
      return;
    }
    rethrow(engine().copy(dst, src, size, threads_));
  }

  int threads_ = 1;         // team size for large ops (>= 1)
  bool collective_ = true;  // option "collective": declare BP_CAP_COLLECTIVE
  OpSet ops_;               // option "ops": the ops supports_op may accept
  uint64_t dtypes_ = 0;     // option "dtypes": the dtype flags the device declares
  bool narrowed_ = false;   // "ops" or "dtypes" narrows the device: execute checks what it is sent
  NetworkOptions network_;  // where collectives listen (options "hostname" / "interface")
  unsigned fp_mode_ = 0;    // option "flush_denormals": the MXCSR bits ops run with (fp_mode.hpp)
  bool special_ = false;    // narrowed_ or fp_mode_: execute goes through execute_special
};

}  // namespace
}  // namespace backplane::cpu

// BACKPLANE_VERSION comes from project() in the top-level CMakeLists.txt.
BP_DEFINE_PLUGIN(backplane::cpu::CpuPlugin, "cpu", BACKPLANE_VERSION)
