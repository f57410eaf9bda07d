// One GPU of the cuda plugin (device.hpp).
#include "device.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace backplane::cuda {
namespace {

using plugin::fail;

// Transfers below this go straight through cudaMemcpyAsync; larger ones are
// double-buffered through pinned staging.
constexpr uint64_t kStagingMinBytes = uint64_t{1} << 20;

std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e) + " (error " +
         std::to_string(static_cast<int>(e)) + ")";
}

// Errors after which the CUDA context cannot run anything again.
bool poisons_context(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

}  // namespace

Buffer& live_buffer(bp_buffer* handle, const char* what) {
  auto* b = reinterpret_cast<Buffer*>(handle);
  if (b == nullptr || b->magic != kBufferLiveMagic) [[unlikely]]
    fail(BP_STATUS_INVALID_ARGUMENT,
         std::string("cuda: ") + what + ": not a live cuda buffer (NULL, freed, or another backend's)");
  return *b;
}

// ---------------------------------------------------------------------------

Device::~Device() {
  if (!started_) return;
  // The host freed every buffer and communicator first (abi.h); what is left
  // is ours. Errors here have no one to report to.
  cudaSetDevice(ordinal_);
  cudaStreamSynchronize(comm_);
  cudaStreamSynchronize(compute_);
  for (int k = 0; k < 2; ++k) {
    if (staging_done_[k] != nullptr) cudaEventDestroy(staging_done_[k]);
    if (staging_[k] != nullptr) cudaFreeHost(staging_[k]);
  }
  if (blas_ != nullptr) cublasDestroy(blas_);
  if (slot_host_ != nullptr) cudaFreeHost(slot_host_);
  cudaStreamDestroy(comm_);
  cudaStreamDestroy(compute_);
}

void Device::check_dead() const {
  if (dead_.load(std::memory_order_acquire)) [[unlikely]] {
    std::lock_guard<std::mutex> lock(sticky_mutex_);
    fail(BP_STATUS_DEVICE, "cuda:" + std::to_string(ordinal_) + " can no longer run work: " + dead_reason_ +
                               "; restart the process");
  }
}

void Device::enter() {
  check_dead();
  check(cudaSetDevice(ordinal_), "cudaSetDevice");
  if (!started_) [[unlikely]]
    start();
}

void Device::start() {
  // The first use: this is where the context is made (cudaSetDevice above
  // binds the primary context; the first real call creates it).
  check(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, ordinal_), "device attributes");
  check(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "creating the compute stream");
  check(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking), "creating the communication stream");
  void* slot = nullptr;
  check(cudaHostAlloc(&slot, sizeof(ErrorSlot), cudaHostAllocMapped), "allocating the error slot");
  std::memset(slot, 0, sizeof(ErrorSlot));
  slot_host_ = static_cast<ErrorSlot*>(slot);
  // The slot's device address (the same as the host's under unified addressing).
  void* device_slot = nullptr;
  check(cudaHostGetDevicePointer(&device_slot, slot, 0), "mapping the error slot");
  slot_ = static_cast<ErrorSlot*>(device_slot);
  // The pool keeps what is freed (or up to pool_keep_mib) instead of returning
  // it to the driver at every synchronisation.
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, ordinal_), "cudaDeviceGetDefaultMemPool");
  uint64_t keep = options_.pool_keep_mib < 0 ? std::numeric_limits<uint64_t>::max()
                                             : static_cast<uint64_t>(options_.pool_keep_mib) << 20;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "configuring the memory pool");
  started_ = true;
}

cublasHandle_t Device::blas() {
  if (blas_ == nullptr) {
    cublasHandle_t h = nullptr;
    const cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS)
      fail(s == CUBLAS_STATUS_ALLOC_FAILED ? BP_STATUS_OUT_OF_MEMORY : BP_STATUS_INTERNAL,
           std::string("cuda: cublasCreate failed: ") + cublasGetStatusString(s));
    cublasSetStream(h, compute_);
    // Results must not depend on the run: no atomics-based reductions in cuBLAS.
    cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED);
    blas_ = h;
  }
  return blas_;
}

void Device::check(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) [[likely]]
    return;
  cudaGetLastError();  // clear the (non-sticky) last error so the next call starts clean
  const std::string text = cuda_error_text(error);
  if (error == cudaErrorMemoryAllocation)
    fail(BP_STATUS_OUT_OF_MEMORY, "cuda:" + std::to_string(ordinal_) + ": " + what +
                                      ": out of device memory (" + text +
                                      "); free tensors or use smaller batches");
  if (poisons_context(error)) {
    {
      std::lock_guard<std::mutex> lock(sticky_mutex_);
      if (!dead_.load()) dead_reason_ = text + ", found at " + what + " after op " + last_op_;
    }
    dead_.store(true, std::memory_order_release);
    check_dead();
  }
  fail(BP_STATUS_INTERNAL, "cuda:" + std::to_string(ordinal_) + ": " + what + ": " + text);
}

void* Device::allocate(uint64_t size, const std::string& what) {
  if (size == 0) return nullptr;
  void* p = nullptr;
  check(cudaMallocAsync(&p, size, compute_), what + ": allocating " + std::to_string(size) + " bytes");
  return p;
}

void Device::free_async(void* data) noexcept {
  if (data != nullptr) cudaFreeAsync(data, compute_);
}

void Device::order_after_comm(Buffer& b) {
  if (!b.comm_pending) return;
  check(cudaStreamWaitEvent(compute_, b.comm_done, 0), "ordering after a collective");
  b.comm_pending = false;  // later compute work is ordered behind this wait
}

void Device::set_sticky(bp_status_code code, const std::string& message) noexcept {
  try {
    std::lock_guard<std::mutex> lock(sticky_mutex_);
    if (!sticky_) sticky_.emplace(code, message);
  } catch (...) {
    // Out of memory while recording an error: the collective's own status
    // still reports it.
  }
}

void Device::report_pending_errors() {
  // A data error a kernel found: the slot lives in mapped host memory, read
  // after the streams synchronised.
  volatile ErrorSlot* slot = slot_host_;
  if (slot != nullptr && slot->kind != kDataOk) {
    ErrorSlot copy{slot->kind, slot->op, slot->value, slot->bound};
    slot->value = 0;
    slot->bound = 0;
    slot->op = 0;
    slot->kind = kDataOk;
    fail(BP_STATUS_INVALID_ARGUMENT, "cuda: " + describe_data_error(copy));
  }
  std::optional<plugin::Failure> sticky;
  {
    std::lock_guard<std::mutex> lock(sticky_mutex_);
    sticky.swap(sticky_);
  }
  if (sticky) throw *sticky;
}

void Device::synchronize(const std::string& what) {
  if (started_) {
    check(cudaStreamSynchronize(comm_), what + ": waiting for the communication stream");
    check(cudaStreamSynchronize(compute_), what + ": waiting for the compute stream");
  }
  report_pending_errors();
}

void Device::ensure_staging() {
  if (staging_[0] != nullptr) return;
  staging_half_ = (static_cast<uint64_t>(options_.staging_mib) << 20) / 2;
  for (int k = 0; k < 2; ++k) {
    void* p = nullptr;
    check(cudaHostAlloc(&p, staging_half_, cudaHostAllocDefault), "allocating pinned staging memory");
    staging_[k] = static_cast<unsigned char*>(p);
    check(cudaEventCreateWithFlags(&staging_done_[k], cudaEventDisableTiming), "creating a staging event");
  }
}

void Device::write(Buffer& b, uint64_t offset, const void* src, uint64_t size) {
  if (size == 0) return;
  order_after_comm(b);  // a collective may still read what this overwrites
  auto* dst = static_cast<unsigned char*>(b.data) + offset;
  if (options_.staging_mib == 0 || size < kStagingMinBytes) {
    check(cudaMemcpyAsync(dst, src, size, cudaMemcpyHostToDevice, compute_), "buffer_write");
    // From pageable memory the copy returns once src is staged; from pinned
    // memory (another backend's, or registered) the DMA reads src later, so
    // wait: the caller may reuse src as soon as this returns.
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, src) == cudaSuccess && a.type == cudaMemoryTypeHost)
      check(cudaStreamSynchronize(compute_), "buffer_write from pinned memory");
    cudaGetLastError();
    return;
  }
  ensure_staging();
  const auto* from = static_cast<const unsigned char*>(src);
  int k = 0;
  for (uint64_t done = 0; done < size; done += staging_half_, k ^= 1) {
    const uint64_t chunk = std::min(staging_half_, size - done);
    check(cudaEventSynchronize(staging_done_[k]), "buffer_write: waiting for a staging buffer");
    std::memcpy(staging_[k], from + done, chunk);
    check(cudaMemcpyAsync(dst + done, staging_[k], chunk, cudaMemcpyHostToDevice, compute_), "buffer_write");
    check(cudaEventRecord(staging_done_[k], compute_), "buffer_write");
  }
}

void Device::read(Buffer& b, uint64_t offset, void* dst, uint64_t size) {
  order_after_comm(b);
  const auto* from = static_cast<const unsigned char*>(b.data) + offset;
  if (size > 0 && (options_.staging_mib == 0 || size < kStagingMinBytes)) {
    check(cudaMemcpyAsync(dst, from, size, cudaMemcpyDeviceToHost, compute_), "buffer_read");
  } else if (size > 0) {
    ensure_staging();
    auto* out = static_cast<unsigned char*>(dst);
    const uint64_t chunks = (size + staging_half_ - 1) / staging_half_;
    auto issue = [&](uint64_t c) {
      const uint64_t at = c * staging_half_;
      const uint64_t n = std::min(staging_half_, size - at);
      check(cudaMemcpyAsync(staging_[c % 2], from + at, n, cudaMemcpyDeviceToHost, compute_), "buffer_read");
      check(cudaEventRecord(staging_done_[c % 2], compute_), "buffer_read");
    };
    issue(0);
    if (chunks > 1) issue(1);
    for (uint64_t c = 0; c < chunks; ++c) {
      check(cudaEventSynchronize(staging_done_[c % 2]), "buffer_read: waiting for a staging buffer");
      const uint64_t at = c * staging_half_;
      std::memcpy(out + at, staging_[c % 2], std::min(staging_half_, size - at));
      if (c + 2 < chunks) issue(c + 2);
    }
  }
  synchronize("buffer_read");
}

}  // namespace backplane::cuda
