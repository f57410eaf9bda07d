// Op placement's slow path: choosing the device that runs an op, bringing
// operands' bytes there (replicas), the fallback report and its API, and
// Registry::set_op_fallback. The fast path is inline in placement.hpp.
#include "tensor/placement.hpp"
#include "trace/trace_format.hpp"

#include <backplane/log.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::detail {

namespace {

using Clock = std::chrono::steady_clock;

// BACKPLANE_OP_FALLBACK, read once: "error" disables every fallback; any
// other non-empty value is named in a warning and ignored.
bool read_disabled() noexcept {
  const char* v = std::getenv("BACKPLANE_OP_FALLBACK");
  if (v == nullptr || *v == '\0') return false;
  if (std::string_view(v) == "error") return true;
  try {
    log(LogLevel::warning, std::string("BACKPLANE_OP_FALLBACK=") + v +
                               " is not understood and is ignored; the one value is \"error\" (turns every "
                               "op_fallback off, for tests of a plugin's own coverage)");
  } catch (...) {  // a throwing log handler loses the warning, not the process
  }
  return false;
}

OpFallbackState::Counter& counter(BackendImpl& b, int32_t op, DType dtype) noexcept {
  return b.op_fallback.counter(op, static_cast<int32_t>(dtype));
}

uint64_t nanoseconds_since(Clock::time_point start) noexcept {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
}

// Whether this placed op of a pair that has had `calls` is timed. Reading a
// clock costs 30-50 ns under a hypervisor (twice per op: a good part of
// what a placed op costs), so the report times each pair's first
// kTimedFirst calls and then one call in 2^kTimedEveryLog2, picked by a hash of
// the count (a fixed stride would keep timing the same op of a step that
// repeats; the hash spreads the picks without per-thread state), and scales
// the sample's mean to all calls.
constexpr uint64_t kTimedFirst = 16;
constexpr int kTimedEveryLog2 = 4;  // one call in 16

bool timed(uint64_t calls) noexcept {
  if (calls < kTimedFirst) return true;
  // splitmix64's finaliser: every bit of the count moves the top ones, so a
  // pair called k times a step is timed at each of its k places alike, for
  // any k (a multiplicative hash alone favours a few places when k is near
  // a Fibonacci number).
  uint64_t h = calls * 0x9e3779b97f4a7c15ULL;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  return (h ^ (h >> 31)) >> (64 - kTimedEveryLog2) == 0;
}

// OpFallbackOff's switch for this thread, and how many are alive in the
// process: a fallback decision reads the thread-local only when one is (a
// thread-local in a shared library costs a call per read).
thread_local bool off_in_this_thread = false;
std::atomic<int> off_guards{0};

// b's op_fallback as backends.json spells it.
std::string spelling(const BackendImpl& b) { return b.op_fallback.configured().to_string(); }

// Whether device d of b runs (op, dtype) producing out_dtype with these
// operands, from what is cached: the ready byte(s) runs() stored and the
// flags of every dtype involved (lacks() in a few loads). False is "not
// known", not "no".
bool ready(const BackendImpl& b, int32_t d, int32_t op, DType dtype, DType out_dtype,
           const TensorImpl* const* operands, int n) noexcept {
  if (!b.support_ready(d, op, static_cast<int32_t>(dtype)) || !b.holds(d, out_dtype)) return false;
  if (op == BP_OP_CAST && !b.support_ready(d, op, static_cast<int32_t>(out_dtype))) return false;
  for (int i = 0; i < n; ++i)
    if (!b.holds(d, operands[i]->dtype)) return false;
  return true;
}

// Whether device 0 of b holds every operand's dtype (the dtype rule).
bool holds_all(const BackendImpl& b, const TensorImpl* const* operands, int n) noexcept {
  for (int i = 0; i < n; ++i)
    if (!b.holds(0, operands[i]->dtype)) return false;
  return true;
}

// A sure "no" from what (op, dtype) alone decides, without asking the
// plugin: abi.h's matmul rule, dtype's flag, or a cached supports_op no.
// False is "not known" (runs() answers it).
bool lacks_pair(BackendImpl& b, int32_t d, int32_t op, DType dtype) {
  if (op == BP_OP_MATMUL && !b.has(d, Capability::matmul)) return true;
  if (!b.holds(d, dtype)) return true;
  const std::atomic<uint8_t>* slot = b.support_slot(d, op, static_cast<int32_t>(dtype));
  return slot != nullptr && slot->load(std::memory_order_relaxed) != 0 &&
         !b.supports(d, op, static_cast<int32_t>(dtype));
}

// Whether device d of b runs (op, dtype) producing out_dtype with these
// operands (lacks() says nothing); never throws for a "no". A yes for
// (op, dtype) is cached as the ready byte, so the next call takes the fast
// path.
bool runs(BackendImpl& b, int32_t d, int32_t op, DType dtype, DType out_dtype,
          const TensorImpl* const* operands, int n) {
  constexpr int kInline = 8;  // no op has more operands; more would take the vector
  DType inline_dtypes[kInline];
  std::vector<DType> more(n > kInline ? static_cast<std::size_t>(n) : 0);
  DType* dtypes = n > kInline ? more.data() : inline_dtypes;
  for (int i = 0; i < n; ++i) dtypes[i] = operands[i]->dtype;
  if (!lacks(b, d, op, dtype, out_dtype, {dtypes, static_cast<std::size_t>(n)}).none()) return false;
  for (const DType t : {dtype, out_dtype}) {
    if (std::atomic<uint8_t>* slot = b.support_slot(d, op, static_cast<int32_t>(t)))
      if (t == dtype || op == BP_OP_CAST) slot->store(BackendImpl::kSupportReady, std::memory_order_relaxed);
  }
  return true;
}

}  // namespace

namespace {

// The typed error for what device d of b lacks (`lack`, not none): the
// backend's load failure, the missing 'matmul' or dtype flag
// (capability_missing), or supports_op's no (unsupported_op).
Error refusal(BackendImpl& b, int32_t d, int32_t op, DType dtype, const Lack& lack, const char* api) {
  if (lack.not_loaded) {
    try {
      b.require_loaded();
    } catch (const Error& e) {
      return e;
    }
    if (b.devices.empty())
      return Error(Errc::backend_unavailable,
                   std::string(api) + ": backend \"" + b.name + "\" has no devices");
  }
  if (lack.matmul)
    return Error(
        Errc::capability_missing,
        std::string(api) + ": device " + b.device_id(d) + " (\"" +
            b.devices[static_cast<std::size_t>(d)].name + "\") of backend \"" + b.name +
            "\" lacks the capability 'matmul'; move the operands to a device with 'matmul' with to() "
            "(`backplane list` shows each device's capabilities)");
  for (int32_t t = 1; t < BP_DTYPE_COUNT_; ++t) {
    if ((lack.dtypes >> t & 1U) == 0) continue;
    try {
      b.require_dtype_capability(d, static_cast<DType>(t), api);
    } catch (const Error& e) {
      return e;
    }
  }
  std::string msg = "backend \"" + b.name + "\" (" + b.device_id(d) + ") does not support " + op_name(op) +
                    " on " + std::string(to_string(dtype));
  if (std::string_view(api) != op_name(op)) msg += std::string(" (needed by ") + api + ")";
  msg +=
      "; Device::supports(op, dtype) tells what a device runs: move the tensor to one that does with to(), "
      "or cast it";
  return Error(Errc::unsupported_op, std::move(msg));
}

[[noreturn, gnu::cold]] void cannot_place(BackendImpl& home, int32_t hd, BackendImpl* host, int32_t op,
                                          DType dtype, DType out_dtype, const TensorImpl* const* operands,
                                          int n, const char* api) {
  std::vector<DType> dtypes;
  for (int i = 0; i < n; ++i) dtypes.push_back(operands[i]->dtype);
  const Error own = refusal(home, hd, op, dtype, lacks(home, hd, op, dtype, out_dtype, dtypes), api);
  if (host == nullptr) throw own;
  const Error there = refusal(*host, 0, op, dtype, lacks(*host, 0, op, dtype, out_dtype, dtypes), api);
  throw Error(own.code(), own.message() + ". Its op_fallback \"" + spelling(home) + "\" (" +
                              home.config_entry + " in " + home.config_source +
                              ") cannot run it either: " + there.message());
}

void noop_release(void*) noexcept {}

// What a replica's errors are prefixed with; built only when needed.
std::string replica_what(const Storage& s, const BackendImpl& exec, int32_t dev) {
  return "op_fallback: bytes of a " + s.home_backend()->device_id(s.home_index()) + " tensor on " +
         exec.device_id(dev);
}

// exec's import of s's host memory on dev, or null when it refuses (the
// caller copies instead). Both devices are host_visible and not remote.
[[gnu::noinline]] bp_buffer* import_host_bytes(const Storage& s, BackendImpl& exec, int32_t dev) {
  std::byte* p = nullptr;
  try {
    p = s.backend->host_pointer(s.device, s.buffer, "op_fallback");
    if (p == nullptr) return nullptr;
    s.backend->synchronize_if_async(s.device, "op_fallback");
  } catch (const Error& e) {  // the message names the device; the context is added only here
    rethrow_with_context(e, replica_what(s, exec, dev));
  }
  bp_buffer_import_args args{};
  args.struct_size = BP_BUFFER_IMPORT_ARGS_STRUCT_SIZE;
  args.plugin = exec.plugin;
  args.device = dev;
  args.dl_device_type = BP_DL_CPU;
  args.data = p;
  args.size = s.nbytes;
  args.release = &noop_release;  // the source storage owns the memory and outlives its replica
  bp_status* st = call_entry(exec, "buffer_import", Errc::internal, exec.api.buffer_import, &args);
  if (st == nullptr && args.buffer != nullptr) return args.buffer;
  if (st != nullptr) exec.api.status_free(st);  // refused: copy instead
  return nullptr;
}

// Whether exec's device dev may import s's memory instead of copying it:
// both host_visible, neither remote, exec has buffer_import. (The import can
// still be refused; make_replica then copies.)
bool may_import(const Storage& s, const BackendImpl& exec, int32_t dev) noexcept {
  return s.nbytes > 0 && exec.api.buffer_import != nullptr && exec.has(dev, Capability::host_visible) &&
         !exec.has(dev, Capability::remote) && s.backend->has(s.device, Capability::host_visible) &&
         !s.backend->has(s.device, Capability::remote);
}

// A buffer on (exec, dev) holding s's bytes, as a tensor laid out as x (an
// operand over s): exec's import of s's host memory when both are
// host_visible (no copy; `alias` set), else a copy, whose time is added to
// *copy_ns when given. Returns the bytes copied.
uint64_t make_replica(const TensorImpl& x, const std::shared_ptr<BackendImpl>& exec, int32_t dev,
                      std::shared_ptr<TensorImpl>& out, bool& alias, const char* needed_by,
                      uint64_t* copy_ns) {
  const Storage& s = *x.storage;
  auto r = new_impl();
  r->shape = x.shape;
  r->strides = x.strides;
  r->byte_offset = x.byte_offset;
  r->dtype = x.dtype;
  if (may_import(s, *exec, dev)) {
    if (bp_buffer* imported = import_host_bytes(s, *exec, dev)) {
      r->storage = &r->owned.emplace(exec, dev, imported, s.nbytes);
      out = std::move(r);
      alias = true;
      return 0;
    }
  }
  const auto t0 = Clock::now();
  r->storage = &r->owned.emplace(exec, dev, s.nbytes);
  trace::detail::Span span(trace::detail::kCatCopy, "copy");
  if (span.on()) [[unlikely]] {
    trace::detail::Event& e = span.event();
    e.device = s.backend->trace_label(s.device);
    e.peer = exec->trace_label(dev);
    e.bytes = static_cast<int64_t>(s.nbytes);
    e.text_key = "needed_by";  // the op that needed the bytes (the caller's text: copied)
    e.text = trace::detail::intern(needed_by);
  }
  try {
    copy_bytes(s, 0, *r->storage, 0, s.nbytes, "op_fallback");
  } catch (const Error& e) {  // the context is built only here
    rethrow_with_context(e, replica_what(s, *exec, dev));
  }
  if (copy_ns != nullptr) *copy_ns += nanoseconds_since(t0);
  out = std::move(r);
  alias = false;
  return s.nbytes;
}

// Whether replica r's bytes are on (exec, dev).
bool lives_on(const TensorImpl& r, const std::shared_ptr<BackendImpl>& exec, int32_t dev) noexcept {
  return r.storage->backend == exec && r.storage->device == dev;
}

bool same_layout(const TensorImpl& a, const TensorImpl& b) noexcept {
  return a.dtype == b.dtype && a.byte_offset == b.byte_offset && a.shape == b.shape && a.strides == b.strides;
}

// x's bytes on (exec, dev) when its storage's replica is an import there laid
// out as x: replica_view's common case without the lock or a reference count
// (the import lives as long as x's storage, see ReplicaSlot::pinned), and
// with its synchronisation. Null: ask replica_view.
const TensorImpl* pinned_replica(const TensorImpl& x, const std::shared_ptr<BackendImpl>& exec, int32_t dev) {
  const Storage& s = *x.storage;
  const Storage::ReplicaSlot* slot = s.replica_slot.load(std::memory_order_acquire);
  if (slot == nullptr) return nullptr;
  const TensorImpl* r = slot->pinned.load(std::memory_order_acquire);
  if (r == nullptr || !lives_on(*r, exec, dev) || !same_layout(*r, x)) return nullptr;
  s.backend->synchronize_if_async(s.device, "op_fallback");  // as replica_view does for an import
  return r;
}

// x's bytes on (exec, dev): s's replica there (made now when missing or
// elsewhere) when it has x's layout, else a view of it (the slot keeps the
// last one, so an operand seen again allocates nothing). `moved` gets the
// bytes copied, *copy_ns (when given) the copy's time, *alias (when given)
// whether the replica is x's own memory (an import).
std::shared_ptr<const TensorImpl> replica_view(const TensorImpl& x, const std::shared_ptr<BackendImpl>& exec,
                                               int32_t dev, uint64_t& moved, const char* needed_by,
                                               uint64_t* copy_ns = nullptr, bool* alias_out = nullptr) {
  const Storage& s = *x.storage;
  Storage::ReplicaSlot& slot = s.replica();
  std::shared_ptr<TensorImpl> dropped, dropped_view;  // freed outside the lock
  std::lock_guard lock(slot.mutex);
  if (!slot.replica || !lives_on(*slot.replica, exec, dev)) {
    // An import made there before (the fallback target changed back) serves
    // again, so `retired` holds at most one per device. (Room first: nothing
    // below throws once a replica has moved.)
    const bool retire = slot.alias && slot.replica;
    if (retire) slot.retired.reserve(slot.retired.size() + 1);
    auto kept = std::find_if(slot.retired.begin(), slot.retired.end(),
                             [&](const auto& r) { return lives_on(*r, exec, dev); });
    std::shared_ptr<TensorImpl> r;
    bool alias = true;
    const bool made = kept == slot.retired.end();
    if (made) {
      moved += make_replica(x, exec, dev, r, alias, needed_by, copy_ns);
    } else {
      r = std::move(*kept);
      slot.retired.erase(kept);
    }
    // An import being replaced may be in use through `pinned`: kept until
    // the storage goes.
    if (retire) slot.retired.push_back(slot.replica);
    dropped = std::exchange(slot.replica, std::move(r));
    dropped_view = std::move(slot.view);
    slot.alias = alias;
    slot.pinned.store(alias ? slot.replica.get() : nullptr, std::memory_order_release);
    if (made) {  // laid out as x, and synchronised if an import
      if (alias_out != nullptr) *alias_out = alias;
      return slot.replica;
    }
  }
  if (alias_out != nullptr) *alias_out = slot.alias;
  // An import reads (or, in place, writes) s's own memory: work queued on
  // s's device must have landed first, as when the import was made.
  if (slot.alias) s.backend->synchronize_if_async(s.device, "op_fallback");
  if (same_layout(*slot.replica, x)) return slot.replica;
  if (slot.view && same_layout(*slot.view, x)) return slot.view;
  auto v = new_impl();
  v->base = slot.replica;
  v->storage = slot.replica->storage;
  v->shape = x.shape;
  v->strides = x.strides;
  v->byte_offset = x.byte_offset;
  v->dtype = x.dtype;
  dropped_view = std::exchange(slot.view, v);
  return v;
}

// The pair's first fallback, logged once (c is its counter). Cold: every
// later call of the pair only reads c.logged (see log_first).
[[gnu::cold, gnu::noinline]] void log_first_slow(OpFallbackState::Counter& c, BackendImpl& home, int32_t hd,
                                                 const BackendImpl& exec, int32_t op, DType dtype,
                                                 const char* api) {
  if (c.logged.exchange(true, std::memory_order_relaxed)) return;
  try {
    std::string msg = "op_fallback: " + home.device_id(hd) + " does not run " + op_name(op) + " on " +
                      std::string(to_string(dtype));
    if (std::string_view(api) != op_name(op)) msg += std::string(" (needed by ") + api + ")";
    msg += "; running it on " + exec.device_id(0) + " (op_fallback \"" + spelling(home) + "\" at " +
           home.config_entry + "; logged once per op and dtype)";
    // Debug, not info: every rank would print one line per pair in among its
    // progress; Backend::op_fallback_stats() and train's summary say it once.
    log(LogLevel::debug, msg);
  } catch (...) {  // a throwing log handler loses the message, not the op
  }
}

void log_first(OpFallbackState::Counter& c, BackendImpl& home, int32_t hd, const BackendImpl& exec,
               int32_t op, DType dtype, const char* api) {
  if (!c.logged.load(std::memory_order_relaxed)) [[unlikely]]
    log_first_slow(c, home, hd, exec, op, dtype, api);
}

}  // namespace

bool op_fallback_disabled() noexcept {
  static const bool disabled = read_disabled();
  return disabled;
}

const char* op_fallback_off_reason() noexcept {
  if (op_fallback_disabled()) return "BACKPLANE_OP_FALLBACK=error";
  if (off_guards.load(std::memory_order_relaxed) != 0 && off_in_this_thread)
    return "an OpFallbackOff on this thread";
  return nullptr;
}

namespace {

// op_fallback_host without touching reference counts: the target kept by
// b's OpFallbackState (valid while b lives), or null.
const std::shared_ptr<BackendImpl>* fallback_target(const BackendImpl& b) {
  const std::shared_ptr<BackendImpl>* host = b.op_fallback.target_ref();
  if (host == nullptr || op_fallback_off_reason() != nullptr) return nullptr;
  // An optional host loads on its first use; one that failed to load or has
  // no device runs nothing.
  if (!(*host)->is_loaded() || (*host)->devices.empty()) return nullptr;
  return host;
}

}  // namespace

std::shared_ptr<BackendImpl> op_fallback_host(const BackendImpl& b) {
  const std::shared_ptr<BackendImpl>* host = fallback_target(b);
  return host != nullptr ? *host : nullptr;
}

Lack lacks(BackendImpl& b, int32_t d, int32_t op, DType dtype, DType out_dtype,
           std::span<const DType> operands) {
  Lack lack;
  if (b.status != Backend::Status::loaded || d < 0 || static_cast<std::size_t>(d) >= b.devices.size()) {
    lack.not_loaded = true;
    return lack;
  }
  // abi.h's matmul rule: without the flag, supports_op is not the question.
  if (op == BP_OP_MATMUL && !b.has(d, Capability::matmul)) lack.matmul = true;
  // The dtype rule: every dtype the op touches needs its flag.
  auto need = [&](DType t) {
    if (!is_known(t))
      lack.unsupported = true;  // a dtype value abi.h does not name: nothing runs it
    else if (!b.holds(d, t))
      lack.dtypes |= 1U << static_cast<uint32_t>(t);
  };
  need(dtype);
  need(out_dtype);
  for (const DType t : operands) need(t);
  // supports_op is asked only about dtypes the device holds.
  auto held = [&](DType t) { return is_known(t) && (lack.dtypes >> static_cast<uint32_t>(t) & 1U) == 0; };
  if (held(dtype) && !b.supports(d, op, static_cast<int32_t>(dtype))) lack.unsupported = true;
  if (op == BP_OP_CAST && held(out_dtype) && !b.supports(d, op, static_cast<int32_t>(out_dtype)))
    lack.unsupported = true;
  return lack;
}

std::string Lack::text() const {
  if (not_loaded) return "not loaded";
  std::string why;
  if (matmul) why = "no 'matmul' flag";
  for (int32_t t = 1; t < BP_DTYPE_COUNT_; ++t)
    if ((dtypes >> t & 1U) != 0)
      why += (why.empty() ? "no '" : ", no '") +
             std::string(to_string(capability_for(static_cast<DType>(t)))) + "' flag";
  if (unsupported) why += why.empty() ? "not supported" : "; supports_op says no too";
  return why;
}

void Storage::invalidate_replica() const noexcept {
  ReplicaSlot* slot = replica_slot.load(std::memory_order_acquire);
  if (slot == nullptr) return;
  std::shared_ptr<TensorImpl> dropped, dropped_view;  // freed outside the lock
  std::lock_guard lock(slot->mutex);
  if (slot->alias) return;  // the same memory: it saw the write
  dropped = std::move(slot->replica);
  dropped_view = std::move(slot->view);
}

void Placement::place(int32_t op, DType dtype, DType out_dtype, const char* api,
                      const std::shared_ptr<BackendImpl>* home, int32_t home_device, bool in_place) {
  PlacedState& st = state_.emplace();
  st.home = home;
  st.home_device = home_device;
  st.op = op;
  st.dtype = dtype;
  for (int i = 1; i < n_; ++i) {
    const Storage& o = *operands_[i]->storage;
    if (o.home_backend() != home->get() || o.home_index() != home_device)
      device_mismatch(*operands_[0], *operands_[i], api);
  }
  BackendImpl& h = **home;  // loaded: it holds an operand, or a creation op's caller checked usable()
  OpFallbackState::Counter& c = counter(h, op, dtype);
  // An in-place op that runs nowhere in place: nothing placed or counted
  // (ok() is false; the caller composes it). `st` is gone after this.
  auto not_in_place = [this] {
    state_.reset();
    exec_ = nullptr;
  };
  // The decision. A pair device 0 surely lacks, found running on the current
  // target before: one load (and the operands' dtype flags there). Kept for
  // device 0 alone: a backend's devices may differ in flags and answers.
  // Acquire, paired with the release below: the thread that stored it had
  // seen the target loaded (an optional one loads inside that first
  // fallback), so its devices are visible here and fallback_target's other
  // tests need not be repeated.
  const std::shared_ptr<BackendImpl>* known =
      home_device == 0 ? c.runs_there.load(std::memory_order_acquire) : nullptr;
  if (known != nullptr && out_dtype == dtype && known == h.op_fallback.target_ref() &&
      op_fallback_off_reason() == nullptr && holds_all(**known, operands_, n_)) {
    st.exec = known;
    device_ = 0;
    st.placed = true;
  } else if (const bool here = ready(h, home_device, op, dtype, out_dtype, operands_, n_),
             surely_not = !here && lacks_pair(h, home_device, op, dtype);
             here || (!surely_not && runs(h, home_device, op, dtype, out_dtype, operands_, n_))) {
    // From cached answers first: the home device runs it (ready), surely
    // does not (lacks_pair), or runs() asks.
    st.exec = home;
    device_ = home_device;
  } else {
    const std::shared_ptr<BackendImpl>* host = fallback_target(h);
    if (host == nullptr || !(ready(**host, 0, op, dtype, out_dtype, operands_, n_) ||
                             runs(**host, 0, op, dtype, out_dtype, operands_, n_))) {
      if (in_place) return not_in_place();
      cannot_place(h, home_device, host != nullptr ? host->get() : nullptr, op, dtype, out_dtype, operands_,
                   n_, api);
    }
    if (surely_not && out_dtype == dtype && home_device == 0)
      c.runs_there.store(host, std::memory_order_release);
    st.exec = host;
    device_ = 0;
    st.placed = true;
  }
  if (in_place) {
    // Operand 0 is written: it must be its own memory there (held there, or
    // imported), never a copy that the op would update instead.
    const Storage& y = *operands_[0]->storage;
    if ((y.backend != *st.exec || y.device != device_) && !may_import(y, **st.exec, device_))
      return not_in_place();
  }
  exec_ = st.exec;
  if (st.placed && timed(c.calls.load(std::memory_order_relaxed))) {
    st.timed = true;
    st.start = Clock::now();
  }
  // Operands whose bytes are elsewhere come to the device that runs the op.
  const std::shared_ptr<BackendImpl>& exec = *st.exec;
  if (n_ > PlacedState::kInline)
    st.more = std::make_unique<std::shared_ptr<const TensorImpl>[]>(
        static_cast<std::size_t>(n_ - PlacedState::kInline));
  uint64_t to_host = 0;
  for (int i = 0; i < n_; ++i) {
    const TensorImpl& x = *operands_[i];
    const Storage& s = *x.storage;
    if (s.backend == exec && s.device == device_) continue;
    if (i < PlacedState::kInline) {
      if (const TensorImpl* r = pinned_replica(x, exec, device_)) {  // an import: nothing moved or filed
        st.lend_operand(i, r);
        continue;
      }
    }
    uint64_t moved = 0;
    bool alias = false;
    if (st.placed) {
      st.set_operand(i, replica_view(x, exec, device_, moved, op_name(op), nullptr, &alias));
      to_host += moved;
    } else {
      // Back home (x's bytes are on the fallback device: s.home is set):
      // charged to this op, which needed the bytes (not to the op that made
      // them there: running that one natively would only move the copy to
      // whichever op made the bytes next). An import (no bytes copied)
      // costs next to nothing and is not filed.
      uint64_t copy_ns = 0;
      st.set_operand(i, replica_view(x, exec, device_, moved, op_name(op), &copy_ns, &alias));
      if (moved > 0) {
        c.bytes_from_host.fetch_add(moved, std::memory_order_relaxed);
        c.copy_nanoseconds.fetch_add(copy_ns, std::memory_order_relaxed);
      }
    }
    if (in_place && i == 0 && !alias) [[unlikely]]  // the import was refused: a copy was made
      return not_in_place();
  }
  if (st.placed) {
    // Counted once its operands are there (the op runs now), here rather
    // than when it ends: the counter's line is at hand.
    c.calls.fetch_add(1, std::memory_order_relaxed);
    if (to_host > 0) c.bytes_to_host.fetch_add(to_host, std::memory_order_relaxed);
    log_first(c, h, home_device, *exec, op, dtype, api);
  }
}

void Placement::finish() noexcept {
  if (!state_->timed) return;
  OpFallbackState::Counter& c = counter(**state_->home, state_->op, state_->dtype);
  c.timed_calls.fetch_add(1, std::memory_order_relaxed);
  c.timed_nanoseconds.fetch_add(nanoseconds_since(state_->start), std::memory_order_relaxed);
}

const TensorImpl& Placement::placed_operand(int i) const noexcept {
  const TensorImpl* v = state_->operand(i);
  return v != nullptr ? *v : *operands_[i];
}

void Placement::stamp(TensorImpl& out) const {
  if (!state_->placed) return;
  Storage& s = *out.storage;
  s.home = *state_->home;
  s.home_device = state_->home_device;
  s.made_by_op = static_cast<int16_t>(state_->op);
  s.made_by_dtype = static_cast<int16_t>(state_->dtype);
}

void Placement::execute_placed(int32_t op, const bp_tensor* inputs, int32_t num_inputs,
                               const bp_tensor* output, const bp_op_attrs* attrs) const {
  const BackendImpl& home = **state_->home;
  const uint32_t fallback_for =
      trace::detail::active() && state_->placed ? home.trace_label(state_->home_device) : 0;
  try {
    detail::execute(**exec_, device_, op, inputs, num_inputs, output, attrs, fallback_for);
  } catch (const Error& e) {
    if (!state_->placed) throw;
    rethrow_with_context(e, "run there for " + home.device_id(state_->home_device) +
                                " by its op_fallback \"" + spelling(home) + "\"");
  }
}

std::shared_ptr<TensorImpl> allocate_on(const std::shared_ptr<BackendImpl>& backend, int32_t device,
                                        const Shape& shape, DType dtype, std::string_view api) {
  if (backend->holds(device, dtype)) [[likely]]
    return allocate_tensor(backend, device, shape, dtype, api);
  std::shared_ptr<BackendImpl> host = op_fallback_host(*backend);
  if (!host || !host->holds(0, dtype))
    backend->require_dtype_capability(device, dtype, api);  // throws: the device lacks the flag
  auto out = allocate_tensor(host, 0, shape, dtype, api);
  out->storage->home = backend;
  out->storage->home_device = device;
  return out;
}

void rethrow_with_context(const Error& e, std::string_view context) {
  throw Error(e.code(), e.message() + " (" + std::string(context) + ")");
}

void copy_bytes(const Storage& src, uint64_t src_offset, const Storage& dst, uint64_t dst_offset,
                uint64_t bytes, std::string_view what) {
  if (bytes == 0) return;
  BackendImpl& sb = *src.backend;
  BackendImpl& db = *dst.backend;
  // Host pointers only on host_visible devices; the core never touches other
  // plugin memory. Asked afresh for every copy (buffer_pointer is cheap and a
  // cached address could outlive a plugin's reallocation).
  std::byte* s = sb.host_pointer(src.device, src.buffer, what);
  std::byte* d = db.host_pointer(dst.device, dst.buffer, what);
  // The async rule: before memory is touched through a pointer, work queued
  // on its device must have landed (buffer_read/buffer_write order themselves).
  if (s != nullptr) sb.synchronize_if_async(src.device, what);
  if (d != nullptr) db.synchronize_if_async(dst.device, what);
  if (s != nullptr && d != nullptr) {
    std::memmove(d + dst_offset, s + src_offset, static_cast<std::size_t>(bytes));  // views may overlap
    return;
  }
  // Through the plugins' buffer_read/buffer_write; a failure's message names
  // the device and is built only then (check_on is cold).
  if (d != nullptr) {  // into host memory
    if (bp_status* st = sb.read_status(src.buffer, src_offset, d + dst_offset, bytes)) [[unlikely]]
      sb.check_on(st, what, ": buffer_read from ", src.device);
    return;
  }
  std::vector<std::byte> staging;
  const std::byte* from = s != nullptr ? s + src_offset : nullptr;
  if (from == nullptr) {  // between two devices without host pointers: staged through host memory
    staging.resize(static_cast<std::size_t>(bytes));
    if (bp_status* st = sb.read_status(src.buffer, src_offset, staging.data(), bytes)) [[unlikely]]
      sb.check_on(st, what, ": buffer_read from ", src.device);
    from = staging.data();
  }
  if (bp_status* st = db.write_status(dst.buffer, dst_offset, from, bytes)) [[unlikely]]
    db.check_on(st, what, ": buffer_write to ", dst.device);
}

std::shared_ptr<const TensorImpl> bytes_on(const std::shared_ptr<TensorImpl>& x,
                                           const std::shared_ptr<BackendImpl>& backend, int32_t device,
                                           const char* needed_by) {
  const Storage& s = *x->storage;
  if (s.backend == backend && s.device == device) return x;
  const auto t0 = Clock::now();
  uint64_t moved = 0;
  auto v = replica_view(*x, backend, device, moved, needed_by);
  if (s.home != nullptr && s.made_by_op != 0) {
    OpFallbackState::Counter& c = counter(*s.home, s.made_by_op, static_cast<DType>(s.made_by_dtype));
    c.bytes_from_host.fetch_add(moved, std::memory_order_relaxed);
    c.copy_nanoseconds.fetch_add(nanoseconds_since(t0), std::memory_order_relaxed);
  }
  return v;
}

}  // namespace backplane::detail

namespace backplane {

OpFallbackOff::OpFallbackOff() noexcept : previous_(std::exchange(detail::off_in_this_thread, true)) {
  detail::off_guards.fetch_add(1, std::memory_order_relaxed);
}
OpFallbackOff::~OpFallbackOff() {
  detail::off_in_this_thread = previous_;
  detail::off_guards.fetch_sub(1, std::memory_order_relaxed);
}

OpFallback Backend::op_fallback() const {
  if (detail::op_fallback_disabled()) return {};
  return impl_->op_fallback.configured();
}

std::vector<OpFallbackStats> Backend::op_fallback_stats() const {
  std::vector<OpFallbackStats> out;
  for (int32_t op = 1; op < BP_OP_COUNT_; ++op) {
    for (int32_t d = 1; d < BP_DTYPE_COUNT_; ++d) {
      const auto& c = impl_->op_fallback.slot(static_cast<std::size_t>(op) * BP_DTYPE_COUNT_ +
                                              static_cast<std::size_t>(d));
      OpFallbackStats s;
      s.calls = c.calls.load(std::memory_order_relaxed);
      s.bytes_to_host = c.bytes_to_host.load(std::memory_order_relaxed);
      s.bytes_from_host = c.bytes_from_host.load(std::memory_order_relaxed);
      const uint64_t timed = c.timed_calls.load(std::memory_order_relaxed);
      const uint64_t timed_ns = c.timed_nanoseconds.load(std::memory_order_relaxed);
      const uint64_t copy_ns = c.copy_nanoseconds.load(std::memory_order_relaxed);
      if (s.calls == 0 && s.bytes_moved() == 0 && timed_ns == 0 && copy_ns == 0) continue;
      s.op = static_cast<Op>(op);
      s.dtype = static_cast<DType>(d);
      // The timed calls' mean, for every call (see timed() in the slow path).
      const double op_ns = timed > 0 ? static_cast<double>(timed_ns) / static_cast<double>(timed) *
                                           static_cast<double>(s.calls)
                                     : 0.0;
      s.seconds = (op_ns + static_cast<double>(copy_ns)) * 1e-9;
      out.push_back(s);
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const OpFallbackStats& a, const OpFallbackStats& b) { return a.seconds > b.seconds; });
  return out;
}

void Backend::reset_op_fallback_stats() const {
  for (std::size_t i = 0; i < detail::OpFallbackState::kSlots; ++i) {
    auto& c = impl_->op_fallback.slot(i);
    c.calls.store(0, std::memory_order_relaxed);
    c.bytes_to_host.store(0, std::memory_order_relaxed);
    c.bytes_from_host.store(0, std::memory_order_relaxed);
    c.timed_calls.store(0, std::memory_order_relaxed);
    c.timed_nanoseconds.store(0, std::memory_order_relaxed);
    c.copy_nanoseconds.store(0, std::memory_order_relaxed);
  }
}

}  // namespace backplane

namespace backplane {

void Registry::set_op_fallback(std::string_view name, const OpFallback& fallback) const {
  const Backend handle = backend(name);  // Errc::not_found listing the names
  const std::shared_ptr<detail::BackendImpl>& b = detail::Access::impl(handle);
  const std::string what =
      "Registry::set_op_fallback(\"" + std::string(name) + "\", \"" + fallback.to_string() + "\")";
  if (fallback.kind == OpFallback::Kind::error) {
    b->op_fallback.set(fallback, nullptr);
    return;
  }
  std::shared_ptr<detail::BackendImpl> target;
  for (const auto& o : impl_->backends)
    if (o->name == fallback.host_backend) target = o;
  if (!target)
    throw Error(Errc::config_error, what + ": no backend named \"" + fallback.host_backend + "\" in " +
                                        (impl_->config_path.empty() ? std::string("this registry")
                                                                    : impl_->config_path.string()));
  if (target == b)
    throw Error(Errc::config_error, what + ": a backend cannot fall back to itself; name another backend");
  if (!target->is_loaded())
    throw Error(Errc::backend_unavailable,
                what + ": backend \"" + target->name + "\" is not loaded: " + target->error);
  if (const OpFallback theirs = target->op_fallback.configured(); theirs.kind != OpFallback::Kind::error)
    throw Error(Errc::config_error, what + ": \"" + target->name + "\" itself falls back to \"" +
                                        theirs.host_backend +
                                        "\"; fall back to a backend that runs the ops directly (no chains)");
  for (const auto& o : impl_->backends) {
    if (o == b) continue;
    const OpFallback theirs = o->op_fallback.configured();
    if (theirs.kind == OpFallback::Kind::host && theirs.host_backend == b->name)
      throw Error(Errc::config_error, what + ": backend \"" + o->name + "\" falls back to \"" + b->name +
                                          "\", which then may not fall back itself (no chains); change \"" +
                                          o->name + "\"'s op_fallback first");
  }
  b->op_fallback.set(fallback, target);
}

}  // namespace backplane
