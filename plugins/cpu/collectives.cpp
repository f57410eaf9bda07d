// The Communicator (collectives.hpp): the choice of its Link (transport.hpp),
// one validation of each tensor (the SDK's make_view), and the failure
// model: a failed or aborted collective poisons the communicator, publishes
// its error for the peers and closes the link. The algorithms live in
// collective_algorithms.cpp, the links in shm_transport.cpp and
// gloo_transport.cpp.
#include "collectives.hpp"

#include <algorithm>
#include <atomic>
#include <backplane/plugin.hpp>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "collective_algorithms.hpp"
#include "host_buffer.hpp"
#include "kv_store.hpp"
#include "sigpipe_block.hpp"
#include "transport.hpp"

namespace backplane::cpu {
namespace {

using plugin::fail;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint64_t kCommLiveMagic = 0x636f6d6d6c697665ULL;  // arbitrary, non-zero
constexpr uint64_t kCommDeadMagic = 0x636f6d6d64656164ULL;

// Scratch above this size is released after each collective instead of kept.
constexpr uint64_t kScratchKeepBytes = uint64_t{64} << 20;

// The dtypes collective_math.hpp reduces.
using ReducibleDTypes = plugin::DTypes<BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_I64,
                                       BP_DTYPE_I32, BP_DTYPE_I8, BP_DTYPE_U8>;

// The transport of a group of one: the algorithms never send in one.
class Alone final : public Transport {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  Region& region(void*, uint64_t) override { return unreachable(); }
  void send(Region&, int, uint64_t, uint64_t, uint64_t) override { unreachable(); }
  void recv(Region&, int, uint64_t, uint64_t, uint64_t) override { unreachable(); }
  int wait_recv(Region&, int) override { unreachable(); }
  int wait_send(Region&, int) override { unreachable(); }

 private:
  [[noreturn]] static Region& unreachable() {
    plugin::fail(BP_STATUS_INTERNAL, "a group of one has no peer to exchange messages with");
  }
};

// The link of a group of one: no peers to stop or tell.
class AloneLink final : public Link {
 public:
  const char* name() const noexcept override { return "none"; }
  std::unique_ptr<Transport> begin(const FailureBoard&, const CallContext&) override {
    return std::make_unique<Alone>();
  }
  void interrupt() noexcept override {}
  void close(std::string_view /*reason*/) noexcept override {}
};

}  // namespace

struct Communicator::Impl {
  int32_t rank = 0;
  int32_t size = 1;
  milliseconds timeout{0};
  // Declared before the link, so freed after it: a failed collective's Gloo
  // buffers, kept by the link, point into it.
  Scratch scratch;
  Scratch across_scratch;      // a hierarchical all_reduce's transfer across hosts, on its own thread
  std::unique_ptr<Link> link;  // chosen at creation, never NULL
  FailureBoard board;
  Tuning tuning;
  uint64_t sequence = 0;  // collectives run so far (tags of their messages)
  // Owned by the thread running collectives (under `busy`).
  bool failed = false;
  CommFailure failure{BP_STATUS_OK, {}};
  std::mutex busy;
  // Shared with abort(), which may run on any thread.
  std::atomic<bool> aborted{false};
  std::atomic<bool> published{false};  // this rank's error is on the board: the first one stays

  std::string where(const char* op) const { return CallSite{op, rank, size}.text(); }
  // What the peers read once this rank aborted, whichever thread says it first.
  std::string abort_notice() const {
    return "rank " + std::to_string(rank) + " of " + std::to_string(size) +
           " aborted its communicator (comm_abort)";
  }
  // Leaves `message` for the peers unless an earlier error is there already.
  void publish_once(const std::string& message) noexcept {
    if (!published.exchange(true)) board.publish(rank, message);
  }
};

// ---------------------------------------------------------------------------
// Creation
// ---------------------------------------------------------------------------

Communicator::Communicator(std::unique_ptr<Impl> impl) : magic_(kCommLiveMagic), impl_(std::move(impl)) {}

Communicator::~Communicator() { magic_ = kCommDeadMagic; }

Communicator& Communicator::from_handle(bp_comm* comm, const char* op) {
  if (comm == nullptr) fail(BP_STATUS_INVALID_ARGUMENT, std::string(op) + ": the communicator is NULL");
  auto* c = reinterpret_cast<Communicator*>(comm);
  if (c->magic_ != kCommLiveMagic)
    fail(BP_STATUS_INVALID_ARGUMENT,
         std::string(op) + ": the handle is not a live cpu communicator (destroyed, or another backend's)");
  return *c;
}

std::unique_ptr<Communicator> Communicator::create(const bp_comm_create_args& args,
                                                   const NetworkOptions& network) {
  // The host validated rank, world size and timeout; these two checks guard
  // what would otherwise index out of range or call through NULL.
  if (args.world_size < 1 || args.rank < 0 || args.rank >= args.world_size)
    fail(BP_STATUS_INVALID_ARGUMENT, "rank " + std::to_string(args.rank) + " is outside [0, world_size " +
                                         std::to_string(args.world_size) + ")");
  auto impl = std::make_unique<Impl>();
  Impl& c = *impl;
  c.rank = args.rank;
  c.size = args.world_size;
  c.timeout = milliseconds(std::max<int64_t>(1, args.timeout_ms));
  if (c.size == 1) {
    c.link = std::make_unique<AloneLink>();
    return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
  }

  const std::string where = c.where("comm_create");
  if (args.store == nullptr)
    fail(BP_STATUS_INVALID_ARGUMENT,
         where + ": the key-value store is NULL (a group of more than one rank needs it)");
  if (const std::string missing = missing_store_entries(*args.store); !missing.empty())
    fail(BP_STATUS_INVALID_ARGUMENT, where + ": the key-value store lacks " + missing + " (struct_size " +
                                         std::to_string(args.store->struct_size) + ")");

  const std::string key_prefix = args.key_prefix != nullptr ? args.key_prefix : "";
  const std::string store_prefix = key_prefix + "cpu.gloo/";
  c.board = FailureBoard(args.store, store_prefix);
  StoreExchange exchange(*args.store, store_prefix, Clock::now() + c.timeout);
  const LinkSetup setup{exchange, store_prefix, c.rank, c.size, c.timeout, network, where};
  c.link = connect_shared_memory(setup);
  if (c.link != nullptr)
    plugin::log(BP_LOG_DEBUG, "cpu: " + where + ": connected to " + std::to_string(c.size - 1) +
                                  " peers through shared memory");
  if (c.link == nullptr) c.link = connect_hierarchical(setup);
  if (c.link == nullptr) c.link = connect_gloo(setup);
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

// ---------------------------------------------------------------------------
// Abort
// ---------------------------------------------------------------------------

void Communicator::abort() noexcept {
  Impl& c = *impl_;
  if (c.aborted.exchange(true, std::memory_order_acq_rel)) return;
  c.link->interrupt();  // first: local waits end now, whatever the store does
  try {
    const std::string notice = c.abort_notice();
    c.publish_once(notice);
    c.link->close(notice);
  } catch (...) {
    // Building the message failed (out of memory): the peers see the close alone.
    c.link->close({});
  }
}

// ---------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------

namespace {

// Serialises a collective on its communicator, fails fast once poisoned or
// aborted, and poisons (closing every connection, so peers fail promptly) on
// any failure once the collective has begun.
template <class Fn>
void guarded(Communicator::Impl& c, const char* op, Fn&& body) {
  std::unique_lock<std::mutex> lock(c.busy, std::try_to_lock);
  if (!lock.owns_lock())
    fail(BP_STATUS_INVALID_ARGUMENT, c.where(op) +
                                         ": another thread is running a collective on this communicator; a "
                                         "communicator runs one collective at a time (serialise the calls)");
  if (c.failed)
    fail(c.failure.code,
         c.where(op) +
             ": this communicator failed earlier and can no longer be used (destroy it and create "
             "a new one); the first error was: " +
             c.failure.message);
  if (c.aborted.load(std::memory_order_acquire))
    fail(BP_STATUS_COLLECTIVE, c.where(op) +
                                   ": aborted: comm_abort was called on this communicator (destroy it; "
                                   "make a new one to continue)");
  const SigpipeBlock block;
  // Any failure once the collective has begun leaves the peers out of step
  // with this rank.
  auto poison = [&](CommFailure f) {
    c.failed = true;
    c.failure = f;
    const std::string reason = c.aborted.load(std::memory_order_acquire) ? c.abort_notice() : f.message;
    c.publish_once(reason);
    // Also after an abort, whose thread may not have closed it yet: once
    // closed, Gloo no longer reads into or writes from this collective's
    // tensors, which the caller may free as soon as this returns.
    c.link->close(reason);
    fail(f.code, f.message);
  };
  try {
    body();
  } catch (const CommFailure& f) {
    poison(f);
  } catch (const std::bad_alloc&) {
    poison({BP_STATUS_OUT_OF_MEMORY, c.where(op) + ": out of memory for the collective's scratch space"});
  } catch (const plugin::Failure& f) {
    poison({f.code(), f.what()});
  } catch (const std::exception& e) {
    poison({BP_STATUS_INTERNAL, c.where(op) + ": unexpected error: " + e.what()});
  }
  c.scratch.trim(kScratchKeepBytes);
  c.across_scratch.trim(kScratchKeepBytes);
}

// A transport that counts the time spent waiting for peers, for a trace:
// what a collective spends apart from that waiting is moving and reducing
// its bytes.
class TimedTransport final : public Transport {
 public:
  explicit TimedTransport(Transport& inner) : inner_(inner) {}
  int rank() const noexcept override { return inner_.rank(); }
  int size() const noexcept override { return inner_.size(); }
  Region& region(void* data, uint64_t bytes) override { return inner_.region(data, bytes); }
  void send(Region& from, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override {
    inner_.send(from, peer, phase, offset, bytes);
  }
  void recv(Region& into, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override {
    inner_.recv(into, peer, phase, offset, bytes);
  }
  int wait_recv(Region& region, int expected) override {
    const int64_t t0 = plugin::trace_now_ns();
    const int peer = inner_.wait_recv(region, expected);
    waited_ns_ += plugin::trace_now_ns() - t0;
    return peer;
  }
  int wait_send(Region& region, int expected) override {
    const int64_t t0 = plugin::trace_now_ns();
    const int peer = inner_.wait_send(region, expected);
    waited_ns_ += plugin::trace_now_ns() - t0;
    return peer;
  }
  int64_t waited_ns() const noexcept { return waited_ns_; }

 private:
  Transport& inner_;
  int64_t waited_ns_ = 0;
};

// Both levels of a hierarchical collective, timed.
class TimedLevels final : public Levels {
 public:
  explicit TimedLevels(Levels& inner) : inner_(inner), local_(inner.local()) {
    if (Transport* a = inner.across(); a != nullptr) across_.emplace(*a);
  }
  Transport& local() override { return local_; }
  Transport* across() override { return across_ ? &*across_ : nullptr; }
  bool uniform() const noexcept override { return inner_.uniform(); }
  int world() const noexcept override { return inner_.world(); }
  void interrupt_across() noexcept override { inner_.interrupt_across(); }
  int64_t waited_ns() const noexcept { return local_.waited_ns() + (across_ ? across_->waited_ns() : 0); }

 private:
  Levels& inner_;
  TimedTransport local_;
  std::optional<TimedTransport> across_;
};

// Records the span of a collective on the link, with what `algorithm` (given
// a timed transport or levels) spent waiting for the peers.
template <class Timed, class Fn>
void traced(Communicator::Impl& c, Timed& timed, Fn&& algorithm) {
  bp_trace_event e{};
  e.category = "transport";
  e.name = c.link->name();
  e.start_ns = plugin::trace_now_ns();
  algorithm(timed);
  e.end_ns = plugin::trace_now_ns();
  e.bytes = -1;
  e.number_key = "wait_ns";
  e.number = timed.waited_ns();
  plugin::trace_event(e);
}

// Runs algorithm(transport) on this collective's transport. `call` goes into
// the tags of its messages: dtype, counts, reduce op, root. With a trace
// recording, the host gets a span on the transport with the time spent
// waiting for the peers (the rest moved and reduced bytes).
template <class Fn>
void run_collective(Communicator::Impl& c, const char* op, std::initializer_list<uint64_t> call,
                    Fn&& algorithm) {
  const std::unique_ptr<Transport> transport =
      c.link->begin(c.board, CallContext(c.timeout, c.sequence++, call, {op, c.rank, c.size}));
  if (!plugin::trace_active()) [[likely]] {
    algorithm(*transport);
    return;
  }
  TimedTransport timed(*transport);
  traced(c, timed, algorithm);
}

// As run_collective, on a link in two levels: levels_algorithm(Levels&)
// there, else algorithm(Transport&).
template <class Fn, class LevelsFn>
void run_collective(Communicator::Impl& c, const char* op, std::initializer_list<uint64_t> call,
                    Fn&& algorithm, LevelsFn&& levels_algorithm) {
  const CallContext context(c.timeout, c.sequence++, call, {op, c.rank, c.size});
  const std::unique_ptr<Levels> levels = c.link->begin_levels(c.board, context);
  if (levels == nullptr) {
    const std::unique_ptr<Transport> transport = c.link->begin(c.board, context);
    if (!plugin::trace_active()) [[likely]] {
      algorithm(*transport);
      return;
    }
    TimedTransport timed(*transport);
    traced(c, timed, algorithm);
    return;
  }
  if (!plugin::trace_active()) [[likely]] {
    levels_algorithm(*levels);
    return;
  }
  TimedLevels timed(*levels);
  traced(c, timed, levels_algorithm);
}

// The SDK's view of a contiguous tensor of `dtype`: the one check of each
// tensor (the host validated shapes; this keeps a wrong view from becoming a
// write outside its buffer).
Elements elements_of(const bp_tensor& t, int32_t dtype, const char* op, plugin::Role role) {
  const plugin::TensorView v =
      plugin::make_view(t, dtype, buffer_data(t.buffer), buffer_size(t.buffer), op, role);
  if (!v.contiguous)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string(op) + ": " + role.to_string() + ": shape " +
                                         v.shape_string() + " with strides " +
                                         plugin::describe_shape(t.ndim, t.strides) +
                                         " is not contiguous; collectives take contiguous row-major tensors");
  return {v.data, static_cast<uint64_t>(v.numel), v.element_size};
}

// The element counts that would otherwise read or write past a buffer.
// `what` builds the message, only when the counts are wrong.
template <class What>
void require_count(bool ok, const char* op, What&& what) {
  if (!ok) fail(BP_STATUS_INVALID_ARGUMENT, std::string(op) + ": " + what());
}

Reduction reduction_for(const char* op, int32_t dtype, int32_t reduce_op) {
  if (bp_reduce_op_name(reduce_op) == nullptr)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string(op) + ": unknown " + plugin::reduce_op_name(reduce_op) +
                                         " (sum 0, mean 1, min 2, max 3, prod 4)");
  const CombineFn combine =
      plugin::contains<ReducibleDTypes>(dtype) ? combine_for(dtype, reduce_op) : nullptr;
  if (combine == nullptr)
    fail(BP_STATUS_UNSUPPORTED,
         std::string(op) + " (" + plugin::reduce_op_name(reduce_op) + "): " + plugin::dtype_name(dtype) +
             " tensors cannot be reduced (supported: " + ReducibleDTypes::names() + "); cast first");
  return {combine, reduce_op == BP_REDUCE_MEAN ? divide_for(dtype) : nullptr};
}

}  // namespace

void Communicator::all_reduce(const bp_tensor& input, const bp_tensor& output, int32_t reduce_op) {
  constexpr const char* op = "all_reduce";
  const Reduction red = reduction_for(op, input.dtype, reduce_op);
  const Elements in = elements_of(input, input.dtype, op, {"inputs", 0});
  const Elements out = elements_of(output, input.dtype, op, {"outputs", 0});
  require_count(in.count == out.count, op, [&] {
    return "input has " + std::to_string(in.count) + " elements but output has " + std::to_string(out.count);
  });
  Impl& c = *impl_;
  guarded(c, op, [&] {
    run_collective(
        c, op, {static_cast<uint64_t>(input.dtype), static_cast<uint64_t>(reduce_op), out.count},
        [&](Transport& t) { cpu::all_reduce(t, c.scratch, c.tuning, in, out, red); },
        [&](Levels& l) {
          cpu::hierarchical_all_reduce(l, c.scratch, c.across_scratch, c.tuning, in, out, red);
        });
  });
}

void Communicator::broadcast(const bp_tensor& tensor, int32_t root) {
  constexpr const char* op = "broadcast";
  const Elements data = elements_of(tensor, tensor.dtype, op, {"outputs", 0});
  Impl& c = *impl_;
  if (root < 0 || root >= c.size)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string(op) + ": root " + std::to_string(root) +
                                         " is not a rank of this group (world_size " +
                                         std::to_string(c.size) + ")");
  guarded(c, op, [&] {
    run_collective(c, op, {static_cast<uint64_t>(tensor.dtype), data.count, static_cast<uint64_t>(root)},
                   [&](Transport& t) { cpu::broadcast(t, c.tuning, data, root); });
  });
}

void Communicator::all_gather(const bp_tensor& input, const bp_tensor& output) {
  constexpr const char* op = "all_gather";
  const Elements in = elements_of(input, input.dtype, op, {"inputs", 0});
  const Elements out = elements_of(output, input.dtype, op, {"outputs", 0});
  Impl& c = *impl_;
  require_count(out.count / c.size == in.count && out.count % c.size == 0, op, [&] {
    return "output has " + std::to_string(out.count) + " elements; it must hold world_size (" +
           std::to_string(c.size) + ") x " + std::to_string(in.count) + " (the input's count)";
  });
  guarded(c, op, [&] {
    run_collective(c, op, {static_cast<uint64_t>(input.dtype), in.count},
                   [&](Transport& t) { cpu::all_gather(t, c.tuning, in, out); });
  });
}

void Communicator::reduce_scatter(const bp_tensor& input, const bp_tensor& output, int32_t reduce_op) {
  constexpr const char* op = "reduce_scatter";
  const Reduction red = reduction_for(op, input.dtype, reduce_op);
  const Elements in = elements_of(input, input.dtype, op, {"inputs", 0});
  const Elements out = elements_of(output, input.dtype, op, {"outputs", 0});
  Impl& c = *impl_;
  require_count(in.count / c.size == out.count && in.count % c.size == 0, op, [&] {
    return "input has " + std::to_string(in.count) + " elements; it must hold world_size (" +
           std::to_string(c.size) + ") x " + std::to_string(out.count) + " (the output's count)";
  });
  guarded(c, op, [&] {
    run_collective(c, op, {static_cast<uint64_t>(input.dtype), static_cast<uint64_t>(reduce_op), out.count},
                   [&](Transport& t) { cpu::reduce_scatter(t, c.scratch, c.tuning, in, out, red); });
  });
}

void Communicator::barrier() {
  constexpr const char* op = "barrier";
  Impl& c = *impl_;
  guarded(c, op, [&] { run_collective(c, op, {}, [&](Transport& t) { cpu::barrier(t, c.scratch); }); });
}

}  // namespace backplane::cpu
