// NCCL communicators of the cuda plugin (collectives.hpp).
#include "collectives.hpp"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "host/comm_setup.hpp"
#include "host/watchdog.hpp"
#include "kernels.hpp"

namespace backplane::cuda {
namespace {

using plugin::fail;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint64_t kCommLiveMagic = 0x6e63636c6c697665ULL;  // arbitrary, non-zero
constexpr uint64_t kCommDeadMagic = 0x6e63636c64656164ULL;
// How often the watchdog polls queued collectives.
constexpr milliseconds kWatchdogInterval{5};

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string text =
      std::string(ncclGetErrorString(r)) + " (ncclResult " + std::to_string(static_cast<int>(r)) + ")";
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') text += ": " + std::string(last);
  }
  return text;
}

// A CUDA event shared between a collective and the watchdog's poll.
using Event = std::shared_ptr<CUevent_st>;
Event make_event(Device& device) {
  cudaEvent_t e = nullptr;
  device.check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating a collective's event");
  return Event(e, [](cudaEvent_t ev) { cudaEventDestroy(ev); });
}

// The NCCL side of comm_setup's CommInit.
class NcclInit final : public CommInit {
 public:
  explicit NcclInit(int32_t device) : device_(device) {}
  std::size_t id_bytes() const override { return sizeof(ncclUniqueId); }
  std::vector<uint8_t> make_id() override {
    ncclUniqueId id;
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      fail(BP_STATUS_COLLECTIVE, "cuda: comm_create: ncclGetUniqueId failed: " + nccl_text(r, nullptr));
    std::vector<uint8_t> bytes(sizeof id);
    std::memcpy(bytes.data(), &id, sizeof id);
    return bytes;
  }
  void start(const std::vector<uint8_t>& bytes, int32_t rank, int32_t size) override {
    ncclUniqueId id;
    std::memcpy(&id, bytes.data(), sizeof id);
    cudaSetDevice(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // returns at once; poll() follows the join against the deadline
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      fail(BP_STATUS_COLLECTIVE, "cuda: comm_create: ncclCommInitRankConfig failed: " + nccl_text(r, comm_));
  }
  Progress poll(std::string& error) override {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return Progress::done;
    if (state == ncclInProgress) return Progress::pending;
    error = nccl_text(state, comm_);
    return Progress::failed;
  }
  void abort() noexcept override {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  ncclComm_t take() noexcept { return std::exchange(comm_, nullptr); }

 private:
  int32_t device_;
  ncclComm_t comm_ = nullptr;
};

ncclDataType_t nccl_type(int32_t dtype, bool reducing, const char* op) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return ncclFloat32;
    case BP_DTYPE_F64:
      return ncclFloat64;
    case BP_DTYPE_F16:
      return ncclFloat16;
    case BP_DTYPE_BF16:
      return ncclBfloat16;
    case BP_DTYPE_I32:
      return ncclInt32;
    case BP_DTYPE_I64:
      return ncclInt64;
    case BP_DTYPE_U8:
      return ncclUint8;
    case BP_DTYPE_I8:
      return ncclInt8;
    case BP_DTYPE_BOOL:
      if (!reducing) return ncclUint8;  // moved as bytes
      [[fallthrough]];
    default:
      fail(BP_STATUS_UNSUPPORTED, std::string("cuda: ") + op + ": dtype " + plugin::dtype_name(dtype) +
                                      " cannot be " + (reducing ? "reduced" : "sent") +
                                      " (f32, f64, f16, bf16, i32, i64, u8, i8" + (reducing ? "" : ", bool") +
                                      ")");
  }
}

bool is_float_dtype(int32_t dtype) {
  return dtype == BP_DTYPE_F32 || dtype == BP_DTYPE_F64 || dtype == BP_DTYPE_F16 || dtype == BP_DTYPE_BF16;
}

}  // namespace

struct Communicator::Impl {
  Device& device;
  int32_t rank = 0;
  int32_t size = 1;
  int64_t timeout_ms = 0;
  std::mutex nccl_mutex;      // every NCCL call; abort frees the communicator under it
  ncclComm_t nccl = nullptr;  // NULL once aborted or destroyed
  std::string abort_reason;   // under nccl_mutex
  std::atomic<bool> aborted{false};
  cudaEvent_t ready = nullptr;      // the compute stream's point a collective waits for
  int32_t* barrier_word = nullptr;  // device memory the barrier all-reduces
  std::unique_ptr<Watchdog> watchdog;

  explicit Impl(Device& d) : device(d) {}

  std::string where(const char* op) const {
    return std::string(op) + " on rank " + std::to_string(rank) + " of " + std::to_string(size) +
           " (cuda:" + std::to_string(device.ordinal()) + ")";
  }

  void abort_nccl(const std::string& reason) noexcept {
    std::lock_guard<std::mutex> lock(nccl_mutex);
    if (nccl != nullptr) ncclCommAbort(nccl);  // NCCL's kernels return; the streams drain
    nccl = nullptr;
    if (!aborted.exchange(true)) abort_reason = reason;
  }

  [[noreturn]] void aborted_fail(const char* op) {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(nccl_mutex);
      reason = abort_reason;
    }
    fail(BP_STATUS_COLLECTIVE, "cuda: " + where(op) + ": the communicator was aborted earlier (" + reason +
                                   "); destroy it and create a new one");
  }

  // Waits for a non-blocking NCCL call to be accepted (ncclInProgress means
  // NCCL is still enqueuing), bounded by the timeout.
  void settle(const char* op, ncclResult_t r) {
    const auto deadline = Clock::now() + milliseconds(timeout_ms);
    auto pause = std::chrono::microseconds(50);
    while (r == ncclInProgress) {
      if (Clock::now() >= deadline) {
        const std::string m = where(op) + " was not accepted by NCCL within " + std::to_string(timeout_ms) +
                              " ms, so the communicator was aborted (comm_abort)";
        abort_nccl(m);
        fail(BP_STATUS_TIMEOUT, "cuda: " + m);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, milliseconds(2));
      std::lock_guard<std::mutex> lock(nccl_mutex);
      if (nccl == nullptr) aborted_fail(op);
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(nccl, &state);
      r = q != ncclSuccess ? q : state;
    }
    if (r != ncclSuccess) {
      std::string text;
      {
        std::lock_guard<std::mutex> lock(nccl_mutex);
        text = nccl_text(r, nccl);
      }
      const std::string m = where(op) + " failed in NCCL: " + text;
      abort_nccl(m);
      fail(BP_STATUS_COLLECTIVE, "cuda: " + m + "; the communicator was aborted");
    }
  }

  // One collective: ordered after the compute stream's earlier work, issued on
  // the communication stream, its completion recorded on the buffers and
  // handed to the watchdog. `issue` makes the NCCL call.
  template <class Issue>
  Event run(const char* op, std::initializer_list<Buffer*> buffers, Issue&& issue) {
    if (aborted.load()) aborted_fail(op);
    std::string failure;
    if (watchdog->failed(&failure)) aborted_fail(op);
    device.check(cudaEventRecord(ready, device.compute()),
                 std::string(op) + ": recording the compute stream");
    device.check(cudaStreamWaitEvent(device.comm(), ready, 0), std::string(op) + ": ordering after compute");
    ncclResult_t r = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(nccl_mutex);
      if (nccl == nullptr) aborted_fail(op);
      r = issue(nccl, device.comm());
    }
    settle(op, r);
    Event done = make_event(device);
    device.check(cudaEventRecord(done.get(), device.comm()), std::string(op) + ": recording its completion");
    for (Buffer* b : buffers) {
      if (b == nullptr) continue;
      if (b->comm_done == nullptr)
        device.check(cudaEventCreateWithFlags(&b->comm_done, cudaEventDisableTiming),
                     "creating a buffer event");
      device.check(cudaEventRecord(b->comm_done, device.comm()),
                   std::string(op) + ": recording its completion");
      b->comm_pending = true;
    }
    const int32_t ordinal = device.ordinal();
    watchdog->watch(where(op), Clock::now() + milliseconds(timeout_ms), milliseconds(timeout_ms),
                    [this, done, ordinal](std::string& error) {
                      cudaSetDevice(ordinal);
                      const cudaError_t e = cudaEventQuery(done.get());
                      if (e == cudaSuccess) return Progress::done;
                      if (e != cudaErrorNotReady) {
                        error = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
                        return Progress::failed;
                      }
                      std::lock_guard<std::mutex> lock(nccl_mutex);
                      if (nccl == nullptr) return Progress::pending;  // aborted: its kernels are draining
                      ncclResult_t state = ncclSuccess;
                      if (ncclCommGetAsyncError(nccl, &state) == ncclSuccess && state != ncclSuccess &&
                          state != ncclInProgress) {
                        error = nccl_text(state, nccl);
                        return Progress::failed;
                      }
                      return Progress::pending;
                    });
    return done;
  }
};

Communicator::Communicator(std::unique_ptr<Impl> impl) : magic_(kCommLiveMagic), impl_(std::move(impl)) {}

Communicator::~Communicator() {
  destroy();
  magic_ = kCommDeadMagic;
}

Communicator& Communicator::from_handle(bp_comm* comm, const char* op) {
  auto* c = reinterpret_cast<Communicator*>(comm);
  if (c == nullptr || c->magic_ != kCommLiveMagic)
    fail(BP_STATUS_INVALID_ARGUMENT,
         std::string("cuda: ") + op +
             ": not a live cuda communicator (NULL, destroyed, or another backend's)");
  return *c;
}

std::unique_ptr<Communicator> Communicator::create(Device& device, const bp_comm_create_args& args) {
  if (args.store == nullptr)
    fail(BP_STATUS_INVALID_ARGUMENT, "cuda: comm_create: no key-value store was passed");
  if (const std::string missing = missing_store_entries(*args.store); !missing.empty())
    fail(BP_STATUS_INVALID_ARGUMENT, "cuda: comm_create: the host's key-value store lacks " + missing);
  auto impl = std::make_unique<Impl>(device);
  impl->rank = args.rank;
  impl->size = args.world_size;
  impl->timeout_ms = args.timeout_ms > 0 ? args.timeout_ms : 300000;
  device.check(cudaEventCreateWithFlags(&impl->ready, cudaEventDisableTiming),
               "comm_create: creating an event");
  device.check(cudaMalloc(reinterpret_cast<void**>(&impl->barrier_word), sizeof(int32_t)),
               "comm_create: barrier memory");
  CommSetup setup;
  setup.rank = args.rank;
  setup.size = args.world_size;
  setup.timeout_ms = impl->timeout_ms;
  setup.key_prefix = args.key_prefix != nullptr ? args.key_prefix : "";
  NcclInit init(device.ordinal());
  establish_comm(*args.store, setup, init);
  impl->nccl = init.take();
  Impl* raw = impl.get();
  impl->watchdog =
      std::make_unique<Watchdog>(kWatchdogInterval, [raw](bp_status_code code, const std::string& m) {
        raw->abort_nccl(m);
        raw->device.set_sticky(code, "cuda: " + m);
      });
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

namespace {

struct Operand {
  Buffer* buffer;
  void* data;
  int64_t count;
  int32_t dtype;
};

Operand operand_of(Device& device, const bp_tensor& t, const char* op, const char* role) {
  Buffer& b = live_buffer(t.buffer, op);
  if (b.device != device.ordinal())
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cuda: ") + op + ": the " + role +
                                         " lives on cuda:" + std::to_string(b.device) +
                                         ", not the communicator's cuda:" + std::to_string(device.ordinal()));
  const plugin::TensorView v =
      plugin::make_view(t, t.dtype, static_cast<unsigned char*>(b.data), b.size, op, {role, 0});
  if (!v.contiguous)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cuda: ") + op + ": the " + role + " must be contiguous");
  return {&b, v.data, v.numel, t.dtype};
}

ncclRedOp_t nccl_op(int32_t reduce_op, int32_t dtype, const char* op) {
  switch (reduce_op) {
    case BP_REDUCE_SUM:
      return ncclSum;
    case BP_REDUCE_MEAN:  // integers: a sum, divided afterwards (truncating)
      return is_float_dtype(dtype) ? ncclAvg : ncclSum;
    case BP_REDUCE_MIN:
      return ncclMin;
    case BP_REDUCE_MAX:
      return ncclMax;
    case BP_REDUCE_PROD:
      return ncclProd;
    default:
      fail(BP_STATUS_INVALID_ARGUMENT, std::string("cuda: ") + op + ": unknown reduce op " +
                                           std::to_string(reduce_op) +
                                           " (sum 0, mean 1, min 2, max 3, prod 4)");
  }
}

}  // namespace

void Communicator::all_reduce(const bp_tensor& in, const bp_tensor& out, int32_t reduce_op) {
  Impl& c = *impl_;
  const Operand i = operand_of(c.device, in, "all_reduce", "input");
  const Operand o = operand_of(c.device, out, "all_reduce", "output");
  const ncclDataType_t type = nccl_type(i.dtype, true, "all_reduce");
  const ncclRedOp_t red = nccl_op(reduce_op, i.dtype, "all_reduce");
  c.run("all_reduce", {i.buffer, o.buffer}, [&](ncclComm_t comm, cudaStream_t s) {
    return ncclAllReduce(i.data, o.data, static_cast<size_t>(i.count), type, red, comm, s);
  });
  if (reduce_op == BP_REDUCE_MEAN && !is_float_dtype(i.dtype) && c.size > 1) {
    KernelContext k{c.device.comm(), 1, nullptr, 0};
    launch_divide_int(k, i.dtype, o.count, o.data, c.size);
    c.device.check_launch("all_reduce: the mean's division");
  }
}

void Communicator::broadcast(const bp_tensor& tensor, int32_t root) {
  Impl& c = *impl_;
  const Operand t = operand_of(c.device, tensor, "broadcast", "tensor");
  const ncclDataType_t type = nccl_type(t.dtype, false, "broadcast");
  c.run("broadcast", {t.buffer}, [&](ncclComm_t comm, cudaStream_t s) {
    return ncclBroadcast(t.data, t.data, static_cast<size_t>(t.count), type, root, comm, s);
  });
}

void Communicator::all_gather(const bp_tensor& in, const bp_tensor& out) {
  Impl& c = *impl_;
  const Operand i = operand_of(c.device, in, "all_gather", "input");
  const Operand o = operand_of(c.device, out, "all_gather", "output");
  if (o.count != i.count * c.size)
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cuda: all_gather: the output holds " + std::to_string(o.count) +
             " elements, not world_size x input = " + std::to_string(i.count * c.size));
  const ncclDataType_t type = nccl_type(i.dtype, false, "all_gather");
  c.run("all_gather", {i.buffer, o.buffer}, [&](ncclComm_t comm, cudaStream_t s) {
    return ncclAllGather(i.data, o.data, static_cast<size_t>(i.count), type, comm, s);
  });
}

void Communicator::reduce_scatter(const bp_tensor& in, const bp_tensor& out, int32_t reduce_op) {
  Impl& c = *impl_;
  const Operand i = operand_of(c.device, in, "reduce_scatter", "input");
  const Operand o = operand_of(c.device, out, "reduce_scatter", "output");
  if (i.count != o.count * c.size)
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cuda: reduce_scatter: the input holds " + std::to_string(i.count) +
             " elements, not world_size x output = " + std::to_string(o.count * c.size));
  const ncclDataType_t type = nccl_type(i.dtype, true, "reduce_scatter");
  const ncclRedOp_t red = nccl_op(reduce_op, i.dtype, "reduce_scatter");
  c.run("reduce_scatter", {i.buffer, o.buffer}, [&](ncclComm_t comm, cudaStream_t s) {
    return ncclReduceScatter(i.data, o.data, static_cast<size_t>(o.count), type, red, comm, s);
  });
  if (reduce_op == BP_REDUCE_MEAN && !is_float_dtype(i.dtype) && c.size > 1) {
    KernelContext k{c.device.comm(), 1, nullptr, 0};
    launch_divide_int(k, i.dtype, o.count, o.data, c.size);
    c.device.check_launch("reduce_scatter: the mean's division");
  }
}

void Communicator::barrier() {
  Impl& c = *impl_;
  Event done = c.run("barrier", {}, [&](ncclComm_t comm, cudaStream_t s) {
    return ncclAllReduce(c.barrier_word, c.barrier_word, 1, ncclInt32, ncclSum, comm, s);
  });
  // Every rank reached it once the all-reduce completed here; the watchdog
  // aborts a barrier that outlives the timeout, which completes the event.
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    const cudaError_t e = cudaEventQuery(done.get());
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) c.device.check(e, "barrier");
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, milliseconds(1));
  }
  std::string failure;
  if (c.watchdog->failed(&failure) || c.aborted.load()) c.aborted_fail("barrier");
}

Device& Communicator::device() noexcept { return impl_->device; }

void Communicator::abort(const std::string& reason) noexcept { impl_->abort_nccl(reason); }

void Communicator::destroy() noexcept {
  if (!impl_) return;
  Impl& c = *impl_;
  cudaSetDevice(c.device.ordinal());
  // Queued collectives first, bounded by the timeout (the watchdog aborts
  // what hangs); then a clean finalize.
  if (c.watchdog && !c.watchdog->drain(Clock::now() + milliseconds(c.timeout_ms)))
    c.abort_nccl("comm_destroy: collectives still running after " + std::to_string(c.timeout_ms) + " ms");
  c.watchdog.reset();
  {
    std::lock_guard<std::mutex> lock(c.nccl_mutex);
    if (c.nccl != nullptr) {
      ncclResult_t r = ncclCommFinalize(c.nccl);
      const auto deadline = Clock::now() + milliseconds(c.timeout_ms);
      while (r == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(1));
        ncclResult_t state = ncclSuccess;
        r = ncclCommGetAsyncError(c.nccl, &state);
        if (r == ncclSuccess) r = state;
      }
      if (r == ncclSuccess)
        ncclCommDestroy(c.nccl);
      else
        ncclCommAbort(c.nccl);
      c.nccl = nullptr;
    }
  }
  cudaStreamSynchronize(c.device.comm());
  if (c.barrier_word != nullptr) cudaFree(c.barrier_word);
  if (c.ready != nullptr) cudaEventDestroy(c.ready);
  impl_.reset();
}

}  // namespace backplane::cuda
