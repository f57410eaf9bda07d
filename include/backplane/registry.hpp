// Registry, Backend and Device: the loaded plugins and what each device can do.
//
// A Registry is built once from backends.json and is immutable afterwards:
// all const methods are safe to call from many threads at once. Backend and
// Device are cheap value handles; each keeps its plugin library loaded while
// it (or any tensor made on it) is alive.
#ifndef BACKPLANE_REGISTRY_HPP_
#define BACKPLANE_REGISTRY_HPP_

#include <backplane/export.hpp>

#include <backplane/capability.hpp>
#include <backplane/dtype.hpp>
#include <backplane/error.hpp>
#include <backplane/op.hpp>

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backplane {

namespace detail {
struct BackendImpl;
struct RegistryImpl;
struct Access;  // the core's way to the private plumbing below
}  // namespace detail

class Backend;

// What set_distributed_params (and process groups) do on a device that
// lacks Capability::collective. Set per backend in backends.json.
struct BACKPLANE_API CollectiveFallback {
  enum class Kind { error, local, host };
  Kind kind = Kind::error;
  std::string host_backend;       // for Kind::host: the backend to stage through
  std::string to_string() const;  // "error", "local", "host:cpu"
};
// "error", "local", "host" / "host:cpu", as backends.json spells them; `<<` writes the same.
BACKPLANE_API std::string to_string(CollectiveFallback::Kind kind);
BACKPLANE_API std::string to_string(const CollectiveFallback& fallback);
BACKPLANE_API std::ostream& operator<<(std::ostream& out, CollectiveFallback::Kind kind);
BACKPLANE_API std::ostream& operator<<(std::ostream& out, const CollectiveFallback& fallback);

// Where a backend's devices run the ops they lack and hold the dtypes they
// lack. Set per backend in backends.json ("op_fallback") or with
// Registry::set_op_fallback; BACKPLANE_OP_FALLBACK=error in the environment
// turns every fallback off (the typed errors come back).
struct BACKPLANE_API OpFallback {
  enum class Kind { error, host };
  Kind kind = Kind::error;
  std::string host_backend;       // for Kind::host: the backend whose device 0 runs what is missing
  std::string to_string() const;  // "error", "host:cpu"
};
// "error" / "host:cpu", as backends.json spells them; `<<` writes the same.
BACKPLANE_API std::string to_string(const OpFallback& fallback);
BACKPLANE_API std::ostream& operator<<(std::ostream& out, const OpFallback& fallback);

// What one (op, dtype) of a backend cost by running on its op_fallback
// backend: the report that tells a plugin author what to implement next.
struct OpFallbackStats {
  Op op = Op::add;
  DType dtype = DType::f32;
  uint64_t calls = 0;          // ops placed on the fallback device
  uint64_t bytes_to_host = 0;  // operand bytes copied to the fallback device for it
  // Bytes copied back to the backend's own device because this op, run
  // there, needed operands whose bytes lived on the fallback device (the
  // results of ops that fell back); calls may be 0. Reads by the program
  // (to_vector, to()) are filed under the op that made the bytes.
  uint64_t bytes_from_host = 0;
  // Time in those ops and copies. The copies are each timed; the ops'
  // time is the mean of a sample (each pair's first 16 calls, then about one
  // in 16 at random) times `calls`, as reading a clock around every op would
  // cost a good part of what a placed op costs.
  double seconds = 0;
  uint64_t bytes_moved() const noexcept { return bytes_to_host + bytes_from_host; }
};

// While one is alive, the ops its thread runs ignore every op_fallback:
// what a device lacks gives the typed error again, as with
// BACKPLANE_OP_FALLBACK=error. `backplane conformance` tests a backend's own
// ops under one, so that a fallback never makes a backend look conformant.
// Nests; other threads are unaffected.
class BACKPLANE_API OpFallbackOff {
 public:
  OpFallbackOff() noexcept;
  ~OpFallbackOff();
  OpFallbackOff(const OpFallbackOff&) = delete;
  OpFallbackOff& operator=(const OpFallbackOff&) = delete;

 private:
  bool previous_;
};

// A device's memory as its plugin reports it (device_memory in abi.h).
struct MemoryInfo {
  uint64_t free_bytes = 0;  // now; may change at any time
  uint64_t total_bytes = 0;
};

class BACKPLANE_API Device {
 public:
  Device() = default;  // an invalid device; valid() is false

  bool valid() const noexcept { return backend_ != nullptr; }
  int32_t index() const noexcept { return index_; }
  // "cpu:0" style: the backend name and the index.
  std::string id() const;
  // The plugin's name for the device, e.g. "host (2 threads)".
  const std::string& name() const;
  Capabilities capabilities() const;
  const std::map<std::string, std::string>& attributes() const;
  // Free and total bytes, asked of the plugin on each call; nullopt when the
  // plugin does not report memory. Throws what the plugin reports.
  std::optional<MemoryInfo> memory() const;
  Backend backend() const;
  // Whether the device can run `op` on dtype: false without the dtype's flag
  // (or 'matmul' for Op::matmul), else the plugin's cached answer.
  bool supports(Op op, DType dtype) const;
  // Waits for queued work; surfaces errors of asynchronous ops.
  void synchronize() const;

  friend bool operator==(const Device& a, const Device& b) noexcept {
    return a.backend_ == b.backend_ && a.index_ == b.index_;
  }

 private:
  friend struct detail::Access;
  Device(std::shared_ptr<detail::BackendImpl> backend, int32_t index)
      : backend_(std::move(backend)), index_(index) {}
  const std::shared_ptr<detail::BackendImpl>& impl() const noexcept { return backend_; }

  std::shared_ptr<detail::BackendImpl> backend_;
  int32_t index_ = -1;
};

class BACKPLANE_API Backend {
 public:
  // unavailable: the plugin loaded but reports that its devices cannot be
  // reached (no driver, no server); it has no devices and error() says why.
  enum class Status { loaded, failed, unavailable };

  const std::string& name() const;
  Status status() const;
  bool loaded() const { return status() == Status::loaded; }
  // Why the backend failed to load or is unavailable ("" when loaded), and
  // its code (Errc::backend_unavailable for an unavailable one).
  const std::string& error() const;
  std::optional<Errc> error_code() const;
  bool required() const;
  // The "library" value from the config, and the file it resolved to
  // ("" when resolution failed).
  const std::string& library() const;
  const std::string& library_path() const;
  // From the plugin's table ("" when the plugin never answered).
  const std::string& version() const;
  // The ABI the plugin was built against, "<major>.<minor>" as its table
  // declares it (e.g. "2.2"; kAbiMajor/kAbiMinor are this core's); "" when
  // unknown.
  std::string abi_version() const;
  CollectiveFallback collective_fallback() const;
  // The op fallback in force (the config's, or the last set_op_fallback);
  // Kind::error while BACKPLANE_OP_FALLBACK=error is set.
  OpFallback op_fallback() const;
  // What ran on the op fallback so far, one entry per (op, dtype), most
  // time first. Thread-safe; counts since load or the last reset.
  std::vector<OpFallbackStats> op_fallback_stats() const;
  void reset_op_fallback_stats() const;

  // The union of the devices' capabilities.
  Capabilities capabilities() const;
  int32_t device_count() const;
  // Throws Errc::backend_unavailable when the backend failed to load or is
  // unavailable, and Errc::not_found when index is out of range.
  Device device(int32_t index = 0) const;
  std::vector<Device> devices() const;

 private:
  friend struct detail::Access;
  explicit Backend(std::shared_ptr<detail::BackendImpl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<detail::BackendImpl>& impl() const noexcept { return impl_; }

  std::shared_ptr<detail::BackendImpl> impl_;
};

// What from_config does when a `required` backend fails to load.
enum class RequiredPolicy {
  throw_on_failure,  // throw Errc::backend_unavailable listing every failed or unavailable one
  report,            // keep it in the registry as failed/unavailable (for tools like `backplane check`)
};

class BACKPLANE_API Registry {
 public:
  // Reads, validates and loads the config. Any schema error anywhere in the
  // file throws Errc::config_error naming the JSON path, as does a config
  // file that others than its owner and root can write. Backends that fail to load stay
  // in the registry with status failed (unavailable when the plugin reports
  // that its devices cannot be reached); if any of them is `required`,
  // throws Errc::backend_unavailable listing every failure and reason. A config that
  // cannot be read or parsed throws Errc::config_error naming the JSON path.
  static Registry from_config(const std::filesystem::path& path,
                              RequiredPolicy policy = RequiredPolicy::throw_on_failure);
  // The same, from JSON text; relative library paths resolve against base_dir.
  static Registry from_json(std::string_view json, const std::filesystem::path& base_dir,
                            std::string_view source_name = "<json>",
                            RequiredPolicy policy = RequiredPolicy::throw_on_failure);
  // BACKPLANE_CONFIG if set, else the installed default. The current folder
  // is never searched: a backends.json there is read only when named.
  static Registry from_env();
  // The rule from_config applies to its file before reading it, for tools
  // that read a config themselves: throws Errc::config_error when anyone
  // other than its owner and root can write `path` or its folder (a sticky
  // folder such as /tmp excepted), saying how to fix the permissions.
  static void check_config_permissions(const std::filesystem::path& path);
  // The text of the config file `path` as from_config reads it, for tools
  // that take it apart themselves: it exists, is a regular file (a FIFO or a
  // device is refused at once, never read), passes
  // check_config_permissions, and is read up to one byte past the size
  // limit (parse_config names the limit). Errc::config_error naming the file
  // otherwise.
  static std::string read_config(const std::filesystem::path& path);
  // The path from_env() would read.
  static std::filesystem::path default_config_path();

  // Every configured backend, in config order, loaded or not.
  std::vector<Backend> backends() const;
  // Throws Errc::not_found for an unknown name (listing the known ones).
  // A backend that failed to load is returned; using its devices throws.
  Backend backend(std::string_view name) const;
  // The config's default_backend, else the first loaded backend.
  Backend default_backend() const;
  // The backend that serves tensors of a torch device type ("cpu", "cuda")
  // in the PyTorch bridge: the config's "torch_devices" entry; without one,
  // default_backend() for "cpu" and nullopt for any other type.
  std::optional<Backend> torch_backend(std::string_view torch_device_type) const;
  // Sets backend `name`'s op fallback, with the config's rules: the target
  // exists, is loaded, is not `name` and does not itself fall back, and no
  // backend falls back to `name` while it falls back (Errc::config_error
  // saying which). Safe while other threads run ops; ops already running
  // finish where they were placed.
  void set_op_fallback(std::string_view name, const OpFallback& fallback) const;
  // The config file this registry came from ("" for from_json).
  const std::filesystem::path& config_path() const;

 private:
  explicit Registry(std::shared_ptr<detail::RegistryImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::RegistryImpl> impl_;
};

}  // namespace backplane

#endif  // BACKPLANE_REGISTRY_HPP_
