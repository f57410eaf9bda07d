// The C++ plugin SDK: write a class, get a complete ABI 2 bp_plugin_api table
// whose every entry catches exceptions and turns them into statuses, reads
// only the argument fields inside the host's struct_size, and keeps returned
// strings alive until destroy(). Include from plugin code only; the core
// never includes it. Beside it: plugin/status.hpp (fail, guard),
// plugin/dtype.hpp (dtype dispatch), plugin/tensor_view.hpp (validated views,
// byte arithmetic), plugin/strided.hpp (strided/broadcast iteration).
//
// clang-format off
//   class MyPlugin {
//    public:
//     // The optional members this class implements. Listing one that is not
//     // there, or defining one that is not listed, is a compile error: a
//     // misspelt optional member cannot silently become a NULL entry.
//     using Features = backplane::plugin::Features<backplane::plugin::Feature::buffer_pointer>;
//
//     explicit MyPlugin(const backplane::plugin::CreateArgs& args);  // cheap: parse options only
//     int32_t device_count();                                        // may block (driver query, connect)
//     backplane::plugin::DeviceInfo device_info(int32_t device);
//     bool supports_op(int32_t device, int32_t op, int32_t dtype);   // raw values: answer false to unknown ones
//     bp_buffer* buffer_alloc(int32_t device, uint64_t size);
//     void buffer_free(bp_buffer* buffer);
//     void buffer_write(bp_buffer* b, uint64_t offset, const void* src, uint64_t size);
//     void buffer_read(bp_buffer* b, uint64_t offset, void* dst, uint64_t size);
//     void execute(const bp_execute_args& args);
//     // Feature::buffer_pointer: backplane::plugin::BufferPointer buffer_pointer(bp_buffer* b);
//     // Feature::buffer_import:  bp_buffer* buffer_import(const bp_buffer_import_args& a);
//     //                          (only the returned buffer owns a.release, taken last:
//     //                          on a throw the host keeps the memory; never call release)
//     // Feature::device_memory:  backplane::plugin::MemoryInfo device_memory(int32_t device);
//     // Feature::synchronize:    void synchronize(int32_t device);
//     // Feature::collectives:    bp_comm* comm_create(const bp_comm_create_args& a);
//     //                          void comm_destroy(bp_comm* c);
//     //                          void comm_abort(bp_comm* c);
//     //                          void all_reduce(bp_comm* c, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op);
//     //                          void broadcast(bp_comm* c, const bp_tensor& t, int32_t root);
//     //                          void all_gather(bp_comm* c, const bp_tensor& in, const bp_tensor& out);
//     //                          void reduce_scatter(bp_comm* c, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op);
//     //                          void barrier(bp_comm* c);
//   };
//   BP_DEFINE_PLUGIN(MyPlugin, "my_plugin", "0.1.0")
// clang-format on
//
// Throw backplane::plugin::Failure (or call fail()) to return a status with a
// chosen code; any other exception becomes BP_STATUS_INTERNAL (or
// BP_STATUS_OUT_OF_MEMORY for std::bad_alloc) carrying what().
//
// The contract is abi.h's opening comment (versioning, errors, capabilities,
// the trust contract, the execution model, threads, ownership, when a plugin
// may block); docs/plugins.md walks through it. What this SDK adds to it:
// each member may be called from the threads abi.h allows and the SDK adds no
// lock; a device that declares BP_CAP_ASYNC, BP_CAP_HOST_VISIBLE or
// BP_CAP_COLLECTIVE without Feature::synchronize, Feature::buffer_pointer or
// Feature::collectives fails device_info with a message naming both.
#ifndef BACKPLANE_PLUGIN_HPP_
#define BACKPLANE_PLUGIN_HPP_

#include <backplane/abi.h>
#include <backplane/plugin/dtype.hpp>
#include <backplane/plugin/status.hpp>
#include <backplane/plugin/strided.hpp>
#include <backplane/plugin/tensor_view.hpp>

#include <atomic>
#include <concepts>
#include <cstdint>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace backplane::plugin {

struct CreateArgs {
  std::string backend_name;
  std::string options_json;  // "{}" when the config gives no options
};

struct DeviceInfo {
  std::string name;
  uint64_t capabilities = 0;
  std::vector<std::pair<std::string, std::string>> attributes;
};

struct MemoryInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

// Where a buffer lives (DLPack export).
struct BufferPointer {
  void* data = nullptr;
  int32_t dl_device_type = BP_DL_CPU;
  int32_t dl_device_id = 0;
};

// The optional members a plugin class can implement.
enum class Feature { buffer_pointer, buffer_import, device_memory, synchronize, collectives };

template <Feature... Fs>
struct Features {
  static constexpr bool has(Feature f) noexcept { return ((f == Fs) || ...); }
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

// 2.4: whether the host records a trace now (false from an older host).
// Cheap: ask before measuring anything for trace_event.
inline bool trace_active() noexcept {
  const bp_host_api* host = host_api().load(std::memory_order_acquire);
  return host != nullptr && BP_HAS_FIELD(bp_host_api, trace_event, host->struct_size) &&
         host->trace_active != nullptr && host->trace_event != nullptr && host->trace_active(host->ctx) != 0;
}

// Adds `event` to the host's trace (struct_size is set here); nothing from
// an older host or when no trace records.
inline void trace_event(bp_trace_event event) noexcept {
  const bp_host_api* host = host_api().load(std::memory_order_acquire);
  if (host == nullptr || !BP_HAS_FIELD(bp_host_api, trace_event, host->struct_size) ||
      host->trace_event == nullptr)
    return;
  event.struct_size = BP_TRACE_EVENT_STRUCT_SIZE;
  host->trace_event(host->ctx, &event);
}

// The clock of trace events: CLOCK_MONOTONIC in nanoseconds.
inline int64_t trace_now_ns() noexcept {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

namespace detail {

template <class T>
concept HasFeatureList = requires {
  typename T::Features;
};

template <class T>
constexpr bool lists(Feature f) {
  if constexpr (HasFeatureList<T>)
    return T::Features::has(f);
  else
    return false;
}

// What each optional feature needs from the class, one concept per member.
template <class T>
concept HasBufferPointer = requires(T& x, bp_buffer* b) {
  { x.buffer_pointer(b) } -> std::same_as<BufferPointer>;
};
template <class T>
concept HasBufferImport = requires(T& x, const bp_buffer_import_args& a) {
  { x.buffer_import(a) } -> std::same_as<bp_buffer*>;
};
template <class T>
concept HasDeviceMemory = requires(T& x) {
  { x.device_memory(int32_t{}) } -> std::same_as<MemoryInfo>;
};
template <class T>
concept HasSynchronize = requires(T& x) {
  x.synchronize(int32_t{});
};
template <class T>
concept HasCommCreate = requires(T& x, const bp_comm_create_args& a) {
  { x.comm_create(a) } -> std::same_as<bp_comm*>;
};
template <class T>
concept HasCommDestroy = requires(T& x, bp_comm* c) {
  x.comm_destroy(c);
};
template <class T>
concept HasCommAbort = requires(T& x, bp_comm* c) {
  x.comm_abort(c);
};
template <class T>
concept HasAllReduce = requires(T& x, bp_comm* c, const bp_tensor& t) {
  x.all_reduce(c, t, t, BP_REDUCE_SUM);
};
template <class T>
concept HasBroadcast = requires(T& x, bp_comm* c, const bp_tensor& t) {
  x.broadcast(c, t, int32_t{});
};
template <class T>
concept HasAllGather = requires(T& x, bp_comm* c, const bp_tensor& t) {
  x.all_gather(c, t, t);
};
template <class T>
concept HasReduceScatter = requires(T& x, bp_comm* c, const bp_tensor& t) {
  x.reduce_scatter(c, t, t, BP_REDUCE_SUM);
};
template <class T>
concept HasBarrier = requires(T& x, bp_comm* c) {
  x.barrier(c);
};
// Any member named like a collective: defining one without listing
// Feature::collectives is a mistake worth a compile error.
template <class T>
concept HasAnyCollectiveMember = HasCommCreate<T> || HasCommDestroy<T> || HasCommAbort<T> ||
    HasAllReduce<T> || HasBroadcast<T> || HasAllGather<T> || HasReduceScatter<T> || HasBarrier<T>;

// Compile-time checks of a plugin class: every listed feature has its members
// with the right signatures, and every optional member is listed.
template <class T>
constexpr bool check_plugin_class() {
  static_assert(
      requires(T & x) {
        { x.device_count() } -> std::convertible_to<int32_t>;
      },
      "a plugin class needs `int32_t device_count()`");
  static_assert(
      requires(T & x) {
        { x.device_info(int32_t{}) } -> std::same_as<DeviceInfo>;
      },
      "a plugin class needs `backplane::plugin::DeviceInfo device_info(int32_t device)`");
  static_assert(
      requires(T & x) {
        { x.supports_op(int32_t{}, int32_t{}, int32_t{}) } -> std::convertible_to<bool>;
      },
      "a plugin class needs `bool supports_op(int32_t device, int32_t op, int32_t dtype)`");
  static_assert(
      requires(T & x) {
        { x.buffer_alloc(int32_t{}, uint64_t{}) } -> std::same_as<bp_buffer*>;
      },
      "a plugin class needs `bp_buffer* buffer_alloc(int32_t device, uint64_t size)`");
  static_assert(
      requires(T & x, bp_buffer * b) { x.buffer_free(b); },
      "a plugin class needs `void buffer_free(bp_buffer* buffer)`");
  static_assert(
      requires(T & x, bp_buffer * b, const void* s) { x.buffer_write(b, uint64_t{}, s, uint64_t{}); },
      "a plugin class needs `void buffer_write(bp_buffer*, uint64_t offset, const void* src, uint64_t "
      "size)`");
  static_assert(
      requires(T & x, bp_buffer * b, void* d) { x.buffer_read(b, uint64_t{}, d, uint64_t{}); },
      "a plugin class needs `void buffer_read(bp_buffer*, uint64_t offset, void* dst, uint64_t size)`");
  static_assert(
      requires(T & x, const bp_execute_args& a) { x.execute(a); },
      "a plugin class needs `void execute(const bp_execute_args& args)`");

  static_assert(!lists<T>(Feature::buffer_pointer) || HasBufferPointer<T>,
                "Features lists buffer_pointer, but the class has no "
                "`backplane::plugin::BufferPointer buffer_pointer(bp_buffer*)`");
  static_assert(lists<T>(Feature::buffer_pointer) || !HasBufferPointer<T>,
                "the class defines buffer_pointer() but its Features do not list Feature::buffer_pointer");
  static_assert(!lists<T>(Feature::buffer_import) || HasBufferImport<T>,
                "Features lists buffer_import, but the class has no "
                "`bp_buffer* buffer_import(const bp_buffer_import_args&)`");
  static_assert(lists<T>(Feature::buffer_import) || !HasBufferImport<T>,
                "the class defines buffer_import() but its Features do not list Feature::buffer_import");
  static_assert(!lists<T>(Feature::device_memory) || HasDeviceMemory<T>,
                "Features lists device_memory, but the class has no "
                "`backplane::plugin::MemoryInfo device_memory(int32_t device)`");
  static_assert(lists<T>(Feature::device_memory) || !HasDeviceMemory<T>,
                "the class defines device_memory() but its Features do not list Feature::device_memory");
  static_assert(!lists<T>(Feature::synchronize) || HasSynchronize<T>,
                "Features lists synchronize, but the class has no `void synchronize(int32_t device)`");
  static_assert(lists<T>(Feature::synchronize) || !HasSynchronize<T>,
                "the class defines synchronize() but its Features do not list Feature::synchronize");

  static_assert(
      !lists<T>(Feature::collectives) || HasCommCreate<T>,
      "Features lists collectives, but the class has no `bp_comm* comm_create(const bp_comm_create_args&)`");
  static_assert(!lists<T>(Feature::collectives) || HasCommDestroy<T>,
                "Features lists collectives, but the class has no `void comm_destroy(bp_comm*)`");
  static_assert(!lists<T>(Feature::collectives) || HasCommAbort<T>,
                "Features lists collectives, but the class has no `void comm_abort(bp_comm*)`: a hung "
                "communicator must be abortable");
  static_assert(!lists<T>(Feature::collectives) || HasAllReduce<T>,
                "Features lists collectives, but the class has no "
                "`void all_reduce(bp_comm*, const bp_tensor& in, const bp_tensor& out, bp_reduce_op)`");
  static_assert(!lists<T>(Feature::collectives) || HasBroadcast<T>,
                "Features lists collectives, but the class has no "
                "`void broadcast(bp_comm*, const bp_tensor&, int32_t root)`");
  static_assert(!lists<T>(Feature::collectives) || HasAllGather<T>,
                "Features lists collectives, but the class has no "
                "`void all_gather(bp_comm*, const bp_tensor& in, const bp_tensor& out)`");
  static_assert(!lists<T>(Feature::collectives) || HasReduceScatter<T>,
                "Features lists collectives, but the class has no "
                "`void reduce_scatter(bp_comm*, const bp_tensor& in, const bp_tensor& out, bp_reduce_op)`");
  static_assert(!lists<T>(Feature::collectives) || HasBarrier<T>,
                "Features lists collectives, but the class has no `void barrier(bp_comm*)`");
  static_assert(lists<T>(Feature::collectives) || !HasAnyCollectiveMember<T>,
                "the class defines collective members but its Features do not list Feature::collectives");
  return true;
}

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

// Argument structs from a host of an older minor are shorter: copy what fits
// into a zeroed struct of this build's size, so absent fields read as zero.
// The host's struct_size ends on a field (a field's end under the 2.2 rule,
// sizeof under 2.1's); what it declares is copied as it is.
template <class Args>
Args read_args(const Args* in) noexcept {
  Args a{};
  const size_t n = in->struct_size < sizeof(Args) ? in->struct_size : sizeof(Args);
  __builtin_memcpy(static_cast<void*>(&a), in, n);
  a.struct_size = n;
  return a;
}

// Writes an out-field only when it lies inside the caller's struct.
#define BP_SDK_SET_OUT_(args, type, field, value)                                \
  do {                                                                           \
    if (BP_HAS_FIELD(type, field, (args)->struct_size)) (args)->field = (value); \
  } while (0)

}  // namespace detail

template <class T>
struct PluginTable {
  static_assert(detail::check_plugin_class<T>());
  using I = detail::Instance<T>;
  static T& impl(bp_plugin* p) noexcept { return detail::self<T>(p)->impl; }

  static bp_status* create(bp_create_args* args) noexcept {
    return guard([&] {
      if (args == nullptr) fail(BP_STATUS_INVALID_ARGUMENT, "create: NULL arguments");
      CreateArgs a;
      if (BP_HAS_FIELD(bp_create_args, backend_name, args->struct_size) && args->backend_name)
        a.backend_name = args->backend_name;
      a.options_json = "{}";
      if (BP_HAS_FIELD(bp_create_args, options_json, args->struct_size) && args->options_json)
        a.options_json = args->options_json;
      if (!BP_HAS_FIELD(bp_create_args, plugin, args->struct_size))
        fail(BP_STATUS_INVALID_ARGUMENT, "create: the host's bp_create_args has no room for the instance");
      args->plugin = reinterpret_cast<bp_plugin*>(new I(a));
    });
  }
  static void destroy(bp_plugin* p) noexcept { delete detail::self<T>(p); }

  static bp_status* device_count(bp_device_count_args* args) noexcept {
    return guard(
        [&] { BP_SDK_SET_OUT_(args, bp_device_count_args, num_devices, impl(args->plugin).device_count()); });
  }

  static bool same_strings(const DeviceInfo& a, const DeviceInfo& b) {
    return a.name == b.name && a.attributes == b.attributes;
  }
  static void check_promises(const DeviceInfo& info, int32_t device) {
    std::string missing;
    auto need = [&](uint64_t flag, Feature f, const char* feature) {
      if ((info.capabilities & flag) != 0 && !detail::lists<T>(f))
        missing += std::string(missing.empty() ? "" : "; ") + "declares '" + bp_capability_name(flag) +
                   "' but its class does not implement Feature::" + feature;
    };
    need(BP_CAP_ASYNC, Feature::synchronize, "synchronize");
    need(BP_CAP_HOST_VISIBLE, Feature::buffer_pointer, "buffer_pointer");
    need(BP_CAP_COLLECTIVE, Feature::collectives, "collectives");
    if (!missing.empty()) fail(BP_STATUS_INTERNAL, "device " + std::to_string(device) + " " + missing);
  }
  static bp_status* device_info(bp_device_info_args* out) noexcept {
    return guard([&] {
      I* inst = detail::self<T>(out->plugin);
      DeviceInfo info = inst->impl.device_info(out->device);
      check_promises(info, out->device);
      // Returned strings must stay valid until destroy(): reuse an earlier
      // answer with the same strings rather than growing on every call.
      std::lock_guard<std::mutex> lock(inst->info_mutex);
      typename I::Cached* cached = nullptr;
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
      }
      BP_SDK_SET_OUT_(out, bp_device_info_args, name, cached->info.name.c_str());
      BP_SDK_SET_OUT_(out, bp_device_info_args, capabilities, cached->info.capabilities);
      BP_SDK_SET_OUT_(out, bp_device_info_args, attributes, cached->attributes.data());
      BP_SDK_SET_OUT_(out, bp_device_info_args, num_attributes,
                      static_cast<int32_t>(cached->attributes.size()));
    });
  }
  static bp_status* supports_op(bp_supports_op_args* args) noexcept {
    return guard([&] {
      const bool yes = impl(args->plugin).supports_op(args->device, args->op, args->dtype);
      BP_SDK_SET_OUT_(args, bp_supports_op_args, supported, yes ? 1 : 0);
    });
  }
  static bp_status* device_memory(bp_device_memory_args* args) noexcept {
    return guard([&] {
      const MemoryInfo m = impl(args->plugin).device_memory(args->device);
      BP_SDK_SET_OUT_(args, bp_device_memory_args, free_bytes, m.free_bytes);
      BP_SDK_SET_OUT_(args, bp_device_memory_args, total_bytes, m.total_bytes);
    });
  }

  static bp_status* buffer_alloc(bp_buffer_alloc_args* args) noexcept {
    return guard([&] {
      BP_SDK_SET_OUT_(args, bp_buffer_alloc_args, buffer,
                      impl(args->plugin).buffer_alloc(args->device, args->size));
    });
  }
  static bp_status* buffer_free(bp_buffer_free_args* args) noexcept {
    return guard([&] { impl(args->plugin).buffer_free(args->buffer); });
  }
  static bp_status* buffer_write(bp_buffer_copy_args* args) noexcept {
    return guard([&] { impl(args->plugin).buffer_write(args->buffer, args->offset, args->src, args->size); });
  }
  static bp_status* buffer_read(bp_buffer_copy_args* args) noexcept {
    return guard([&] { impl(args->plugin).buffer_read(args->buffer, args->offset, args->dst, args->size); });
  }
  static bp_status* buffer_pointer(bp_buffer_pointer_args* args) noexcept {
    return guard([&] {
      const BufferPointer p = impl(args->plugin).buffer_pointer(args->buffer);
      BP_SDK_SET_OUT_(args, bp_buffer_pointer_args, data, p.data);
      BP_SDK_SET_OUT_(args, bp_buffer_pointer_args, dl_device_type, p.dl_device_type);
      BP_SDK_SET_OUT_(args, bp_buffer_pointer_args, dl_device_id, p.dl_device_id);
    });
  }
  // Ownership of the memory passes only with success (abi.h): the class takes
  // `release` into the buffer it returns, built last, so a throw leaves the
  // memory with the host. The SDK itself never calls release.
  static bp_status* buffer_import(bp_buffer_import_args* in) noexcept {
    const bp_buffer_import_args a = detail::read_args(in);
    return guard([&] { in->buffer = impl(a.plugin).buffer_import(a); });
  }

  static bp_status* execute(bp_execute_args* in) noexcept {
    // The hot path: a host of this minor or newer passes every field this
    // build reads. Only an older host's shorter struct is copied (so fields a
    // newer minor appends read as zero).
    if (in->struct_size >= BP_EXECUTE_ARGS_STRUCT_SIZE) [[likely]]
      return guard([&] { impl(in->plugin).execute(*in); });
    const bp_execute_args args = detail::read_args(in);
    return guard([&] { impl(args.plugin).execute(args); });
  }
  static bp_status* synchronize(bp_synchronize_args* args) noexcept {
    return guard([&] { impl(args->plugin).synchronize(args->device); });
  }

  static bp_status* comm_create(bp_comm_create_args* in) noexcept {
    return guard([&] {
      const bp_comm_create_args a = detail::read_args(in);
      BP_SDK_SET_OUT_(in, bp_comm_create_args, comm, impl(a.plugin).comm_create(a));
    });
  }
  static bp_status* comm_destroy(bp_comm_args* args) noexcept {
    return guard([&] { impl(args->plugin).comm_destroy(args->comm); });
  }
  static bp_status* comm_abort(bp_comm_args* args) noexcept {
    return guard([&] { impl(args->plugin).comm_abort(args->comm); });
  }
  static bp_status* all_reduce(bp_collective_args* a) noexcept {
    return guard([&] {
      impl(a->plugin).all_reduce(a->comm, *a->input, *a->output, static_cast<bp_reduce_op>(a->reduce_op));
    });
  }
  static bp_status* broadcast(bp_collective_args* a) noexcept {
    return guard([&] { impl(a->plugin).broadcast(a->comm, *a->output, a->root); });
  }
  static bp_status* all_gather(bp_collective_args* a) noexcept {
    return guard([&] { impl(a->plugin).all_gather(a->comm, *a->input, *a->output); });
  }
  static bp_status* reduce_scatter(bp_collective_args* a) noexcept {
    return guard([&] {
      impl(a->plugin).reduce_scatter(a->comm, *a->input, *a->output, static_cast<bp_reduce_op>(a->reduce_op));
    });
  }
  static bp_status* barrier(bp_collective_args* a) noexcept {
    return guard([&] { impl(a->plugin).barrier(a->comm); });
  }

  static const bp_plugin_api* table(const char* name, const char* version) noexcept {
    static const bp_plugin_api api = [&] {
      bp_plugin_api t{};
      t.struct_size = BP_PLUGIN_API_STRUCT_SIZE;
      t.abi_major = BP_ABI_MAJOR;
      t.abi_minor = BP_ABI_MINOR;
      t.plugin_name = name;
      t.plugin_version = version;
      t.status_code = &plugin::status_code;
      t.status_message = &plugin::status_message;
      t.status_free = &plugin::status_free;
      t.create = &create;
      t.destroy = &destroy;
      t.device_count = &device_count;
      t.device_info = &device_info;
      t.supports_op = &supports_op;
      t.buffer_alloc = &buffer_alloc;
      t.buffer_free = &buffer_free;
      t.buffer_write = &buffer_write;
      t.buffer_read = &buffer_read;
      t.execute = &execute;
      if constexpr (detail::lists<T>(Feature::device_memory)) t.device_memory = &device_memory;
      if constexpr (detail::lists<T>(Feature::buffer_pointer)) t.buffer_pointer = &buffer_pointer;
      if constexpr (detail::lists<T>(Feature::buffer_import)) t.buffer_import = &buffer_import;
      if constexpr (detail::lists<T>(Feature::synchronize)) t.synchronize = &synchronize;
      if constexpr (detail::lists<T>(Feature::collectives)) {
        t.comm_create = &comm_create;
        t.comm_destroy = &comm_destroy;
        t.comm_abort = &comm_abort;
        t.all_reduce = &all_reduce;
        t.broadcast = &broadcast;
        t.all_gather = &all_gather;
        t.reduce_scatter = &reduce_scatter;
        t.barrier = &barrier;
      }
      return t;
    }();
    return &api;
  }
};

}  // namespace backplane::plugin

// Defines the plugin's one exported entry symbol for class T.
#define BP_DEFINE_PLUGIN(T, NAME, VERSION)                                             \
  extern "C" BP_EXPORT const bp_plugin_api* bp_plugin_entry(const bp_host_api* host) { \
    ::backplane::plugin::host_api().store(host, std::memory_order_release);            \
    return ::backplane::plugin::PluginTable<T>::table(NAME, VERSION);                  \
  }

#endif  // BACKPLANE_PLUGIN_HPP_
