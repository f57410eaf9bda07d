// ProcessGroup: validates each collective, routes it per the device's
// capability and collective_fallback (direct, staged through a host backend,
// or local), and calls the plugin's collective entries with the job's store
// exposed as bp_kv_store callbacks.
#include "internal.hpp"
#include "op_common.hpp"

#include <backplane/process_group.hpp>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

namespace backplane {

const char* to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::prod: return "prod";
  }
  return "?";
}

namespace {

using detail::BackendImpl;
using detail::CollectiveRoute;
using detail::TensorImpl;

int32_t abi_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return BP_REDUCE_SUM;
    case ReduceOp::mean: return BP_REDUCE_MEAN;
    case ReduceOp::min: return BP_REDUCE_MIN;
    case ReduceOp::max: return BP_REDUCE_MAX;
    case ReduceOp::prod: return BP_REDUCE_PROD;
  }
  throw Error(Errc::invalid_argument, "ProcessGroup: unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

// The job's Store behind the plugin-facing bp_kv_store table. Errors become
// status codes with the message kept per thread for last_error().
class KvStoreBridge {
 public:
  explicit KvStoreBridge(std::shared_ptr<Store> store) : store_(std::move(store)) {
    table_.struct_size = sizeof(bp_kv_store);
    table_.ctx = this;
    table_.set = &KvStoreBridge::set;
    table_.get = &KvStoreBridge::get;
    table_.wait = &KvStoreBridge::wait;
    table_.free_bytes = &KvStoreBridge::free_bytes;
    table_.last_error = &KvStoreBridge::last_error;
  }
  KvStoreBridge(const KvStoreBridge&) = delete;
  KvStoreBridge& operator=(const KvStoreBridge&) = delete;

  const bp_kv_store* table() const noexcept { return &table_; }

 private:
  static KvStoreBridge& self(void* ctx) { return *static_cast<KvStoreBridge*>(ctx); }
  static std::string& error_text() {
    thread_local std::string text;
    return text;
  }

  template <class F>
  static int32_t guarded(F&& f) noexcept {
    try {
      f();
      return BP_STATUS_OK;
    } catch (const Error& e) {
      error_text() = e.message();
      switch (e.code()) {
        case Errc::timeout: return BP_STATUS_TIMEOUT;
        case Errc::io_error: return BP_STATUS_IO;
        case Errc::invalid_argument: return BP_STATUS_INVALID_ARGUMENT;
        default: return BP_STATUS_INTERNAL;
      }
    } catch (const std::bad_alloc&) {
      error_text() = "out of memory in the rendezvous store";
      return BP_STATUS_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
      error_text() = e.what();
      return BP_STATUS_INTERNAL;
    }
  }

  static int32_t set(void* ctx, const char* key, const void* value, uint64_t size) {
    return guarded([&] {
      const auto* p = static_cast<const uint8_t*>(value);
      self(ctx).store_->set(key, std::vector<uint8_t>(p, p + size));
    });
  }
  static int32_t get(void* ctx, const char* key, int64_t timeout_ms, bp_kv_bytes* out) {
    return guarded([&] {
      std::vector<uint8_t> v = self(ctx).store_->get(key, std::chrono::milliseconds(timeout_ms));
      auto* data = static_cast<uint8_t*>(std::malloc(v.empty() ? 1 : v.size()));
      if (data == nullptr) throw std::bad_alloc();
      if (!v.empty()) std::memcpy(data, v.data(), v.size());
      out->data = data;
      out->size = v.size();
    });
  }
  static int32_t wait(void* ctx, const char* const* keys, int32_t num_keys, int64_t timeout_ms) {
    return guarded([&] {
      std::vector<std::string> k(keys, keys + (num_keys > 0 ? num_keys : 0));
      self(ctx).store_->wait(k, std::chrono::milliseconds(timeout_ms));
    });
  }
  static void free_bytes(void*, bp_kv_bytes* bytes) {
    if (bytes == nullptr) return;
    std::free(bytes->data);
    bytes->data = nullptr;
    bytes->size = 0;
  }
  static const char* last_error(void*) { return error_text().c_str(); }

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

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (comm != nullptr) route.backend->api.comm_destroy(route.backend->plugin, comm);
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
    if (!t.defined()) throw Error(Errc::invalid_argument, "ProcessGroup::" + std::string(op) + ": undefined Tensor");
    const TensorImpl& x = *t.impl();
    if (x.storage->backend != device_backend || x.storage->device != device)
      throw Error(Errc::device_mismatch, "ProcessGroup::" + std::string(op) + ": the tensor lives on " +
                                             x.storage->backend->device_id(x.storage->device) +
                                             " but the group was made on " + device_backend->device_id(device) +
                                             "; move it with Tensor::to first");
    return x;
  }

  // A dense copy (or the tensor itself when dense) on the collective device.
  std::shared_ptr<TensorImpl> on_collective_device(const Tensor& t, const char* op) const {
    if (staged()) return Tensor(t).to(Device(route.backend, route.device)).impl();
    return detail::as_contiguous(t.impl(), op);
  }
  // A fresh tensor for a result, on the collective device.
  std::shared_ptr<TensorImpl> allocate(const Shape& shape, DType dtype) const {
    return detail::allocate_tensor(route.backend, route.device, shape, dtype);
  }
  // Back on the caller's device.
  Tensor result(std::shared_ptr<TensorImpl> r) const {
    Tensor out(std::move(r));
    if (staged()) return out.to(Device(device_backend, device));
    return out;
  }

  void check(bp_status* status, const char* op) const { coll().check(status, where(op)); }

  // The out-of-place collectives: `tensor` (dense, on the collective device)
  // in, a fresh `out_shape` tensor out, back on the caller's device.
  // call(plugin, comm, in, out) is the plugin entry with its extra arguments.
  template <class Call>
  Tensor out_of_place(const Tensor& tensor, const Shape& out_shape, const std::string& name, Call&& call) {
    auto in = on_collective_device(tensor, ("ProcessGroup::" + name).c_str());
    auto out = allocate(out_shape, in->dtype);
    const bp_tensor di = detail::describe(*in);
    const bp_tensor dout = detail::describe(*out);
    {
      std::lock_guard lock(mutex);
      check(call(coll().plugin, comm, &di, &dout), name.c_str());
    }
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

  bp_comm_create_args args{};
  args.struct_size = sizeof(args);
  args.device = impl->route.device;
  args.rank = impl->rank;
  args.world_size = impl->world_size;
  args.timeout_ms = impl->timeout.count();
  args.store = impl->bridge->table();
  args.key_prefix = impl->key_prefix.c_str();
  BackendImpl& cb = impl->coll();
  impl->check(cb.api.comm_create(cb.plugin, &args, &impl->comm), "comm_create");
  if (impl->comm == nullptr)
    throw Error(Errc::internal, impl->where("comm_create") + ": the plugin returned no communicator");
  ProcessGroup pg;
  pg.impl_ = std::move(impl);
  return pg;
}

namespace {
ProcessGroup::Impl& checked(const std::shared_ptr<ProcessGroup::Impl>& impl, const char* op) {
  if (!impl) throw Error(Errc::invalid_argument, "ProcessGroup::" + std::string(op) + ": the group is not valid (default-constructed or moved from)");
  return *impl;
}
}  // namespace

int32_t ProcessGroup::rank() const { return checked(impl_, "rank").rank; }
int32_t ProcessGroup::world_size() const { return checked(impl_, "world_size").world_size; }
Device ProcessGroup::device() const {
  const Impl& g = checked(impl_, "device");
  return Device(g.device_backend, g.device);
}
Device ProcessGroup::collective_device() const {
  const Impl& g = checked(impl_, "collective_device");
  return Device(g.route.backend, g.route.device);
}
bool ProcessGroup::is_local() const { return checked(impl_, "is_local").local(); }
std::chrono::milliseconds ProcessGroup::timeout() const { return checked(impl_, "timeout").timeout; }

Tensor ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op) {
  Impl& g = checked(impl_, "all_reduce");
  const TensorImpl& x0 = g.operand(tensor, "all_reduce");
  const int32_t rop = abi_reduce_op(op);
  if (g.local()) return Tensor(detail::copy_contiguous(x0, "ProcessGroup::all_reduce"));
  return g.out_of_place(tensor, x0.shape, std::string("all_reduce(") + to_string(op) + ")",
                        [&](bp_plugin* p, bp_comm* c, const bp_tensor* in, const bp_tensor* out) {
                          return g.coll().api.all_reduce(p, c, in, out, rop);
                        });
}

void ProcessGroup::all_reduce_(Tensor& tensor, ReduceOp op) {
  Impl& g = checked(impl_, "all_reduce_");
  const TensorImpl& x = g.operand(tensor, "all_reduce_");
  const int32_t rop = abi_reduce_op(op);
  if (!detail::is_contiguous(x))
    throw Error(Errc::invalid_argument, "ProcessGroup::all_reduce_: the tensor must be contiguous (it is reduced in "
                                        "place); use all_reduce, which returns a new tensor");
  if (g.local()) return;
  const std::string name = std::string("all_reduce_(") + to_string(op) + ")";
  std::shared_ptr<TensorImpl> work = g.staged() ? g.on_collective_device(tensor, "ProcessGroup::all_reduce_")
                                                : tensor.impl();
  const bp_tensor d = detail::describe(*work);
  {
    std::lock_guard lock(g.mutex);
    g.check(g.coll().api.all_reduce(g.coll().plugin, g.comm, &d, &d, rop), name.c_str());
  }
  if (g.staged()) detail::copy_dense(*work, x, g.where(name.c_str()) + ": copy back");
}

Tensor ProcessGroup::broadcast(const Tensor& tensor, int32_t root) {
  Impl& g = checked(impl_, "broadcast");
  const TensorImpl& x0 = g.operand(tensor, "broadcast");
  if (root < 0 || root >= g.world_size)
    throw Error(Errc::invalid_argument, "ProcessGroup::broadcast: root " + std::to_string(root) +
                                            " is not a rank of this group (world_size " +
                                            std::to_string(g.world_size) + ")");
  // Broadcast works in place: always on a private copy.
  std::shared_ptr<TensorImpl> work =
      g.staged() ? g.on_collective_device(tensor, "ProcessGroup::broadcast")
                 : detail::copy_contiguous(x0, "ProcessGroup::broadcast");
  if (g.local()) return Tensor(std::move(work));
  const bp_tensor d = detail::describe(*work);
  {
    std::lock_guard lock(g.mutex);
    g.check(g.coll().api.broadcast(g.coll().plugin, g.comm, &d, root), "broadcast");
  }
  return g.result(std::move(work));
}

Tensor ProcessGroup::all_gather(const Tensor& tensor) {
  Impl& g = checked(impl_, "all_gather");
  const TensorImpl& x0 = g.operand(tensor, "all_gather");
  std::vector<int64_t> dims{g.world_size};
  for (int i = 0; i < x0.shape.rank(); ++i) dims.push_back(x0.shape[i]);
  if (dims.size() > static_cast<std::size_t>(Shape::kMaxRank))
    throw Error(Errc::shape_mismatch, "ProcessGroup::all_gather: the result would have rank " +
                                          std::to_string(dims.size()) + ", above the limit of " +
                                          std::to_string(Shape::kMaxRank) + "; reshape the tensor first");
  const Shape out_shape(dims);
  if (g.local()) return reshape(Tensor(detail::copy_contiguous(x0, "ProcessGroup::all_gather")), dims);
  return g.out_of_place(tensor, out_shape, "all_gather",
                        [&](bp_plugin* p, bp_comm* c, const bp_tensor* in, const bp_tensor* out) {
                          return g.coll().api.all_gather(p, c, in, out);
                        });
}

Tensor ProcessGroup::reduce_scatter(const Tensor& tensor, ReduceOp op) {
  Impl& g = checked(impl_, "reduce_scatter");
  const TensorImpl& x0 = g.operand(tensor, "reduce_scatter");
  const int32_t rop = abi_reduce_op(op);
  if (x0.shape.rank() < 1 || x0.shape[0] != g.world_size)
    throw Error(Errc::shape_mismatch, "ProcessGroup::reduce_scatter: the leading axis must be world_size (" +
                                          std::to_string(g.world_size) + ": one block per rank), got shape " +
                                          x0.shape.to_string());
  std::vector<int64_t> dims;
  for (int i = 1; i < x0.shape.rank(); ++i) dims.push_back(x0.shape[i]);
  const Shape out_shape(dims);
  if (g.local()) return reshape(Tensor(detail::copy_contiguous(x0, "ProcessGroup::reduce_scatter")), dims);
  return g.out_of_place(tensor, out_shape, std::string("reduce_scatter(") + to_string(op) + ")",
                        [&](bp_plugin* p, bp_comm* c, const bp_tensor* in, const bp_tensor* out) {
                          return g.coll().api.reduce_scatter(p, c, in, out, rop);
                        });
}

void ProcessGroup::barrier() {
  Impl& g = checked(impl_, "barrier");
  if (g.local()) return;
  std::lock_guard lock(g.mutex);
  g.check(g.coll().api.barrier(g.coll().plugin, g.comm), "barrier");
}

}  // namespace backplane
