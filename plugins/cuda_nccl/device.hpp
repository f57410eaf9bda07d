// One GPU of the cuda plugin: its in-order queue (a mutex every call on the
// device takes, so calls take effect in the order they enter), the compute and
// communication streams, the stream-ordered memory pool, cuBLAS, the pinned
// staging buffers, the mapped error slot kernels report data errors in, and
// the sticky error a failed asynchronous op leaves for the next synchronising
// call. Part of the engine library (engine.hpp); nothing here touches the
// driver before the device's first use (start()). Probing without a context
// is the front library's (driver.hpp).
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_DEVICE_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_DEVICE_HPP_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <backplane/plugin.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "host/layout.hpp"
#include "host/options.hpp"
#include "kernels.hpp"

namespace backplane::cuda {

// A buffer of this plugin. The host only ever holds the pointer to it.
struct Buffer {
  uint64_t magic = 0;
  void* data = nullptr;  // device memory (NULL when size is 0)
  uint64_t size = 0;
  int32_t device = 0;
  // DLPack import: the producer's memory, handed back through release.
  bool imported = false;
  void (*release)(void*) = nullptr;
  void* release_ctx = nullptr;
  // A collective queued on the communication stream reads or writes this
  // buffer: compute work touching it must wait for comm_done first. Both under
  // the device's queue mutex.
  cudaEvent_t comm_done = nullptr;
  bool comm_pending = false;
};

inline constexpr uint64_t kBufferLiveMagic = 0x6375646162756621ULL;  // arbitrary, non-zero
inline constexpr uint64_t kBufferDeadMagic = 0x6375646164656164ULL;

// The buffer behind a handle, or INVALID_ARGUMENT naming `what` for a handle
// that is NULL, freed or another backend's.
Buffer& live_buffer(bp_buffer* handle, const char* what);
inline bp_buffer* handle_of(Buffer* b) noexcept { return reinterpret_cast<bp_buffer*>(b); }

class Device {
 public:
  Device(int32_t ordinal, const Options& options) : ordinal_(ordinal), options_(options) {}
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int32_t ordinal() const noexcept { return ordinal_; }
  const Options& options() const noexcept { return options_; }

  // Every call on the device holds this while it enqueues (abi.h: one in-order queue).
  std::mutex queue;

  // Under `queue`: makes this thread's current device ours and, on the first
  // call, creates the streams, cuBLAS, the pool settings and the error slot.
  // Fails with BP_STATUS_DEVICE once the device is dead.
  void enter();
  bool started() const noexcept { return started_; }

  cudaStream_t compute() const noexcept { return compute_; }
  cudaStream_t comm() const noexcept { return comm_; }
  cublasHandle_t blas();  // created on first use
  KernelContext kernels(int32_t op) const noexcept { return {compute_, sm_count_, slot_, op}; }

  // Throws the failure of a CUDA call made for `what`: OUT_OF_MEMORY,
  // DEVICE (and the device is dead from now on) for a fault that poisons the
  // context, else INTERNAL. Also checks the launch error of a kernel.
  void check(cudaError_t error, const std::string& what);
  void check_launch(const std::string& what) { check(cudaGetLastError(), what); }

  // Stream-ordered device memory on the compute stream (the pool keeps freed
  // blocks, so per-op scratch is cheap).
  void* allocate(uint64_t size, const std::string& what);
  void free_async(void* data) noexcept;

  // Makes the compute stream wait for collectives still using `b`.
  void order_after_comm(Buffer& b);

  // Under `queue`: waits for both streams, then reports (and clears) what
  // failed meanwhile: a data error a kernel found (INVALID_ARGUMENT naming its
  // op) or a collective's failure (TIMEOUT / COLLECTIVE).
  void synchronize(const std::string& what);

  // Host <-> device copies on the compute stream; large ones through the pinned
  // staging buffers. write returns once src is consumed; read is synchronising.
  void write(Buffer& b, uint64_t offset, const void* src, uint64_t size);
  void read(Buffer& b, uint64_t offset, void* dst, uint64_t size);

  // Any thread: a failure of asynchronous work for the next synchronising call
  // (the first one stays until it is reported).
  void set_sticky(bp_status_code code, const std::string& message) noexcept;

  // The op that ran last, named in asynchronous fault messages.
  void set_last_op(const char* op) noexcept { last_op_ = op; }

 private:
  void start();
  void check_dead() const;
  void report_pending_errors();
  void ensure_staging();

  const int32_t ordinal_;
  const Options options_;
  bool started_ = false;
  cudaStream_t compute_ = nullptr;
  cudaStream_t comm_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  ErrorSlot* slot_ = nullptr;       // mapped pinned host memory: the kernels' address
  ErrorSlot* slot_host_ = nullptr;  // the same memory: the host's address
  int sm_count_ = 1;
  const char* last_op_ = "no op yet";
  // Pinned staging: two halves, each with the event of its last copy.
  unsigned char* staging_[2] = {nullptr, nullptr};
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
  uint64_t staging_half_ = 0;

  mutable std::mutex sticky_mutex_;
  std::optional<plugin::Failure> sticky_;
  std::atomic<bool> dead_{false};
  std::string dead_reason_;  // under sticky_mutex_
};

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_DEVICE_HPP_
