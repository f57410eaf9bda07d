// C++ helpers for plugin authors: write a class, get a complete bp_plugin_api
// table whose every entry catches exceptions and turns them into statuses.
// Include from plugin code only; the core never includes it.
//
//   class MyPlugin {
//    public:
//     explicit MyPlugin(const backplane::plugin::CreateArgs& args);
//     int32_t device_count();
//     backplane::plugin::DeviceInfo device_info(int32_t device);
//     // op and dtype are raw values: a newer host may send ones this build
//     // does not know; answer false for those.
//     bool supports_op(int32_t device, int32_t op, int32_t dtype);
//     bp_buffer* buffer_alloc(int32_t device, uint64_t size);
//     void buffer_free(bp_buffer* buffer) noexcept;
//     void buffer_write(bp_buffer* b, uint64_t offset, const void* src, uint64_t size);
//     void buffer_read(bp_buffer* b, uint64_t offset, void* dst, uint64_t size);
//     void execute(const bp_execute_args& args);
//     // optional: buffer_host_ptr, synchronize, buffer_wrap_host (DLPack
//     // import: set handed_over = true once the buffer owns `release`),
//     // and the collective set
//     // (comm_create, comm_destroy, all_reduce, broadcast, all_gather,
//     // reduce_scatter, barrier) with the signatures in PluginTable below.
//   };
//   BP_DEFINE_PLUGIN(MyPlugin, "my_plugin", "0.1.0")
//
// An optional member the class does not declare becomes a NULL entry.
// Throw backplane::plugin::Failure (or call fail()) to return a status with
// a chosen code; any other exception becomes BP_STATUS_INTERNAL (or
// BP_STATUS_OUT_OF_MEMORY for std::bad_alloc) carrying what().
#ifndef BACKPLANE_PLUGIN_HPP_
#define BACKPLANE_PLUGIN_HPP_

#include <backplane/abi.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

// The plugin's concrete status type. Each plugin library has its own copy
// (built with hidden visibility); the host only sees the opaque pointer.
struct bp_status {
  int32_t code;
  std::string message;
  const char* fixed = nullptr;  // set only on the static out-of-memory fallback, never freed
};

namespace backplane::plugin {

// Thrown by plugin code to return a specific status code.
class Failure : public std::exception {
 public:
  Failure(bp_status_code code, std::string message) : code_(code), message_(std::move(message)) {}
  bp_status_code code() const noexcept { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  bp_status_code code_;
  std::string message_;
};

[[noreturn]] inline void fail(bp_status_code code, std::string message) {
  throw Failure(code, std::move(message));
}

// Never throws: a status that cannot be allocated degrades to a static one.
inline bp_status* make_status(int32_t code, const char* message) noexcept {
  try {
    return new bp_status{code, message};
  } catch (...) {
    // Built without allocating: its message is a literal.
    static bp_status oom{BP_STATUS_OUT_OF_MEMORY, std::string(), "out of memory while reporting an error"};
    return &oom;
  }
}

// Runs fn; converts every exception into a status. fn returns void.
template <class Fn>
bp_status* guard(Fn&& fn) noexcept {
  try {
    fn();
    return nullptr;
  } catch (const Failure& e) {
    return make_status(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return make_status(BP_STATUS_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return make_status(BP_STATUS_INTERNAL, e.what());
  } catch (...) {
    return make_status(BP_STATUS_INTERNAL, "unknown exception inside plugin");
  }
}

struct CreateArgs {
  std::string backend_name;
  std::string options_json;  // "{}" when the config gives no options
};

struct DeviceInfo {
  std::string name;
  uint64_t capabilities = 0;
  std::vector<std::pair<std::string, std::string>> attributes;
  uint64_t memory_bytes = 0;
};

// The host services given to this library (set by the entry point).
inline std::atomic<const bp_host_api*>& host_api() noexcept {
  static std::atomic<const bp_host_api*> host{nullptr};
  return host;
}

inline void log(bp_log_level level, const std::string& message) noexcept {
  const bp_host_api* host = host_api().load(std::memory_order_acquire);
  if (host != nullptr && BP_HAS_FIELD(bp_host_api, log, host->struct_size) && host->log != nullptr) {
    host->log(host->ctx, level, message.c_str());
  }
}

namespace detail {

// What bp_plugin* points to: the author's object plus storage that keeps
// returned strings alive until destroy().
template <class T>
struct Instance {
  T impl;
  std::mutex info_mutex;
  struct Cached {
    DeviceInfo info;
    std::vector<bp_attribute> attributes;
  };
  std::vector<std::unique_ptr<Cached>> info_cache;

  explicit Instance(const CreateArgs& args) : impl(args) {}
};

template <class T>
Instance<T>* self(bp_plugin* p) noexcept {
  return reinterpret_cast<Instance<T>*>(p);
}

}  // namespace detail

template <class T>
struct PluginTable {
  using I = detail::Instance<T>;
  static T& impl(bp_plugin* p) noexcept { return detail::self<T>(p)->impl; }

  static int32_t status_code(const bp_status* s) noexcept { return s->code; }
  static const char* status_message(const bp_status* s) noexcept {
    return s->fixed != nullptr ? s->fixed : s->message.c_str();
  }
  static void status_free(bp_status* s) noexcept {
    if (s != nullptr && s->fixed == nullptr) delete s;
  }

  static bp_status* create(const bp_create_args* args, bp_plugin** out) noexcept {
    return guard([&] {
      if (args == nullptr || out == nullptr) fail(BP_STATUS_INVALID_ARGUMENT, "create: NULL argument");
      CreateArgs a;
      if (BP_HAS_FIELD(bp_create_args, backend_name, args->struct_size) && args->backend_name)
        a.backend_name = args->backend_name;
      a.options_json = "{}";
      if (BP_HAS_FIELD(bp_create_args, options_json, args->struct_size) && args->options_json)
        a.options_json = args->options_json;
      *out = reinterpret_cast<bp_plugin*>(new I(a));
    });
  }
  static void destroy(bp_plugin* p) noexcept { delete detail::self<T>(p); }

  static bp_status* device_count(bp_plugin* p, int32_t* out) noexcept {
    return guard([&] { *out = impl(p).device_count(); });
  }
  static bool same_strings(const DeviceInfo& a, const DeviceInfo& b) {
    return a.name == b.name && a.attributes == b.attributes;
  }
  static bp_status* device_info(bp_plugin* p, int32_t device, bp_device_info* out) noexcept {
    return guard([&] {
      if (out == nullptr) fail(BP_STATUS_INVALID_ARGUMENT, "device_info: NULL output");
      I* inst = detail::self<T>(p);
      DeviceInfo info = inst->impl.device_info(device);
      // Returned strings must stay valid until destroy(): reuse an earlier
      // answer with the same strings rather than growing on every call.
      typename I::Cached* cached = nullptr;
      std::lock_guard<std::mutex> lock(inst->info_mutex);
      for (auto& c : inst->info_cache)
        if (same_strings(c->info, info)) cached = c.get();
      if (cached == nullptr) {
        auto fresh = std::make_unique<typename I::Cached>();
        fresh->info = std::move(info);
        for (const auto& [k, v] : fresh->info.attributes) fresh->attributes.push_back({k.c_str(), v.c_str()});
        cached = fresh.get();
        inst->info_cache.push_back(std::move(fresh));
      } else {
        cached->info.capabilities = info.capabilities;
        cached->info.memory_bytes = info.memory_bytes;
      }
      // Fill only what the host's struct can hold.
      const size_t n = out->struct_size;
      if (BP_HAS_FIELD(bp_device_info, name, n)) out->name = cached->info.name.c_str();
      if (BP_HAS_FIELD(bp_device_info, capabilities, n)) out->capabilities = cached->info.capabilities;
      if (BP_HAS_FIELD(bp_device_info, attributes, n)) out->attributes = cached->attributes.data();
      if (BP_HAS_FIELD(bp_device_info, num_attributes, n))
        out->num_attributes = static_cast<int32_t>(cached->attributes.size());
      if (BP_HAS_FIELD(bp_device_info, memory_bytes, n)) out->memory_bytes = cached->info.memory_bytes;
    });
  }
  static int32_t supports_op(bp_plugin* p, int32_t device, int32_t op, int32_t dtype) noexcept {
    try {
      return impl(p).supports_op(device, op, dtype) ? 1 : 0;
    } catch (...) {
      return 0;
    }
  }

  static bp_status* buffer_alloc(bp_plugin* p, int32_t device, uint64_t size, bp_buffer** out) noexcept {
    return guard([&] { *out = impl(p).buffer_alloc(device, size); });
  }
  static void buffer_free(bp_plugin* p, bp_buffer* b) noexcept {
    try {
      impl(p).buffer_free(b);
    } catch (const std::exception& e) {
      log(BP_LOG_ERROR, std::string("buffer_free: ") + e.what());
    } catch (...) {
    }
  }
  static bp_status* buffer_write(bp_plugin* p, bp_buffer* b, uint64_t off, const void* src, uint64_t size) noexcept {
    return guard([&] { impl(p).buffer_write(b, off, src, size); });
  }
  static bp_status* buffer_read(bp_plugin* p, bp_buffer* b, uint64_t off, void* dst, uint64_t size) noexcept {
    return guard([&] { impl(p).buffer_read(b, off, dst, size); });
  }
  static void* buffer_host_ptr(bp_plugin* p, bp_buffer* b) noexcept {
    try {
      return impl(p).buffer_host_ptr(b);
    } catch (...) {
      return nullptr;
    }
  }

  static bp_status* execute(bp_plugin* p, const bp_execute_args* args) noexcept {
    return guard([&] {
      if (args == nullptr) fail(BP_STATUS_INVALID_ARGUMENT, "execute: NULL arguments");
      impl(p).execute(*args);
    });
  }
  static bp_status* synchronize(bp_plugin* p, int32_t device) noexcept {
    return guard([&] { impl(p).synchronize(device); });
  }

  static bp_status* comm_create(bp_plugin* p, const bp_comm_create_args* a, bp_comm** out) noexcept {
    return guard([&] { *out = impl(p).comm_create(*a); });
  }
  static void comm_destroy(bp_plugin* p, bp_comm* c) noexcept {
    try {
      impl(p).comm_destroy(c);
    } catch (const std::exception& e) {
      log(BP_LOG_ERROR, std::string("comm_destroy: ") + e.what());
    } catch (...) {
    }
  }
  static bp_status* all_reduce(bp_plugin* p, bp_comm* c, const bp_tensor* in, const bp_tensor* out, int32_t op) noexcept {
    return guard([&] { impl(p).all_reduce(c, *in, *out, static_cast<bp_reduce_op>(op)); });
  }
  static bp_status* broadcast(bp_plugin* p, bp_comm* c, const bp_tensor* t, int32_t root) noexcept {
    return guard([&] { impl(p).broadcast(c, *t, root); });
  }
  static bp_status* all_gather(bp_plugin* p, bp_comm* c, const bp_tensor* in, const bp_tensor* out) noexcept {
    return guard([&] { impl(p).all_gather(c, *in, *out); });
  }
  static bp_status* reduce_scatter(bp_plugin* p, bp_comm* c, const bp_tensor* in, const bp_tensor* out, int32_t op) noexcept {
    return guard([&] { impl(p).reduce_scatter(c, *in, *out, static_cast<bp_reduce_op>(op)); });
  }
  static bp_status* barrier(bp_plugin* p, bp_comm* c) noexcept {
    return guard([&] { impl(p).barrier(c); });
  }

  static bp_status* buffer_wrap_host(bp_plugin* p, int32_t device, void* data, uint64_t size,
                                     void (*release)(void*), void* release_ctx, bp_buffer** out) noexcept {
    bool handed_over = false;  // once the class owns `release`, it must call it
    bp_status* st = guard([&] { *out = impl(p).buffer_wrap_host(device, data, size, release, release_ctx, handed_over); });
    if (st != nullptr && !handed_over && release != nullptr) release(release_ctx);
    return st;
  }

  static const bp_plugin_api* table(const char* name, const char* version) noexcept {
    static const bp_plugin_api api = [&] {
      bp_plugin_api t{};
      t.struct_size = sizeof(bp_plugin_api);
      t.abi_major = BP_ABI_MAJOR;
      t.abi_minor = BP_ABI_MINOR;
      t.plugin_name = name;
      t.plugin_version = version;
      t.status_code = &status_code;
      t.status_message = &status_message;
      t.status_free = &status_free;
      t.create = &create;
      t.destroy = &destroy;
      t.device_count = &device_count;
      t.device_info = &device_info;
      t.supports_op = &supports_op;
      t.buffer_alloc = &buffer_alloc;
      t.buffer_free = &buffer_free;
      t.buffer_write = &buffer_write;
      t.buffer_read = &buffer_read;
      if constexpr (requires(T& x, bp_buffer* b) { x.buffer_host_ptr(b); }) t.buffer_host_ptr = &buffer_host_ptr;
      t.execute = &execute;
      if constexpr (requires(T& x) { x.synchronize(int32_t{}); }) t.synchronize = &synchronize;
      if constexpr (requires(T& x, const bp_comm_create_args& a) { x.comm_create(a); }) {
        t.comm_create = &comm_create;
        t.comm_destroy = &comm_destroy;
        t.all_reduce = &all_reduce;
        t.broadcast = &broadcast;
        t.all_gather = &all_gather;
        t.reduce_scatter = &reduce_scatter;
        t.barrier = &barrier;
      }
      if constexpr (requires(T& x, void* d, void (*r)(void*), bool& h) {
                      x.buffer_wrap_host(int32_t{}, d, uint64_t{}, r, d, h);
                    })
        t.buffer_wrap_host = &buffer_wrap_host;
      return t;
    }();
    return &api;
  }
};

}  // namespace backplane::plugin

// Defines the plugin's one exported entry symbol for class T.
#define BP_DEFINE_PLUGIN(T, NAME, VERSION)                                                   \
  extern "C" BP_EXPORT const bp_plugin_api* bp_plugin_entry(const bp_host_api* host) {      \
    ::backplane::plugin::host_api().store(host, std::memory_order_release);                \
    return ::backplane::plugin::PluginTable<T>::table(NAME, VERSION);                        \
  }

#endif  // BACKPLANE_PLUGIN_HPP_
