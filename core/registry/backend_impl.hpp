// The registry's private types: a loaded backend (its plugin, devices,
// capabilities, fallbacks and caches), the registry, and the one way into a
// plugin entry (call_entry) with status-to-Error conversion. Never
// installed; plugins and host applications cannot see it.
#ifndef BACKPLANE_CORE_REGISTRY_BACKEND_IMPL_HPP_
#define BACKPLANE_CORE_REGISTRY_BACKEND_IMPL_HPP_

#include "common/access.hpp"
#include "tensor/op_fallback_state.hpp"

#include <backplane/abi.h>
#include <backplane/error.hpp>
#include <backplane/registry.hpp>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace boost::dll {
class shared_library;
}

namespace backplane::detail {

struct DeviceRecord {
  std::string name;
  Capabilities capabilities;
  std::map<std::string, std::string> attributes;
};

inline uint64_t next_backend_serial() noexcept {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

struct BackendImpl {
  // Declared first so it is destroyed last: the library stays mapped until
  // the plugin instance (destroyed in ~BackendImpl) is gone.
  std::shared_ptr<boost::dll::shared_library> library_handle;

  // Unique in the process, unlike the address (a later backend may reuse a
  // freed one's): what per-thread caches of a backend's data key on.
  const uint64_t serial = next_backend_serial();

  // From the config.
  std::string name;
  std::string config_entry;         // "backends[2]": where in the JSON it came from
  std::string config_source;        // the config file (or from_json's source name)
  std::size_t config_backends = 0;  // how many backends that config names, this one included
  std::string library;
  std::string library_path;
  bool required = false;
  // Where collectives go when a device lacks 'collective' (not ops: those
  // follow op_fallback below).
  CollectiveFallback collective_fallback;
  // For a host:<backend> collective fallback: that backend (set when the
  // registry is built; the config forbids chains, so there are no ownership
  // cycles).
  std::shared_ptr<BackendImpl> collective_host;

  // Loading. Required backends load while the registry is built, optional
  // ones on first use (ensure_loaded), so a job never maps, and cannot be
  // killed or hung by, a plugin it does not use. Every reader of the fields
  // below calls ensure_loaded() first; a Device exists only for a loaded
  // backend, so everything reached through one is loaded already.
  mutable std::once_flag load_once;
  // Set (release) when load_once has run: ensure_loaded's fast path, one
  // load instead of std::call_once (which goes through thread-locals and
  // pthread_once on every call).
  mutable std::atomic<bool> load_done{false};
  mutable std::function<void(BackendImpl&)> loader;  // set by the registry; dropped once run
  // Loads the backend unless that happened (or was tried) already; never
  // throws: a failure is the status. Thread-safe.
  void ensure_loaded() const;
  // ensure_loaded(), then whether the backend loaded.
  bool is_loaded() const {
    ensure_loaded();
    return status == Backend::Status::loaded;
  }

  // Outcome of loading.
  Backend::Status status = Backend::Status::failed;
  std::string error;
  std::optional<Errc> error_code;

  // The plugin. `api` is the plugin's table copied into a zero-filled struct
  // of this core's size, so fields beyond the plugin's struct_size read NULL.
  bp_plugin_api api{};
  bp_plugin* plugin = nullptr;
  std::string plugin_version;
  std::optional<std::pair<uint32_t, uint32_t>> abi;
  std::vector<DeviceRecord> devices;
  Capabilities capabilities;  // union over devices

  std::atomic<bool> warned_local_fallback{false};

  // op_fallback: its policy, target and report, owned by placement
  // (core/tensor/placement.cpp).
  OpFallbackState op_fallback;
  // supports_op answers, cached per (device, op, dtype), dtype in
  // [0, BP_DTYPE_COUNT_): 0 unknown, 1 yes, 2 no (a failing status is a no),
  // kSupportReady yes and the device also has the op's flags (the matmul and
  // dtype rules of abi.h): placement's whole answer (detail::lacks) in one byte. The
  // flags never change after loading, so a ready slot never goes stale.
  static constexpr uint8_t kSupportReady = 3;
  std::unique_ptr<std::atomic<uint8_t>[]> op_support;
  // Per device: its trace label's interned id ("cpu:0"), 0 until a trace
  // first asks (trace_label()). Interned ids last the process.
  std::unique_ptr<std::atomic<uint32_t>[]> trace_labels;

  BackendImpl() = default;
  BackendImpl(const BackendImpl&) = delete;
  BackendImpl& operator=(const BackendImpl&) = delete;
  ~BackendImpl();

  bool supports(int32_t device, int32_t op, int32_t dtype);
  // The cache slot of (device, op, dtype) for a known op and dtype; nullptr
  // for values outside abi.h's tables (those are never cached).
  std::atomic<uint8_t>* support_slot(int32_t device, int32_t op, int32_t dtype) const noexcept {
    if (op <= 0 || op >= BP_OP_COUNT_ || dtype <= 0 || dtype >= BP_DTYPE_COUNT_) return nullptr;
    return &op_support[(static_cast<std::size_t>(device) * BP_OP_COUNT_ + static_cast<std::size_t>(op)) *
                           BP_DTYPE_COUNT_ +
                       static_cast<std::size_t>(dtype)];
  }
  // True once placement found (device, op, dtype) runnable there: one load.
  bool support_ready(int32_t device, int32_t op, int32_t dtype) const noexcept {
    const std::atomic<uint8_t>* slot = support_slot(device, op, dtype);
    return slot != nullptr && slot->load(std::memory_order_relaxed) == kSupportReady;
  }
  // "cpu:0"
  std::string device_id(int32_t device) const { return name + ":" + std::to_string(device); }
  // The trace's label of a device: one load once known (no thread-local).
  uint32_t trace_label(int32_t device) const noexcept;
  // Throws backplane::Error for a non-NULL status, freeing it. `what` says
  // which call failed ("execute add on cpu:0").
  void check(bp_status* status, std::string_view what) const;
  // Throws Errc::backend_unavailable unless loaded (naming the reason of a
  // failed or unavailable backend).
  void require_loaded() const;

  // The flags of a device index the caller has already validated.
  bool has(int32_t device, Capability cap) const {
    return devices[static_cast<std::size_t>(device)].capabilities.has(cap);
  }
  // The dtype rule's flag test, one bit of the device's word (false for a
  // dtype value abi.h does not name, as capability_for gives no flag then).
  bool holds(int32_t device, DType dtype) const noexcept {
    const auto d = static_cast<int32_t>(dtype);
    return d > 0 && d < BP_DTYPE_COUNT_ &&
           ((devices[static_cast<std::size_t>(device)].capabilities.bits() >> (BP_CAP_DTYPE_SHIFT_ + d)) &
            1) != 0;
  }
  // The dtype rule of abi.h: a device holds only tensors of the dtypes it
  // flags. Errc::capability_missing naming the flag, backend, device and
  // `api` otherwise.
  void require_dtype_capability(int32_t device, DType dtype, std::string_view api) const;
  // The async rule: before the host reads or writes memory through a
  // pointer, work queued on an async device must have landed. A no-op on a
  // synchronous device (a flag test, inline).
  void synchronize_if_async(int32_t device, std::string_view what) const {
    if (has(device, Capability::async) && api.synchronize != nullptr) [[unlikely]]
      synchronize_now(device, what);
  }
  void synchronize_now(int32_t device, std::string_view what) const;  // the entry itself, unconditionally
  // The host address of byte 0 of `buffer` on a host_visible device (DLPack
  // kDLCPU); nullptr on any other device. Asked afresh each time: nothing
  // that could go stale is cached. Synchronising on an async device.
  std::byte* host_pointer(int32_t device, bp_buffer* buffer, std::string_view what) const;
  // buffer_write / buffer_read through bp_buffer_copy_args.
  void write(bp_buffer* buffer, uint64_t offset, const void* src, uint64_t size, std::string_view what) const;
  void read(bp_buffer* buffer, uint64_t offset, void* dst, uint64_t size, std::string_view what) const;
  // The same calls, answering the plugin's status (nullptr on success) for
  // the caller to check() with a message it builds only then: for hot paths.
  bp_status* write_status(bp_buffer* buffer, uint64_t offset, const void* src, uint64_t size) const;
  bp_status* read_status(bp_buffer* buffer, uint64_t offset, void* dst, uint64_t size) const;
  // check() of a failed call on a device, its message "<what><call><device id>"
  // built here, out of the callers' hot paths.
  [[gnu::cold]] void check_on(bp_status* status, std::string_view what, std::string_view call,
                              int32_t device) const;
  // The fields buffer_write and buffer_read share; the caller sets src or dst.
  bp_buffer_copy_args copy_args(bp_buffer* buffer, uint64_t offset, uint64_t size) const noexcept;
};

struct RegistryImpl {
  std::filesystem::path config_path;
  std::string default_backend;
  std::vector<std::pair<std::string, std::string>> torch_devices;  // config's "torch_devices"
  std::vector<std::shared_ptr<BackendImpl>> backends;
};

// The Error for an exception that escaped plugin entry `entry` of `b` (to be
// called inside a catch): `code`, naming the backend, its library, the entry
// and the exception's type (and what() for a std::exception).
Error entry_threw(const BackendImpl& b, std::string_view entry, Errc code);

// Rethrows the current exception when it is the unwinding of a cancelled
// thread (abi::__forced_unwind), which must never be swallowed.
void rethrow_if_forced_unwind();

// call_entry's handler, out of line and cold (inside a catch): rethrows a
// forced unwind, else throws entry_threw(b, entry, code).
[[noreturn, gnu::cold]] void entry_failed(const BackendImpl& b, std::string_view entry, Errc code);

// Calls the plugin entry `fn`; every call into a plugin's table goes through
// it. abi.h forbids exceptions across the ABI, and plugin.hpp's wrappers keep
// that promise, but a C++ plugin can throw through an extern "C" entry that
// does not use them: any exception becomes backplane::Error(code)
// (entry_threw), so it fails only this backend at load (plugin_load_failed)
// or only this call afterwards (internal). A forced unwind (thread
// cancellation) passes through untouched. Free on the success path (the
// zero-cost exception model: no allocation, no string, one call), so the
// per-op execute goes through it too.
template <class Fn, class... Args>
inline decltype(auto) call_entry(const BackendImpl& b, std::string_view entry, Errc code, Fn fn,
                                 Args&&... args) {
  try {
    return fn(std::forward<Args>(args)...);
  } catch (...) {
    entry_failed(b, entry, code);
  }
}

// Maps a plugin status code to Errc.
Errc errc_from_status(int32_t code) noexcept;

// The services every plugin receives (log forwarding).
const bp_host_api* host_api() noexcept;

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_REGISTRY_BACKEND_IMPL_HPP_
