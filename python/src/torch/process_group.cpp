// ProcessGroupBackplane (see the header): validation on the caller's thread,
// the collectives on the worker, torch tensors handed to backplane through
// DLPack (zero-copy where the device can import host memory).
#include "process_group.hpp"

#include "store_adapter.hpp"

#include <backplane/dlpack.hpp>
#include <backplane/error.hpp>

#include <Python.h>

#include <ATen/DLConvertor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <numeric>
#include <stdexcept>
#include <utility>

namespace backplane::torch_bridge {
namespace {

using c10d::ReduceOp;

// ---- Work -------------------------------------------------------------------

// A Work completed by the worker: wait() and get_future() behave as gloo's
// (the future's value is the output tensors; DDP's reducer reads it).
class BridgeWork final : public c10d::Work {
 public:
  BridgeWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs, int source_rank)
      : c10d::Work(rank, type, title),
        outputs_(std::move(outputs)),
        source_rank_(source_rank),
        future_(c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  void succeed() {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  }
  void fail(std::exception_ptr e) {
    future_->setError(e);
    finish(e);
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  int sourceRank() const override {
    TORCH_CHECK(source_rank_ >= 0, "sourceRank() is only known for a completed recv");
    return source_rank_;
  }

 private:
  std::vector<at::Tensor> outputs_;
  int source_rank_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

// What a failure in flight becomes: a RuntimeError in Python (a backplane
// message, which names backend, device, rank and peer).
std::exception_ptr as_runtime_error(const std::exception& e) {
  return std::make_exception_ptr(std::runtime_error(std::string("backplane: ") + e.what()));
}

// ---- dtypes and reduce ops --------------------------------------------------

// The backplane dtype that carries a torch dtype: bool as u8 (0/1) and
// complex as pairs of reals; nullopt for a dtype backplane has no type for.
std::optional<DType> carrier(at::ScalarType s) {
  switch (s) {
    case at::kFloat:
    case at::kComplexFloat:
      return DType::f32;
    case at::kDouble:
    case at::kComplexDouble:
      return DType::f64;
    case at::kHalf:
      return DType::f16;
    case at::kBFloat16:
      return DType::bf16;
    case at::kInt:
      return DType::i32;
    case at::kLong:
      return DType::i64;
    case at::kByte:
    case at::kBool:
      return DType::u8;
    case at::kChar:
      return DType::i8;
    default:
      return std::nullopt;
  }
}

const char* reduce_op_name(ReduceOp op) {
  switch (op.op_) {
    case ReduceOp::SUM:
      return "SUM";
    case ReduceOp::AVG:
      return "AVG";
    case ReduceOp::PRODUCT:
      return "PRODUCT";
    case ReduceOp::MIN:
      return "MIN";
    case ReduceOp::MAX:
      return "MAX";
    case ReduceOp::BAND:
      return "BAND";
    case ReduceOp::BOR:
      return "BOR";
    case ReduceOp::BXOR:
      return "BXOR";
    case ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNUSED";
  }
}

bool bitwise(ReduceOp op) {
  return op.op_ == ReduceOp::BAND || op.op_ == ReduceOp::BOR || op.op_ == ReduceOp::BXOR;
}

// The reduce op a device runs for (torch op, dtype); bitwise ops have none
// (they are composed from an all_gather). bool rides as u8 0/1, where SUM
// and PRODUCT are gloo's logical or / and.
backplane::ReduceOp native_op(ReduceOp op, at::ScalarType s) {
  const bool is_bool = s == at::kBool;
  switch (op.op_) {
    case ReduceOp::SUM:
      return is_bool ? backplane::ReduceOp::max : backplane::ReduceOp::sum;
    case ReduceOp::AVG:
      return backplane::ReduceOp::mean;
    case ReduceOp::PRODUCT:
      return is_bool ? backplane::ReduceOp::min : backplane::ReduceOp::prod;
    case ReduceOp::MIN:
      return backplane::ReduceOp::min;
    case ReduceOp::MAX:
      return backplane::ReduceOp::max;
    case ReduceOp::BAND:
      return backplane::ReduceOp::min;  // bool only (see check_reduce)
    case ReduceOp::BOR:
      return backplane::ReduceOp::max;  // bool only
    default:
      throw std::logic_error("native_op: no native reduction");
  }
}
// Whether native_op covers (op, dtype); otherwise the all_gather composition.
bool runs_natively(ReduceOp op, at::ScalarType s) {
  if (!bitwise(op)) return true;
  return s == at::kBool && op.op_ != ReduceOp::BXOR;
}

// ---- tensors ----------------------------------------------------------------

// t as the flat backplane carrier: contiguous input, a 1-D view of the same
// memory (u8 for bool, reals for complex).
at::Tensor carried(const at::Tensor& contiguous) {
  at::Tensor c = contiguous;
  if (c.is_complex()) c = at::view_as_real(c);
  if (c.scalar_type() == at::kBool) c = c.view(at::kByte);
  return c.reshape({-1});
}

// A backplane tensor over `flat` (carried()): zero-copy where the target
// imports torch's memory, else a copy on the device that writeback() returns.
Tensor wrap(const Target& tg, const at::Tensor& flat) {
  if (tg.zero_copy || flat.is_cuda()) return from_dlpack(at::toDLPack(flat), tg.device);
  return Tensor::from_bytes(tg.device, Shape({flat.numel()}), *carrier(flat.scalar_type()), flat.data_ptr(),
                            static_cast<std::size_t>(flat.numel()));
}
void writeback(const Target& tg, const Tensor& b, const at::Tensor& flat) {
  if (tg.zero_copy || flat.is_cuda()) return;
  b.read_into(*carrier(flat.scalar_type()), flat.data_ptr(), static_cast<std::size_t>(flat.numel()));
}

// Runs f on a contiguous version of t (t itself when it is), then copies the
// result into t when it was not.
template <class F>
void in_place(const at::Tensor& t, F&& f) {
  if (t.is_contiguous()) {
    f(t);
    return;
  }
  at::Tensor c = t.contiguous();
  f(c);
  t.copy_(c);
}

// Tensors on a CUDA device are imported only after torch's work on them is
// done: the bridge knows nothing of torch's streams.
void settle(const at::Tensor& t) {
  if (!t.is_cuda()) return;
  c10::impl::VirtualGuardImpl impl(t.device().type());
  impl.getStream(t.device()).synchronize();
}

std::string device_type_of(const at::Tensor& t) { return c10::DeviceTypeName(t.device().type(), true); }

// ---- checks on the caller's thread (identical on every rank) ----------------

void check_single(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "backplane: ", op, " takes one tensor per process (got ", tensors.size(),
              "); one process per device, as with NCCL");
}

void check_dtype(const at::Tensor& t, const Target& tg, const char* op) {
  const auto c = carrier(t.scalar_type());
  TORCH_CHECK(c.has_value(), "backplane: ", op, ": dtype ", t.scalar_type(),
              " has no backplane type (supported: float32, float64, float16, bfloat16, int32, int64, uint8, "
              "int8, bool, complex64, complex128)");
  TORCH_CHECK(tg.device.capabilities().has(capability_for(*c)), "backplane: ", op, ": ", tg.label,
              " lacks capability '", std::string(to_string(capability_for(*c))), "' needed for ",
              t.scalar_type(), " tensors; use another dtype or map torch's ", device_type_of(t),
              " device to another backend (\"torch_devices\" in backends.json)");
}

void check_reduce(const at::Tensor& t, ReduceOp op, const char* name) {
  TORCH_CHECK(op.op_ != ReduceOp::PREMUL_SUM, "backplane: ", name,
              ": ReduceOp.PREMUL_SUM is not supported (it is NCCL's); scale the tensor and use SUM");
  TORCH_CHECK(op.op_ <= ReduceOp::BXOR, "backplane: ", name, ": unknown ReduceOp ", static_cast<int>(op.op_));
  if (bitwise(op))
    TORCH_CHECK(!at::isFloatingType(t.scalar_type()) && !t.is_complex(), "backplane: ", name, ": ReduceOp.",
                reduce_op_name(op), " needs an integer or bool tensor, got ", t.scalar_type());
  if (t.is_complex())
    TORCH_CHECK(op.op_ == ReduceOp::SUM || op.op_ == ReduceOp::AVG, "backplane: ", name, ": ReduceOp.",
                reduce_op_name(op), " is not defined on complex tensors (SUM and AVG are)");
  if (t.scalar_type() == at::kBool)
    TORCH_CHECK(op.op_ != ReduceOp::AVG, "backplane: ", name,
                ": ReduceOp.AVG is not defined on bool tensors");
}

void check_same_dtype(const std::vector<at::Tensor>& tensors, at::ScalarType s, const char* op) {
  for (const at::Tensor& t : tensors)
    TORCH_CHECK(t.scalar_type() == s, "backplane: ", op, ": every tensor must have dtype ", s, ", got ",
                t.scalar_type());
}

void check_numel(const at::Tensor& t, int64_t numel, const char* op, const char* what) {
  TORCH_CHECK(t.numel() == numel, "backplane: ", op, ": ", what, " has ", t.numel(), " elements, expected ",
              numel);
}

void check_rank(int64_t r, int size, const char* op, const char* what) {
  TORCH_CHECK(r >= 0 && r < size, "backplane: ", op, ": ", what, " ", r,
              " is not a rank of this group (size ", size, ")");
}

}  // namespace

// ---- Executor ---------------------------------------------------------------

Executor::Executor() : thread_([this] { loop(); }) {}

Executor::~Executor() { shutdown(); }

void Executor::shutdown() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Executor::busy() {
  std::lock_guard lock(mutex_);
  return running_ || !queue_.empty();
}

void Executor::post(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
  }
  ready_.notify_one();
}

void Executor::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything ran
      task = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    task();          // never throws: enqueue's bodies catch
    task = nullptr;  // its tensors go before the executor reads as idle
    std::lock_guard lock(mutex_);
    running_ = false;
  }
}

// ---- the group --------------------------------------------------------------

ProcessGroupBackplane::ProcessGroupBackplane(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             std::chrono::milliseconds timeout, Registry registry)
    : c10d::ProcessGroup(rank, size),
      registry_(std::move(registry)),
      store_(store),
      timeout_(timeout),
      rendezvous_(Rendezvous::with_store(
          rank, size, std::make_shared<C10dStoreAdapter>(store, "backplane/", timeout), timeout)) {
  TORCH_CHECK(timeout.count() > 0, "backplane: the process group's timeout must be positive");
  // The cpu group now: a capability or fallback error belongs to init_process_group.
  Target& cpu = target(at::empty({0}), "init_process_group");
  group(cpu);
  cpu_target_ = &cpu;
  init();
}

namespace {
// Releases the GIL for a scope when this thread holds it. Python destroys the
// group holding the GIL, while a worker finishing its task may need it (a
// tensor whose last reference the worker drops frees its Python object).
class GilReleased {
 public:
  GilReleased() : state_(Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~GilReleased() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* state_;
};
}  // namespace

ProcessGroupBackplane::~ProcessGroupBackplane() {
  GilReleased unlocked;
  // Work still queued or running at destruction (an irecv never matched, a
  // collective other ranks never join) fails now instead of at the timeout:
  // its group is aborted first. An idle group is left to close cleanly.
  std::vector<Executor*> executors{&executor_};
  std::vector<backplane::ProcessGroup*> groups;
  {
    std::lock_guard lock(channels_mutex_);
    for (auto& [key, ch] : channels_) {
      if (ch->executor.busy() && ch->group) groups.push_back(ch->group.get());
      executors.push_back(&ch->executor);
    }
  }
  if (executor_.busy()) {
    std::lock_guard lock(targets_mutex_);
    for (auto& [key, tg] : targets_)
      if (tg->group) groups.push_back(tg->group.get());
  }
  for (backplane::ProcessGroup* g : groups) {
    try {
      g->abort();
    } catch (const std::exception&) {  // a destructor cannot fail; the join below still ends
    }
  }
  for (Executor* e : executors) e->shutdown();
  channels_.clear();
  targets_.clear();
}

Target& ProcessGroupBackplane::target(const at::Tensor& t, const char* op) {
  // The common case, without a string or a lock: the cpu target exists from
  // the constructor on and never changes.
  if (t.device().is_cpu() && cpu_target_ != nullptr) return *cpu_target_;
  const std::string type = device_type_of(t);
  const int32_t index = t.device().has_index() ? t.device().index() : 0;
  const std::string key = type + ":" + std::to_string(index);
  std::lock_guard lock(targets_mutex_);
  auto it = targets_.find(key);
  if (it != targets_.end()) return *it->second;
  std::optional<Backend> backend;
  try {
    backend = registry_.torch_backend(type);
  } catch (const Error& e) {
    TORCH_CHECK(false, "backplane: ", op, ": ", e.what());
  }
  TORCH_CHECK(backend.has_value(), "backplane: ", op, ": no backend serves torch's ", type,
              " tensors; name one in backends.json: \"torch_devices\": {\"", type, "\": \"<backend>\"}");
  TORCH_CHECK(backend->loaded(), "backplane: ", op, ": backend \"", backend->name(),
              "\", which serves torch's ", type, " tensors, is not loaded: ", backend->error());
  TORCH_CHECK(index < backend->device_count(), "backplane: ", op, ": backend \"", backend->name(), "\" has ",
              backend->device_count(), " device(s); torch's ", key, " has no counterpart");
  auto tg = std::make_unique<Target>();
  tg->device = backend->device(index);
  const Capabilities caps = tg->device.capabilities();
  tg->zero_copy = caps.has(Capability::host_visible) && !caps.has(Capability::remote);
  tg->label = tg->device.id() + " (backend " + backend->name() + ")";
  return *targets_.emplace(key, std::move(tg)).first->second;
}

backplane::ProcessGroup& ProcessGroupBackplane::group(Target& tg) {
  // Only the worker (and the constructor, before it runs) makes groups; every
  // rank makes them in the same order, so their store prefixes agree.
  if (!tg.group) {
    ProcessGroupOptions options;
    options.timeout = timeout_;
    tg.group = std::make_unique<backplane::ProcessGroup>(
        backplane::ProcessGroup::create(tg.device, rendezvous_, options));
  }
  return *tg.group;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::enqueue(c10d::OpType type, const char* title,
                                                              std::vector<at::Tensor> outputs,
                                                              std::function<void()> body, Executor* on,
                                                              int source_rank) {
  auto work = c10::make_intrusive<BridgeWork>(rank_, type, title, std::move(outputs), source_rank);
  (on != nullptr ? on : &executor_)->post([work, body = std::move(body)] {
    try {
      body();
    } catch (const std::exception& e) {
      work->fail(as_runtime_error(e));
      return;
    } catch (...) {
      work->fail(std::make_exception_ptr(std::runtime_error("backplane: an unknown exception")));
      return;
    }
    work->succeed();
  });
  return work;
}

void ProcessGroupBackplane::allreduce_now(Target& tg, const at::Tensor& t, ReduceOp op) {
  backplane::ProcessGroup& g = group(tg);
  if (t.numel() == 0) return;
  settle(t);
  in_place(t, [&](const at::Tensor& c) {
    at::Tensor flat = carried(c);
    if (runs_natively(op, t.scalar_type())) {
      Tensor b = wrap(tg, flat);
      g.all_reduce_(b, native_op(op, t.scalar_type()));
      writeback(tg, b, flat);
      return;
    }
    // BAND/BOR/BXOR: every rank's tensor, combined here (gloo's rules).
    TORCH_CHECK(
        !g.is_local(), "backplane: allreduce(", reduce_op_name(op), ") on ", tg.label,
        ": its backend trains locally (collective_fallback \"local\"), so there are no peers' values");
    at::Tensor all = at::empty({size_, flat.numel()}, flat.options());
    Tensor bin = wrap(tg, flat);
    Tensor bout = wrap(tg, all.view({-1}));
    g.all_gather_into(bin, bout);
    writeback(tg, bout, all.view({-1}));
    at::Tensor acc = all[0].clone();
    for (int r = 1; r < size_; ++r) {
      if (op.op_ == ReduceOp::BAND)
        acc.bitwise_and_(all[r]);
      else if (op.op_ == ReduceOp::BOR)
        acc.bitwise_or_(all[r]);
      else
        acc.bitwise_xor_(all[r]);
    }
    flat.copy_(acc);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::allreduce(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceOptions& opts) {
  check_single(tensors, "allreduce");
  const at::Tensor t = tensors[0];
  Target& tg = target(t, "allreduce");
  check_dtype(t, tg, "allreduce");
  check_reduce(t, opts.reduceOp, "allreduce");
  const ReduceOp op = opts.reduceOp;
  return enqueue(c10d::OpType::ALLREDUCE, "backplane:all_reduce", tensors,
                 [this, &tg, t, op] { allreduce_now(tg, t, op); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "backplane: allreduce_coalesced: no tensors");
  const at::Tensor first = tensors[0];
  Target& tg = target(first, "allreduce_coalesced");
  check_dtype(first, tg, "allreduce_coalesced");
  check_same_dtype(tensors, first.scalar_type(), "allreduce_coalesced");
  for (const at::Tensor& t : tensors)
    TORCH_CHECK(t.device() == first.device(), "backplane: allreduce_coalesced: every tensor must be on ",
                first.device(), ", got ", t.device());
  check_reduce(first, opts.reduceOp, "allreduce_coalesced");
  const ReduceOp op = opts.reduceOp;
  std::vector<at::Tensor> ts = tensors;
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "backplane:allreduce_coalesced", tensors,
                 [this, &tg, ts, op] {
                   // One flat buffer, reduced once, then split back.
                   std::vector<at::Tensor> flats;
                   for (const at::Tensor& t : ts) flats.push_back(t.reshape({-1}));
                   at::Tensor flat = at::cat(flats);
                   allreduce_now(tg, flat, op);
                   int64_t offset = 0;
                   for (const at::Tensor& t : ts) {
                     t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
                     offset += t.numel();
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::reduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::ReduceOptions& opts) {
  check_single(tensors, "reduce");
  check_rank(opts.rootRank, size_, "reduce", "root");
  const at::Tensor t = tensors[0];
  Target& tg = target(t, "reduce");
  check_dtype(t, tg, "reduce");
  check_reduce(t, opts.reduceOp, "reduce");
  const ReduceOp op = opts.reduceOp;
  const bool root = opts.rootRank == rank_;
  return enqueue(c10d::OpType::REDUCE, "backplane:reduce", tensors, [this, &tg, t, op, root] {
    // An all-reduce; ranks other than the root keep their tensor as it was.
    allreduce_now(tg, root ? t : t.clone(), op);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::broadcast(std::vector<at::Tensor>& tensors,
                                                                const c10d::BroadcastOptions& opts) {
  check_single(tensors, "broadcast");
  check_rank(opts.rootRank, size_, "broadcast", "root");
  TORCH_CHECK(opts.rootTensor == 0, "backplane: broadcast: rootTensor must be 0 (one tensor per process)");
  const at::Tensor t = tensors[0];
  Target& tg = target(t, "broadcast");
  check_dtype(t, tg, "broadcast");
  const int32_t root = static_cast<int32_t>(opts.rootRank);
  return enqueue(c10d::OpType::BROADCAST, "backplane:broadcast", tensors, [this, &tg, t, root] {
    backplane::ProcessGroup& g = group(tg);
    if (t.numel() == 0) return;
    settle(t);
    in_place(t, [&](const at::Tensor& c) {
      at::Tensor flat = carried(c);
      Tensor b = wrap(tg, flat);
      g.broadcast_(b, root);
      writeback(tg, b, flat);
    });
  });
}

namespace {

// Every rank's `input` gathered into `out` (contiguous, world x input's
// elements, input's dtype) through group g.
void gather_all(backplane::ProcessGroup& g, const Target& tg, const at::Tensor& input,
                const at::Tensor& out) {
  TORCH_CHECK(!g.is_local(), "backplane: all_gather on ", tg.label,
              ": its backend trains locally (collective_fallback \"local\"), so there are no peers' tensors");
  settle(input);
  at::Tensor in_flat = carried(input.contiguous());
  at::Tensor out_flat = carried(out);
  if (out_flat.numel() == 0) return;
  Tensor bin = wrap(tg, in_flat);
  Tensor bout = wrap(tg, out_flat);
  g.all_gather_into(bin, bout);
  writeback(tg, bout, out_flat);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions&) {
  check_single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
              "backplane: allgather: expected ", "one output list of ", size_, " tensors (the group's size)");
  const at::Tensor in = inputs[0];
  Target& tg = target(in, "allgather");
  check_dtype(in, tg, "allgather");
  for (const at::Tensor& o : outputs[0]) {
    TORCH_CHECK(o.scalar_type() == in.scalar_type(), "backplane: allgather: output dtype ", o.scalar_type(),
                " differs from the input's ", in.scalar_type());
    check_numel(o, in.numel(), "allgather", "an output tensor");
  }
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(c10d::OpType::ALLGATHER, "backplane:all_gather", outs, [this, &tg, in, outs] {
    std::vector<int64_t> dims{size_};
    for (int64_t d : in.sizes()) dims.push_back(d);
    at::Tensor all = at::empty(dims, in.options().memory_format(at::MemoryFormat::Contiguous));
    gather_all(group(tg), tg, in, all);
    for (int r = 0; r < size_; ++r) outs[r].copy_(all[r]);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::AllgatherOptions&) {
  Target& tg = target(input, "_allgather_base");
  check_dtype(input, tg, "_allgather_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "backplane: _allgather_base: output dtype ",
              output.scalar_type(), " differs from the input's ", input.scalar_type());
  check_numel(output, input.numel() * size_, "_allgather_base", "the output");
  const at::Tensor in = input, out = output;
  return enqueue(c10d::OpType::_ALLGATHER_BASE, "backplane:_allgather_base", {output}, [this, &tg, in, out] {
    in_place(out, [&](const at::Tensor& c) { gather_all(group(tg), tg, in, c); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  TORCH_CHECK(!inputs.empty(), "backplane: allgather_coalesced: no tensors");
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_, "backplane: allgather_coalesced: expected ", size_,
              " output lists (the group's size), got ", outputs.size());
  Target& tg = target(inputs[0], "allgather_coalesced");
  check_dtype(inputs[0], tg, "allgather_coalesced");
  check_same_dtype(inputs, inputs[0].scalar_type(), "allgather_coalesced");
  for (const auto& list : outputs) {
    TORCH_CHECK(list.size() == inputs.size(), "backplane: allgather_coalesced: each output list must hold ",
                inputs.size(), " tensors, one per input");
    for (std::size_t i = 0; i < list.size(); ++i)
      check_numel(list[i], inputs[i].numel(), "allgather_coalesced", "an output tensor");
  }
  std::vector<at::Tensor> ins = inputs;
  std::vector<std::vector<at::Tensor>> outs = outputs;
  std::vector<at::Tensor> all_outs;
  for (const auto& list : outputs) all_outs.insert(all_outs.end(), list.begin(), list.end());
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, "backplane:allgather_coalesced", all_outs,
                 [this, &tg, ins, outs] {
                   std::vector<at::Tensor> flats;
                   for (const at::Tensor& t : ins) flats.push_back(t.reshape({-1}));
                   at::Tensor flat = at::cat(flats);
                   at::Tensor all = at::empty({size_, flat.numel()}, flat.options());
                   gather_all(group(tg), tg, flat, all);
                   for (int r = 0; r < size_; ++r) {
                     int64_t offset = 0;
                     for (std::size_t i = 0; i < ins.size(); ++i) {
                       outs[r][i].copy_(all[r].narrow(0, offset, ins[i].numel()).view(outs[r][i].sizes()));
                       offset += ins[i].numel();
                     }
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::GatherOptions& opts) {
  check_single(inputs, "gather");
  check_rank(opts.rootRank, size_, "gather", "root");
  const bool root = opts.rootRank == rank_;
  const at::Tensor in = inputs[0];
  Target& tg = target(in, "gather");
  check_dtype(in, tg, "gather");
  std::vector<at::Tensor> outs;
  if (root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "backplane: gather: the root ", "needs one output list of ", size_, " tensors");
    for (const at::Tensor& o : outputs[0]) check_numel(o, in.numel(), "gather", "an output tensor");
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "backplane: gather: only the root (rank ", opts.rootRank, ") takes output tensors");
  }
  // An all-gather that only the root keeps: the plugins have no rooted gather.
  return enqueue(c10d::OpType::GATHER, "backplane:gather", outs, [this, &tg, in, outs] {
    std::vector<int64_t> dims{size_};
    for (int64_t d : in.sizes()) dims.push_back(d);
    at::Tensor all = at::empty(dims, in.options().memory_format(at::MemoryFormat::Contiguous));
    gather_all(group(tg), tg, in, all);
    for (std::size_t r = 0; r < outs.size(); ++r) outs[r].copy_(all[static_cast<int64_t>(r)]);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::scatter(std::vector<at::Tensor>& outputs,
                                                              std::vector<std::vector<at::Tensor>>& inputs,
                                                              const c10d::ScatterOptions& opts) {
  check_single(outputs, "scatter");
  check_rank(opts.rootRank, size_, "scatter", "root");
  const bool root = opts.rootRank == rank_;
  const at::Tensor out = outputs[0];
  Target& tg = target(out, "scatter");
  check_dtype(out, tg, "scatter");
  std::vector<at::Tensor> ins;
  if (root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "backplane: scatter: the root ", "needs one input list of ", size_, " tensors");
    for (const at::Tensor& i : inputs[0]) check_numel(i, out.numel(), "scatter", "an input tensor");
    check_same_dtype(inputs[0], out.scalar_type(), "scatter");
    ins = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "backplane: scatter: only the root (rank ", opts.rootRank, ") takes input tensors");
  }
  const int32_t root_rank = static_cast<int32_t>(opts.rootRank);
  // The root's inputs broadcast as one buffer; each rank keeps its block.
  return enqueue(c10d::OpType::SCATTER, "backplane:scatter", outputs, [this, &tg, out, ins, root_rank] {
    backplane::ProcessGroup& g = group(tg);
    TORCH_CHECK(!g.is_local(), "backplane: scatter on ", tg.label,
                ": its backend trains locally (collective_fallback \"local\"), so there are no peers");
    std::vector<int64_t> dims{size_};
    for (int64_t d : out.sizes()) dims.push_back(d);
    at::Tensor all = ins.empty() ? at::empty(dims, out.options().memory_format(at::MemoryFormat::Contiguous))
                                 : at::stack(ins).contiguous();
    if (all.numel() > 0) {
      at::Tensor flat = carried(all);
      Tensor b = wrap(tg, flat);
      g.broadcast_(b, root_rank);
      writeback(tg, b, flat);
    }
    out.copy_(all[rank_]);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  check_single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "backplane: reduce_scatter: ", "expected one input list of ", size_,
              " tensors (the group's size)");
  const at::Tensor out = outputs[0];
  Target& tg = target(out, "reduce_scatter");
  check_dtype(out, tg, "reduce_scatter");
  check_same_dtype(inputs[0], out.scalar_type(), "reduce_scatter");
  for (const at::Tensor& i : inputs[0]) check_numel(i, out.numel(), "reduce_scatter", "an input tensor");
  check_reduce(out, opts.reduceOp, "reduce_scatter");
  std::vector<at::Tensor> ins = inputs[0];
  const ReduceOp op = opts.reduceOp;
  return enqueue(c10d::OpType::REDUCE_SCATTER, "backplane:reduce_scatter", outputs,
                 [this, &tg, out, ins, op] { reduce_scatter_now(tg, at::stack(ins), out, op); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  Target& tg = target(output, "_reduce_scatter_base");
  check_dtype(output, tg, "_reduce_scatter_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "backplane: _reduce_scatter_base: input dtype ",
              input.scalar_type(), " differs from the output's ", output.scalar_type());
  check_numel(input, output.numel() * size_, "_reduce_scatter_base", "the input");
  check_reduce(output, opts.reduceOp, "_reduce_scatter_base");
  const at::Tensor in = input, out = output;
  const ReduceOp op = opts.reduceOp;
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "backplane:_reduce_scatter_base", {output},
                 [this, &tg, in, out, op] {
                   reduce_scatter_now(tg, in.reshape({size_, -1}), out, op);
                 });
}

void ProcessGroupBackplane::reduce_scatter_now(Target& tg, const at::Tensor& blocks, const at::Tensor& out,
                                               ReduceOp op) {
  backplane::ProcessGroup& g = group(tg);
  if (!runs_natively(op, out.scalar_type()) || g.is_local()) {
    at::Tensor all = blocks.clone();  // composed (bitwise) or local: reduce all, keep ours
    allreduce_now(tg, all, op);
    out.copy_(all[rank_].view(out.sizes()));
    return;
  }
  const at::Tensor all = blocks.contiguous();
  settle(all);
  in_place(out, [&](const at::Tensor& c) {
    at::Tensor in_flat = carried(all);
    at::Tensor out_flat = carried(c);
    if (out_flat.numel() == 0) return;
    Tensor bin = wrap(tg, in_flat);
    Tensor bout = wrap(tg, out_flat);
    g.reduce_scatter_into(bin, bout, native_op(op, out.scalar_type()));
    writeback(tg, bout, out_flat);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                    std::vector<int64_t>& output_splits,
                                                                    std::vector<int64_t>& input_splits,
                                                                    const c10d::AllToAllOptions&) {
  Target& tg = target(input, "alltoall_base");
  check_dtype(input, tg, "alltoall_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "backplane: alltoall_base: output dtype ",
              output.scalar_type(), " differs from the input's ", input.scalar_type());
  TORCH_CHECK(input.dim() >= 1 && output.dim() >= 1,
              "backplane: alltoall_base: tensors need a first dimension");
  const int64_t in_rows = input.size(0), out_rows = output.size(0);
  const int64_t row = in_rows > 0 ? input.numel() / in_rows : 0;
  std::vector<int64_t> in_splits = input_splits, out_splits = output_splits;
  const auto check_splits = [&](std::vector<int64_t>& splits, int64_t rows, const char* what) {
    if (splits.empty()) {
      TORCH_CHECK(rows % size_ == 0, "backplane: alltoall_base: the ", what, "'s first dimension (", rows,
                  ") must divide by the group's size (", size_, ") when no split sizes are given");
      splits.assign(size_, rows / size_);
    }
    TORCH_CHECK(static_cast<int>(splits.size()) == size_, "backplane: alltoall_base: ", what,
                " split sizes need ", size_, " entries, got ", splits.size());
    for (int64_t s : splits) TORCH_CHECK(s >= 0, "backplane: alltoall_base: a negative split size");
    TORCH_CHECK(std::accumulate(splits.begin(), splits.end(), int64_t{0}) == rows,
                "backplane: alltoall_base: the ", what, " split sizes add up to ",
                std::accumulate(splits.begin(), splits.end(), int64_t{0}), ", not its first dimension ",
                rows);
  };
  check_splits(in_splits, in_rows, "input");
  check_splits(out_splits, out_rows, "output");
  TORCH_CHECK(out_rows == 0 || output.numel() / out_rows == row || in_rows == 0,
              "backplane: alltoall_base: input and output rows differ in size");
  const at::Tensor in = input, out = output;
  return enqueue(
      c10d::OpType::ALLTOALL_BASE, "backplane:alltoall_base", {output},
      [this, &tg, in, out, in_splits, out_splits, row] {
        backplane::ProcessGroup& g = group(tg);
        // Every rank's split sizes, then every rank's rows (padded to the
        // longest); each rank keeps the blocks addressed to it.
        at::Tensor mine = at::tensor(in_splits, at::TensorOptions().dtype(at::kLong));
        at::Tensor splits = at::empty({size_, size_}, mine.options());
        gather_all(g, tg, mine, splits);
        const int64_t longest = splits.sum(1).max().item<int64_t>();
        at::Tensor padded = at::zeros({longest * row}, in.options());
        if (in.numel() > 0) padded.narrow(0, 0, in.numel()).copy_(in.reshape({-1}));
        at::Tensor all = at::empty({size_, longest * row}, in.options());
        gather_all(g, tg, padded, all);
        at::Tensor out_flat = out.is_contiguous() ? out.view({-1}) : at::empty({out.numel()}, out.options());
        int64_t at_row = 0;
        for (int j = 0; j < size_; ++j) {
          const int64_t from = splits[j].narrow(0, 0, rank_).sum().item<int64_t>();
          const int64_t count = splits[j][rank_].item<int64_t>();
          TORCH_CHECK(count == out_splits[j], "backplane: alltoall_base: rank ", j, " sends ", count,
                      " rows here but the output split sizes expect ", out_splits[j]);
          if (count > 0)
            out_flat.narrow(0, at_row * row, count * row).copy_(all[j].narrow(0, from * row, count * row));
          at_row += count;
        }
        if (!out.is_contiguous()) out.copy_(out_flat.view(out.sizes()));
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::barrier(const c10d::BarrierOptions&) {
  return enqueue(c10d::OpType::BARRIER, "backplane:barrier", {}, [this] {
    Target& tg = target(at::empty({0}), "barrier");
    group(tg).barrier();
  });
}

ProcessGroupBackplane::Channel& ProcessGroupBackplane::channel(int src, int dst, int tag, const Target& tg) {
  std::lock_guard lock(channels_mutex_);
  auto key = std::make_tuple(src, dst, tag, tg.device.id());
  auto it = channels_.find(key);
  if (it == channels_.end()) it = channels_.emplace(key, std::make_unique<Channel>()).first;
  return *it->second;
}

namespace {
// A send/recv pair as a 2-rank group, the sender its rank 0: its own store
// namespace, made on the channel's thread when the first message goes.
backplane::ProcessGroup& pair_group(std::unique_ptr<backplane::ProcessGroup>& slot,
                                    const c10::intrusive_ptr<c10d::Store>& store, int src, int dst, int tag,
                                    const Target& tg, bool sender, std::chrono::milliseconds timeout) {
  if (!slot) {
    const std::string prefix = "backplane/p2p/" + std::to_string(src) + ">" + std::to_string(dst) + "/" +
                               std::to_string(tag) + "/" + tg.device.id() + "/";
    Rendezvous rv = Rendezvous::with_store(
        sender ? 0 : 1, 2, std::make_shared<C10dStoreAdapter>(store, prefix, timeout), timeout);
    ProcessGroupOptions options;
    options.timeout = timeout;
    slot = std::make_unique<backplane::ProcessGroup>(backplane::ProcessGroup::create(tg.device, rv, options));
    TORCH_CHECK(!slot->is_local(), "backplane: send/recv on ", tg.label,
                ": its backend trains locally (collective_fallback \"local\"), so there is no peer to reach");
  }
  return *slot;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                           int tag) {
  return point_to_point(tensors, dst_rank, tag, true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                           int tag) {
  return point_to_point(tensors, src_rank, tag, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::point_to_point(std::vector<at::Tensor>& tensors,
                                                                     int peer, int tag, bool sending) {
  const char* op = sending ? "send" : "recv";
  check_single(tensors, op);
  check_rank(peer, size_, op, sending ? "destination" : "source");
  TORCH_CHECK(peer != rank_, "backplane: ", op, ": rank ", rank_,
              sending ? " cannot send to itself" : " cannot receive from itself");
  const at::Tensor t = tensors[0];
  Target& tg = target(t, op);
  check_dtype(t, tg, op);
  const int src = sending ? rank_ : peer;
  const int dst = sending ? peer : rank_;
  Channel& ch = channel(src, dst, tag, tg);
  return enqueue(
      sending ? c10d::OpType::SEND : c10d::OpType::RECV, sending ? "backplane:send" : "backplane:recv",
      tensors,
      [this, &ch, &tg, t, src, dst, tag, sending] {
        // The sender is the pair's rank 0, the root of the broadcast.
        backplane::ProcessGroup& g = pair_group(ch.group, store_, src, dst, tag, tg, sending, timeout_);
        if (t.numel() == 0) return;
        settle(t);
        if (sending) {
          at::Tensor flat = carried(t.contiguous());
          Tensor b = wrap(tg, flat);
          g.broadcast_(b, 0);
          return;
        }
        in_place(t, [&](const at::Tensor& c) {
          at::Tensor flat = carried(c);
          Tensor b = wrap(tg, flat);
          g.broadcast_(b, 0);
          writeback(tg, b, flat);
        });
      },
      &ch.executor, sending ? -1 : src);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBackplane::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false,
              "backplane: recv from any source is not supported (each send/recv pair is a channel of its ",
              "own); name the source rank: dist.recv(tensor, src=...)");
}

std::string ProcessGroupBackplane::describe_target(const std::string& torch_device_type) {
  at::Tensor probe = at::empty({0}, at::TensorOptions().device(c10::Device(torch_device_type)));
  return target(probe, "describe").label;
}

}  // namespace backplane::torch_bridge
