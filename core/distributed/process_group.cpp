// ProcessGroup: validates each collective, routes it per the device's
// capability and collective_fallback (direct, staged through a host backend,
// or local), and calls the plugin's collective entries with the job's store
// exposed as bp_kv_store callbacks.
#include "distributed/collective_route.hpp"
#include "distributed/store_linger.hpp"
#include "tensor/op_common.hpp"
#include "tensor/placement.hpp"
#include "tensor/tensor_impl.hpp"
#include "trace/trace_format.hpp"

#include <backplane/log.hpp>
#include <backplane/process_group.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

// The host's own status for the bp_kv_store callbacks (abi.h: each producer
// defines its own). A different type from any plugin's; it never leaves this
// library except as the opaque pointer a plugin frees through the store.
struct bp_status {
  int32_t code;
  std::string message;
};

namespace backplane {

const char* to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::mean:
      return "mean";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::prod:
      return "prod";
  }
  return "?";
}

namespace {

// The calls that reduce, named with their op ("all_reduce_(sum)") for errors
// and traces: literals, so that a collective builds no string.
enum class Reducing { all_reduce, all_reduce_, reduce_scatter, reduce_scatter_into };
const char* reducing_name(Reducing call, ReduceOp op) noexcept {
  static constexpr const char* kNames[4][5] = {
      {"all_reduce(sum)", "all_reduce(mean)", "all_reduce(min)", "all_reduce(max)", "all_reduce(prod)"},
      {"all_reduce_(sum)", "all_reduce_(mean)", "all_reduce_(min)", "all_reduce_(max)", "all_reduce_(prod)"},
      {"reduce_scatter(sum)", "reduce_scatter(mean)", "reduce_scatter(min)", "reduce_scatter(max)",
       "reduce_scatter(prod)"},
      {"reduce_scatter_into(sum)", "reduce_scatter_into(mean)", "reduce_scatter_into(min)",
       "reduce_scatter_into(max)", "reduce_scatter_into(prod)"}};
  const auto i = static_cast<std::size_t>(op);
  return i < 5 ? kNames[static_cast<std::size_t>(call)][i] : "?";
}

using detail::BackendImpl;
using detail::CollectiveRoute;
using detail::TensorImpl;

int32_t abi_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return BP_REDUCE_SUM;
    case ReduceOp::mean:
      return BP_REDUCE_MEAN;
    case ReduceOp::min:
      return BP_REDUCE_MIN;
    case ReduceOp::max:
      return BP_REDUCE_MAX;
    case ReduceOp::prod:
      return BP_REDUCE_PROD;
  }
  throw Error(Errc::invalid_argument,
              "ProcessGroup: unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

// The job's Store behind the plugin-facing bp_kv_store table. Every entry
// returns a status this host owns (the bp_status above), freed through the
// table's status_free; get's value is malloc'd here and freed by free_value.
class KvStoreBridge {
 public:
  explicit KvStoreBridge(std::shared_ptr<Store> store) : store_(std::move(store)) {
    table_.struct_size = BP_KV_STORE_STRUCT_SIZE;
    table_.ctx = this;
    table_.set = &KvStoreBridge::set;
    table_.get = &KvStoreBridge::get;
    table_.wait = &KvStoreBridge::wait;
    table_.free_value = &KvStoreBridge::free_value;
    table_.status_code = &KvStoreBridge::status_code;
    table_.status_message = &KvStoreBridge::status_message;
    table_.status_free = &KvStoreBridge::status_free;
  }
  Store* store() const noexcept { return store_.get(); }
  KvStoreBridge(const KvStoreBridge&) = delete;
  KvStoreBridge& operator=(const KvStoreBridge&) = delete;

  const bp_kv_store* table() const noexcept { return &table_; }

 private:
  // Handed out when even a status cannot be allocated; never freed.
  static bp_status* out_of_memory() noexcept {
    static bp_status oom{BP_STATUS_OUT_OF_MEMORY, "out of memory in the rendezvous store"};
    return &oom;
  }
  static bp_status* make_status(int32_t code, std::string message) noexcept {
    try {
      return new bp_status{code, std::move(message)};
    } catch (...) {
      return out_of_memory();
    }
  }
  static int32_t code_for(Errc e) noexcept {
    switch (e) {
      case Errc::timeout:
        return BP_STATUS_TIMEOUT;
      case Errc::io_error:
        return BP_STATUS_IO;
      case Errc::invalid_argument:
        return BP_STATUS_INVALID_ARGUMENT;
      case Errc::out_of_memory:
        return BP_STATUS_OUT_OF_MEMORY;
      case Errc::collective_error:
        return BP_STATUS_COLLECTIVE;
      default:
        return BP_STATUS_INTERNAL;
    }
  }

  // Runs f on the bridge named by ctx; any exception becomes a status.
  template <class F>
  static bp_status* guarded(const void* args, void* ctx, const char* entry, F&& f) noexcept {
    if (args == nullptr || ctx == nullptr)
      return make_status(
          BP_STATUS_INVALID_ARGUMENT,
          std::string("bp_kv_store.") + entry + ": args or args->ctx is NULL (pass bp_kv_store.ctx)");
    try {
      f(*static_cast<KvStoreBridge*>(ctx));
      return nullptr;
    } catch (const Error& e) {
      return make_status(code_for(e.code()), e.message());
    } catch (const std::bad_alloc&) {
      return out_of_memory();
    } catch (const std::exception& e) {
      return make_status(BP_STATUS_INTERNAL, e.what());
    }
  }

  static bp_status* set(bp_kv_set_args* args) {
    return guarded(args, args ? args->ctx : nullptr, "set", [&](KvStoreBridge& self) {
      if (args->key == nullptr || (args->value == nullptr && args->size > 0))
        throw Error(Errc::invalid_argument, "bp_kv_store.set: key or value is NULL");
      const auto* p = static_cast<const uint8_t*>(args->value);
      std::vector<uint8_t> value(p, p + args->size);
      // timeout_ms came in 2.1: read only when the plugin's struct has it.
      const bool bounded =
          BP_HAS_FIELD(bp_kv_set_args, timeout_ms, args->struct_size) && args->timeout_ms > 0;
      if (bounded)
        self.store_->set_with_timeout(args->key, value, std::chrono::milliseconds(args->timeout_ms));
      else
        self.store_->set(args->key, value);
    });
  }
  static bp_status* get(bp_kv_get_args* args) {
    return guarded(args, args ? args->ctx : nullptr, "get", [&](KvStoreBridge& self) {
      if (args->key == nullptr) throw Error(Errc::invalid_argument, "bp_kv_store.get: key is NULL");
      args->value = nullptr;
      args->size = 0;
      std::vector<uint8_t> v = self.store_->get(args->key, std::chrono::milliseconds(args->timeout_ms));
      auto* data = static_cast<uint8_t*>(std::malloc(v.empty() ? 1 : v.size()));
      if (data == nullptr) throw std::bad_alloc();
      if (!v.empty()) std::memcpy(data, v.data(), v.size());
      args->value = data;
      args->size = v.size();
    });
  }
  static bp_status* wait(bp_kv_wait_args* args) {
    return guarded(args, args ? args->ctx : nullptr, "wait", [&](KvStoreBridge& self) {
      if (args->num_keys > 0 && args->keys == nullptr)
        throw Error(Errc::invalid_argument, "bp_kv_store.wait: keys is NULL");
      std::vector<std::string> k;
      for (int32_t i = 0; i < args->num_keys; ++i) {
        if (args->keys[i] == nullptr) throw Error(Errc::invalid_argument, "bp_kv_store.wait: a key is NULL");
        k.emplace_back(args->keys[i]);
      }
      self.store_->wait(k, std::chrono::milliseconds(args->timeout_ms));
    });
  }
  static void free_value(void*, uint8_t* value) { std::free(value); }
  static int32_t status_code(const bp_status* status) {
    return status != nullptr ? status->code : BP_STATUS_OK;
  }
  static const char* status_message(const bp_status* status) {
    return status != nullptr ? status->message.c_str() : "";
  }
  static void status_free(bp_status* status) {
    if (status != nullptr && status != out_of_memory()) delete status;
  }

  std::shared_ptr<Store> store_;
  bp_kv_store table_{};
};

}  // namespace

struct ProcessGroup::Impl {
  CollectiveRoute route{CollectiveRoute::Kind::local, nullptr, 0};
  std::shared_ptr<BackendImpl> device_backend;  // where the caller's tensors live
  int32_t device = 0;
  int32_t rank = 0;
  int32_t world_size = 1;
  std::chrono::milliseconds timeout{kDefaultTimeout};
  std::string key_prefix;
  std::unique_ptr<KvStoreBridge> bridge;  // outlives comm (declared before it is destroyed)
  bp_comm* comm = nullptr;
  std::mutex mutex;  // one collective at a time on the comm

  // Once set, every collective fails promptly with collective_error naming
  // `abort_reason`. comm_abort runs at most once (abort_mutex), and never
  // under `mutex`: abi.h lets it interrupt a collective another thread is in.
  std::atomic<bool> aborted{false};
  mutable std::mutex abort_mutex;
  std::string abort_reason;  // guarded by abort_mutex; fixed once aborted

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    // A failed rank's peers may still need the store it hosts: its failure
    // board says why this rank stopped.
    if (aborted.load(std::memory_order_acquire) && bridge && bridge->store() != nullptr)
      store_detail::linger_on_close(*bridge->store());
    if (comm == nullptr) return;
    call_logged(coll().api.comm_destroy, comm, "comm_destroy");
  }

  // Destructors and abort paths cannot throw: comm_destroy or comm_abort on
  // `c`, with a failure status, or an exception escaping the plugin
  // (call_entry's Errc::internal), logged.
  void call_logged(bp_status* (*entry)(bp_comm_args*), bp_comm* c, const char* name) const noexcept {
    try {
      bp_comm_args args{};
      args.struct_size = BP_COMM_ARGS_STRUCT_SIZE;
      args.plugin = coll().plugin;
      args.comm = c;
      bp_status* status = detail::call_entry(coll(), name, Errc::internal, entry, &args);
      if (status != nullptr) coll().check(status, where(name));
    } catch (const Error& e) {
      try {
        log(LogLevel::warning, e.message());
      } catch (...) {  // a throwing log handler loses the message, not the process
      }
    } catch (const std::exception&) {  // e.g. bad_alloc while building the message
    }
  }

  // Marks the group aborted and calls comm_abort once, so that pending and
  // later collectives on every rank's communicator fail promptly.
  void abort(const std::string& reason) noexcept {
    std::lock_guard lock(abort_mutex);
    if (aborted.load(std::memory_order_acquire)) return;
    try {
      abort_reason = reason;
    } catch (...) {
    }
    aborted.store(true, std::memory_order_release);
    if (comm == nullptr) return;
    call_logged(coll().api.comm_abort, comm, "comm_abort");
  }

  // Errc::collective_error once the group was aborted.
  void require_not_aborted(const char* op) const {
    if (!aborted.load(std::memory_order_acquire)) return;
    std::string reason;
    {
      std::lock_guard lock(abort_mutex);
      reason = abort_reason;
    }
    throw Error(Errc::collective_error, "ProcessGroup::" + std::string(op) + " on rank " +
                                            std::to_string(rank) + ": the group was aborted (" + reason +
                                            "); make a new ProcessGroup to run collectives again");
  }

  // Runs the collective entry `entry` (named `entry_name`) under the group's
  // lock. A failure, or an exception escaping the plugin (Errc::internal
  // naming the entry), aborts the communicator before it is reported (a
  // timed-out or failed collective leaves it in an unknown state; abi.h:
  // abort, then destroy).
  // A collective's span: the collective device, the dtype, the bytes in.
  [[gnu::cold]] void describe_for_trace(trace::detail::Event& e, const bp_tensor* input) const {
    BackendImpl& b = coll();
    e.device = b.trace_label(route.device);
    e.count_key = "world";
    e.count = world_size;
    if (input == nullptr) return;  // barrier
    const bp_tensor& in = *input;
    e.dtype = static_cast<int16_t>(in.dtype);
    int64_t n = 1;
    for (int32_t i = 0; i < in.ndim; ++i) n *= in.shape[i];
    e.bytes = n * static_cast<int64_t>(dtype_size(static_cast<DType>(in.dtype)));
    trace::detail::add_shape(e, in);
  }
  void run(bp_status* (*entry)(bp_collective_args*), const char* entry_name, const bp_tensor* in,
           const bp_tensor* out, int32_t reduce_op, int32_t root, const char* op) {
    require_not_aborted(op);
    bp_status* st = nullptr;
    bool called = false;
    try {
      std::lock_guard lock(mutex);
      require_not_aborted(op);
      bp_collective_args args{};
      args.struct_size = BP_COLLECTIVE_ARGS_STRUCT_SIZE;
      args.plugin = coll().plugin;
      args.comm = comm;
      args.input = in;
      args.output = out;
      args.reduce_op = reduce_op;
      args.root = root;
      called = true;
      trace::detail::Span span(trace::detail::kCatCollective, entry_name);
      if (span.on()) [[unlikely]]
        describe_for_trace(span.event(), in);
      st = detail::call_entry(coll(), entry_name, Errc::internal, entry, &args);
    } catch (const Error& e) {
      if (called) abort(e.message());  // the entry threw; the lock is released by now
      throw;
    }
    if (st == nullptr) return;
    try {
      check(st, op);
    } catch (const Error& e) {
      // abi.h: a collective refused as unsupported moved nothing, so the
      // communicator is still in step (the refusal is the same on every rank).
      if (e.code() != Errc::unsupported_op) abort(e.message());
      throw;
    }
  }

  // The bytes an in-place collective works on: the caller's own when they
  // are on the collective device (direct), else a private copy there that
  // finish() copies back. `x` must be contiguous.
  std::shared_ptr<TensorImpl> writable(const TensorImpl& x, Tensor& t, const char* op, bool& direct) const {
    direct = !staged() && x.storage->backend == route.backend && x.storage->device == route.device;
    return direct ? detail::Access::impl(t) : private_copy(x, t, op);
  }
  void finish(bool direct, const TensorImpl& work, const TensorImpl& x, const char* op) const {
    if (direct)
      x.storage->invalidate_replica();
    else
      try {
        detail::copy_dense(work, x, op);
      } catch (const Error& e) {  // the group's context is built only here
        detail::rethrow_with_context(e, where(op) + ": copy back");
      }
  }
  // An `into` collective: `input` in, the caller's `output` (checked as
  // `out`) written. Directly when its bytes are on the collective device;
  // otherwise through a fresh tensor there (nothing to copy in: it is all
  // overwritten), copied back.
  void into(bp_status* (*entry)(bp_collective_args*), const char* entry_name, const Tensor& input,
            const TensorImpl& out, Tensor& output, int32_t reduce_op, const char* name) {
    auto in = on_collective_device(input, name);
    const bool direct =
        !staged() && out.storage->backend == route.backend && out.storage->device == route.device;
    std::shared_ptr<TensorImpl> work = direct ? detail::Access::impl(output) : allocate(out.shape, out.dtype);
    const bp_tensor di = detail::describe(*in);
    const bp_tensor dout = detail::describe(*work);
    run(entry, entry_name, &di, &dout, reduce_op, 0, name);
    finish(direct, *work, out, name);
  }
  // The caller's output of an `into` collective: on this group's device,
  // contiguous, of `dtype`.
  const TensorImpl& output_operand(const Tensor& t, DType dtype, const char* op) const {
    const TensorImpl& x = operand(t, op);
    if (!detail::is_contiguous(x))
      throw Error(Errc::invalid_argument, "ProcessGroup::" + std::string(op) +
                                              ": the output must be contiguous (it is written in place)");
    if (x.dtype != dtype)
      throw Error(Errc::dtype_mismatch, "ProcessGroup::" + std::string(op) + ": the output is " +
                                            std::string(to_string(x.dtype)) + " but the input is " +
                                            std::string(to_string(dtype)));
    return x;
  }

  BackendImpl& coll() const { return *route.backend; }
  bool local() const { return route.kind == CollectiveRoute::Kind::local; }
  bool staged() const { return route.kind == CollectiveRoute::Kind::staged; }

  std::string where(const char* op) const {
    std::string s = std::string(op) + " on " + device_backend->device_id(device);
    if (staged()) s += " (staged through " + coll().device_id(route.device) + ")";
    return s + ", rank " + std::to_string(rank) + " of " + std::to_string(world_size);
  }

  // The caller's tensor, checked: defined, on this group's device.
  const TensorImpl& operand(const Tensor& t, const char* op) const {
    if (!t.defined())
      throw Error(Errc::invalid_argument, "ProcessGroup::" + std::string(op) + ": undefined Tensor");
    const TensorImpl& x = *detail::Access::impl(t);
    if (x.storage->home_backend() != device_backend.get() || x.storage->home_index() != device)
      throw Error(Errc::device_mismatch, "ProcessGroup::" + std::string(op) + ": the tensor lives on " +
                                             x.storage->home_backend()->device_id(x.storage->home_index()) +
                                             " but the group was made on " +
                                             device_backend->device_id(device) +
                                             "; move it with Tensor::to first");
    return x;
  }

  // The tensor's bytes, dense, on the collective device: the tensor itself
  // when they are there, else a copy (staged) or a replica (op placement
  // left them on its fallback device).
  std::shared_ptr<const TensorImpl> on_collective_device(const Tensor& t, const char* op) const {
    if (staged()) return detail::Access::impl(t.to(detail::Access::make_device(route.backend, route.device)));
    return detail::bytes_on(detail::as_contiguous(detail::Access::impl(t), op), route.backend, route.device,
                            op);
  }
  // A private dense copy of x on the collective device (in-place collectives).
  std::shared_ptr<TensorImpl> private_copy(const TensorImpl& x, const Tensor& t, const char* op) const {
    if (!staged() && x.storage->backend == route.backend && x.storage->device == route.device)
      return detail::copy_contiguous(x, op);
    auto out = detail::allocate_tensor(route.backend, route.device, x.shape, x.dtype, op);
    detail::copy_dense(*detail::as_contiguous(detail::Access::impl(t), op), *out, op);
    return out;
  }
  // A fresh tensor for a result, on the collective device.
  std::shared_ptr<TensorImpl> allocate(const Shape& shape, DType dtype) const {
    return detail::allocate_tensor(route.backend, route.device, shape, dtype);
  }
  // Back on the caller's device.
  Tensor result(std::shared_ptr<TensorImpl> r) const {
    Tensor out = detail::Access::make_tensor(std::move(r));
    if (staged()) return out.to(detail::Access::make_device(device_backend, device));
    return out;
  }

  void check(bp_status* status, const char* op) const { coll().check(status, where(op)); }

  // The out-of-place collectives: `tensor` (dense, on the collective device)
  // in, a fresh `out_shape` tensor out, back on the caller's device.
  Tensor out_of_place(const Tensor& tensor, const Shape& out_shape, const char* name,
                      bp_status* (*entry)(bp_collective_args*), const char* entry_name, int32_t reduce_op) {
    require_not_aborted(name);
    auto in = on_collective_device(tensor, name);
    auto out = allocate(out_shape, in->dtype);
    const bp_tensor di = detail::describe(*in);
    const bp_tensor dout = detail::describe(*out);
    run(entry, entry_name, &di, &dout, reduce_op, 0, name);
    return result(std::move(out));
  }
};

ProcessGroup ProcessGroup::create(const Device& device, const Rendezvous& rendezvous,
                                  const ProcessGroupOptions& options) {
  const auto& backend = detail::usable(device, "ProcessGroup::create");
  auto impl = std::make_shared<Impl>();
  impl->device_backend = backend;
  impl->device = device.index();
  impl->timeout = options.timeout.value_or(rendezvous.timeout());
  if (impl->timeout.count() <= 0)
    throw Error(Errc::invalid_argument, "ProcessGroup::create: the timeout must be positive, got " +
                                            std::to_string(impl->timeout.count()) + " ms");
  // Every rank takes a prefix, whatever its route, so later groups still agree.
  impl->key_prefix = rendezvous.next_group_prefix();
  impl->route = detail::resolve_collective(backend, device.index(), "ProcessGroup::create");
  if (impl->local()) {
    ProcessGroup pg;
    pg.impl_ = std::move(impl);
    return pg;
  }
  impl->rank = rendezvous.rank();
  impl->world_size = rendezvous.world_size();
  impl->bridge = std::make_unique<KvStoreBridge>(rendezvous.store());
  // A trace aligns its clocks to rank 0's with the first group (every rank
  // makes it, in the same order).
  if (trace::detail::active()) [[unlikely]]
    trace::detail::joined_job(impl->rank, impl->world_size, *rendezvous.store(), impl->key_prefix);

  bp_comm_create_args args{};
  args.struct_size = BP_COMM_CREATE_ARGS_STRUCT_SIZE;
  args.device = impl->route.device;
  args.rank = impl->rank;
  args.world_size = impl->world_size;
  args.timeout_ms = impl->timeout.count();
  args.store = impl->bridge->table();
  args.key_prefix = impl->key_prefix.c_str();
  BackendImpl& cb = impl->coll();
  args.plugin = cb.plugin;
  // A comm_create that throws hands out nothing the host could destroy.
  bp_status* st = detail::call_entry(cb, "comm_create", Errc::internal, cb.api.comm_create, &args);
  if (st != nullptr && args.comm != nullptr)  // a failing create should not hand one out; free it if it did
    impl->call_logged(cb.api.comm_destroy, args.comm, "comm_destroy");
  impl->check(st, "comm_create");
  impl->comm = args.comm;
  if (impl->comm == nullptr)
    throw Error(Errc::internal, impl->where("comm_create") + ": the plugin returned no communicator");
  ProcessGroup pg;
  pg.impl_ = std::move(impl);
  return pg;
}

namespace {
ProcessGroup::Impl& checked(const std::shared_ptr<ProcessGroup::Impl>& impl, const char* op) {
  if (!impl)
    throw Error(Errc::invalid_argument, "ProcessGroup::" + std::string(op) +
                                            ": the group is not valid (default-constructed or moved from)");
  return *impl;
}
}  // namespace

int32_t ProcessGroup::rank() const { return checked(impl_, "rank").rank; }
int32_t ProcessGroup::world_size() const { return checked(impl_, "world_size").world_size; }
Device ProcessGroup::device() const {
  const Impl& g = checked(impl_, "device");
  return detail::Access::make_device(g.device_backend, g.device);
}
Device ProcessGroup::collective_device() const {
  const Impl& g = checked(impl_, "collective_device");
  return detail::Access::make_device(g.route.backend, g.route.device);
}
bool ProcessGroup::is_local() const { return checked(impl_, "is_local").local(); }
std::chrono::milliseconds ProcessGroup::timeout() const { return checked(impl_, "timeout").timeout; }

Tensor ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op) {
  Impl& g = checked(impl_, "all_reduce");
  g.require_not_aborted("all_reduce");
  const TensorImpl& x0 = g.operand(tensor, "all_reduce");
  const int32_t rop = abi_reduce_op(op);
  if (g.local()) return detail::Access::make_tensor(detail::copy_contiguous(x0, "ProcessGroup::all_reduce"));
  return g.out_of_place(tensor, x0.shape, reducing_name(Reducing::all_reduce, op), g.coll().api.all_reduce,
                        "all_reduce", rop);
}

void ProcessGroup::all_reduce_(Tensor& tensor, ReduceOp op) {
  Impl& g = checked(impl_, "all_reduce_");
  g.require_not_aborted("all_reduce_");
  const TensorImpl& x = g.operand(tensor, "all_reduce_");
  const int32_t rop = abi_reduce_op(op);
  if (!detail::is_contiguous(x))
    throw Error(Errc::invalid_argument,
                "ProcessGroup::all_reduce_: the tensor must be contiguous (it is reduced in "
                "place); use all_reduce, which returns a new tensor");
  if (g.local()) return;
  const char* name = reducing_name(Reducing::all_reduce_, op);
  g.require_not_aborted(name);
  // In place on the caller's bytes when they are on the collective device;
  // otherwise on a private copy there, copied back.
  bool direct = false;
  std::shared_ptr<TensorImpl> work = g.writable(x, tensor, "ProcessGroup::all_reduce_", direct);
  const bp_tensor d = detail::describe(*work);
  g.run(g.coll().api.all_reduce, "all_reduce", &d, &d, rop, 0, name);
  g.finish(direct, *work, x, name);
}

void ProcessGroup::broadcast_(Tensor& tensor, int32_t root) {
  Impl& g = checked(impl_, "broadcast_");
  g.require_not_aborted("broadcast_");
  const TensorImpl& x = g.output_operand(tensor, g.operand(tensor, "broadcast_").dtype, "broadcast_");
  if (root < 0 || root >= g.world_size)
    throw Error(Errc::invalid_argument, "ProcessGroup::broadcast_: root " + std::to_string(root) +
                                            " is not a rank of this group (world_size " +
                                            std::to_string(g.world_size) + ")");
  if (g.local()) return;
  bool direct = false;
  std::shared_ptr<TensorImpl> work = g.writable(x, tensor, "ProcessGroup::broadcast_", direct);
  const bp_tensor d = detail::describe(*work);
  g.run(g.coll().api.broadcast, "broadcast", &d, &d, BP_REDUCE_SUM, root, "broadcast_");
  g.finish(direct, *work, x, "broadcast_");
}

void ProcessGroup::all_gather_into(const Tensor& input, Tensor& output) {
  Impl& g = checked(impl_, "all_gather_into");
  g.require_not_aborted("all_gather_into");
  const TensorImpl& in0 = g.operand(input, "all_gather_into");
  const TensorImpl& out = g.output_operand(output, in0.dtype, "all_gather_into");
  if (out.shape.numel() != in0.shape.numel() * g.world_size)
    throw Error(Errc::shape_mismatch,
                "ProcessGroup::all_gather_into: the output has " + std::to_string(out.shape.numel()) +
                    " elements; it must hold world_size (" + std::to_string(g.world_size) + ") x " +
                    std::to_string(in0.shape.numel()) + " (the input's)");
  if (g.local()) {
    detail::copy_dense(*detail::as_contiguous(detail::Access::impl(input), "ProcessGroup::all_gather_into"),
                       out, "ProcessGroup::all_gather_into");
    return;
  }
  g.into(g.coll().api.all_gather, "all_gather", input, out, output, BP_REDUCE_SUM, "all_gather_into");
}

void ProcessGroup::reduce_scatter_into(const Tensor& input, Tensor& output, ReduceOp op) {
  Impl& g = checked(impl_, "reduce_scatter_into");
  g.require_not_aborted("reduce_scatter_into");
  const TensorImpl& in0 = g.operand(input, "reduce_scatter_into");
  const TensorImpl& out = g.output_operand(output, in0.dtype, "reduce_scatter_into");
  const int32_t rop = abi_reduce_op(op);
  if (in0.shape.numel() != out.shape.numel() * g.world_size)
    throw Error(Errc::shape_mismatch,
                "ProcessGroup::reduce_scatter_into: the input has " + std::to_string(in0.shape.numel()) +
                    " elements; it must hold world_size (" + std::to_string(g.world_size) + ") x " +
                    std::to_string(out.shape.numel()) + " (the output's)");
  if (g.local()) {
    detail::copy_dense(
        *detail::as_contiguous(detail::Access::impl(input), "ProcessGroup::reduce_scatter_into"), out,
        "ProcessGroup::reduce_scatter_into");
    return;
  }
  g.into(g.coll().api.reduce_scatter, "reduce_scatter", input, out, output, rop,
         reducing_name(Reducing::reduce_scatter_into, op));
}

Tensor ProcessGroup::broadcast(const Tensor& tensor, int32_t root) {
  Impl& g = checked(impl_, "broadcast");
  g.require_not_aborted("broadcast");
  const TensorImpl& x0 = g.operand(tensor, "broadcast");
  if (root < 0 || root >= g.world_size)
    throw Error(Errc::invalid_argument, "ProcessGroup::broadcast: root " + std::to_string(root) +
                                            " is not a rank of this group (world_size " +
                                            std::to_string(g.world_size) + ")");
  // Broadcast works in place: always on a private copy.
  if (g.local()) return detail::Access::make_tensor(detail::copy_contiguous(x0, "ProcessGroup::broadcast"));
  std::shared_ptr<TensorImpl> work = g.private_copy(x0, tensor, "ProcessGroup::broadcast");
  const bp_tensor d = detail::describe(*work);
  g.run(g.coll().api.broadcast, "broadcast", &d, &d, BP_REDUCE_SUM, root, "broadcast");
  return g.result(std::move(work));
}

Tensor ProcessGroup::all_gather(const Tensor& tensor) {
  Impl& g = checked(impl_, "all_gather");
  g.require_not_aborted("all_gather");
  const TensorImpl& x0 = g.operand(tensor, "all_gather");
  std::vector<int64_t> dims{g.world_size};
  for (int i = 0; i < x0.shape.rank(); ++i) dims.push_back(x0.shape[i]);
  if (dims.size() > static_cast<std::size_t>(Shape::kMaxRank))
    throw Error(Errc::shape_mismatch, "ProcessGroup::all_gather: the result would have rank " +
                                          std::to_string(dims.size()) + ", above the limit of " +
                                          std::to_string(Shape::kMaxRank) + "; reshape the tensor first");
  const Shape out_shape(dims);
  if (g.local())
    return reshape(detail::Access::make_tensor(detail::copy_contiguous(x0, "ProcessGroup::all_gather")),
                   dims);
  return g.out_of_place(tensor, out_shape, "all_gather", g.coll().api.all_gather, "all_gather",
                        BP_REDUCE_SUM);
}

Tensor ProcessGroup::reduce_scatter(const Tensor& tensor, ReduceOp op) {
  Impl& g = checked(impl_, "reduce_scatter");
  g.require_not_aborted("reduce_scatter");
  const TensorImpl& x0 = g.operand(tensor, "reduce_scatter");
  const int32_t rop = abi_reduce_op(op);
  if (x0.shape.rank() < 1 || x0.shape[0] != g.world_size)
    throw Error(Errc::shape_mismatch, "ProcessGroup::reduce_scatter: the leading axis must be world_size (" +
                                          std::to_string(g.world_size) + ": one block per rank), got shape " +
                                          x0.shape.to_string());
  std::vector<int64_t> dims;
  for (int i = 1; i < x0.shape.rank(); ++i) dims.push_back(x0.shape[i]);
  const Shape out_shape(dims);
  if (g.local())
    return reshape(detail::Access::make_tensor(detail::copy_contiguous(x0, "ProcessGroup::reduce_scatter")),
                   dims);
  return g.out_of_place(tensor, out_shape, reducing_name(Reducing::reduce_scatter, op),
                        g.coll().api.reduce_scatter, "reduce_scatter", rop);
}

void ProcessGroup::barrier() {
  Impl& g = checked(impl_, "barrier");
  g.require_not_aborted("barrier");
  if (g.local()) return;
  g.run(g.coll().api.barrier, "barrier", nullptr, nullptr, BP_REDUCE_SUM, 0, "barrier");
}

void ProcessGroup::abort() {
  Impl& g = checked(impl_, "abort");
  // A local group has no communicator to interrupt; it still refuses later calls.
  g.abort("ProcessGroup::abort() was called on rank " + std::to_string(g.rank));
}

}  // namespace backplane
