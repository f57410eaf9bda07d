// Registry, Backend and Device: building the registry from a config and the
// read-only views over what was loaded.
#include "common/suggest.hpp"
#include "config/config.hpp"
#include "registry/loader.hpp"
#include "tensor/placement.hpp"
#include "tensor/tensor_impl.hpp"
#include "trace/trace_format.hpp"

#include <backplane/hosting.hpp>
#include <backplane/log.hpp>
#include <backplane/registry.hpp>

#include <backplane_common/unique_fd.hpp>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace backplane {
namespace detail {

namespace {
constexpr Errc kCallFailed = Errc::internal;  // a plugin entry that throws after loading
}  // namespace

BackendImpl::~BackendImpl() {
  if (plugin == nullptr || api.destroy == nullptr) return;
  try {
    call_entry(*this, "destroy", kCallFailed, api.destroy, plugin);
  } catch (const Error& e) {  // a destructor cannot fail: the plugin instance is abandoned
    try {
      log(LogLevel::error, e.message());
    } catch (...) {
    }
  }
}

Errc errc_from_status(int32_t code) noexcept {
  switch (code) {
    case BP_STATUS_INVALID_ARGUMENT:
      return Errc::invalid_argument;
    case BP_STATUS_UNSUPPORTED:
      return Errc::unsupported_op;
    case BP_STATUS_OUT_OF_MEMORY:
      return Errc::out_of_memory;
    case BP_STATUS_INTERNAL:
      return Errc::internal;
    case BP_STATUS_TIMEOUT:
      return Errc::timeout;
    case BP_STATUS_COLLECTIVE:
      return Errc::collective_error;
    case BP_STATUS_UNAVAILABLE:
      return Errc::backend_unavailable;
    case BP_STATUS_IO:
      return Errc::io_error;
    case BP_STATUS_DEVICE:
    default:
      return Errc::device_error;
  }
}

void BackendImpl::check(bp_status* status, std::string_view what) const {
  if (status == nullptr) return;
  const int32_t code = call_entry(*this, "status_code", kCallFailed, api.status_code, status);
  const char* raw = call_entry(*this, "status_message", kCallFailed, api.status_message, status);
  std::string message = raw != nullptr && raw[0] != '\0' ? raw : "(the plugin gave no message)";
  call_entry(*this, "status_free", kCallFailed, api.status_free, status);
  if (code == BP_STATUS_OK) return;  // a plugin that returns an OK status object
  throw Error(errc_from_status(code), "backend \"" + name + "\": " + std::string(what) + ": " + message);
}

void BackendImpl::ensure_loaded() const {
  if (load_done.load(std::memory_order_acquire)) [[likely]]
    return;
  std::call_once(load_once, [this] {
    // Never a const object: every BackendImpl is made by make_shared.
    auto& self = const_cast<BackendImpl&>(*this);
    if (auto load = std::exchange(self.loader, nullptr)) load(self);
    load_done.store(true, std::memory_order_release);
  });
}

uint32_t BackendImpl::trace_label(int32_t device) const noexcept {
  if (trace_labels == nullptr || device < 0 || static_cast<std::size_t>(device) >= devices.size())
    return trace::detail::device_label(serial, name, device);
  std::atomic<uint32_t>& slot = trace_labels[static_cast<std::size_t>(device)];
  uint32_t id = slot.load(std::memory_order_relaxed);
  if (id == 0) {
    id = trace::detail::device_label(serial, name, device);
    slot.store(id, std::memory_order_relaxed);
  }
  return id;
}

void BackendImpl::require_loaded() const {
  ensure_loaded();
  if (status == Backend::Status::loaded) return;
  const char* state = status == Backend::Status::unavailable ? "unavailable" : "not available";
  throw Error(Errc::backend_unavailable, "backend \"" + name + "\" is " + state + ": " + error +
                                             "\n  (`backplane check` explains every backend of a config)");
}

bool BackendImpl::supports(int32_t device, int32_t op, int32_t dtype) {
  if (op <= 0 || dtype <= 0 || dtype >= BP_DTYPE_COUNT_) return false;
  // One question to the plugin; a failing status is a "no", logged (at debug:
  // the caller turns the "no" into its own error) once per cached answer.
  auto ask = [&]() -> bool {
    bp_supports_op_args args{};
    args.struct_size = BP_SUPPORTS_OP_ARGS_STRUCT_SIZE;
    args.plugin = plugin;
    args.device = device;
    args.op = op;
    args.dtype = dtype;
    bp_status* st = call_entry(*this, "supports_op", kCallFailed, api.supports_op, &args);
    if (st == nullptr) return args.supported != 0;
    const int32_t code = call_entry(*this, "status_code", kCallFailed, api.status_code, st);
    const char* raw = call_entry(*this, "status_message", kCallFailed, api.status_message, st);
    std::string message = raw != nullptr ? raw : "";
    call_entry(*this, "status_free", kCallFailed, api.status_free, st);
    if (code == BP_STATUS_OK) return args.supported != 0;
    const char* op_text = bp_op_name(op);
    const char* code_text = bp_status_code_name(code);
    log(LogLevel::debug, "backend \"" + name + "\": supports_op(" + (op_text ? op_text : std::to_string(op)) +
                             ", " + bp_dtype_name(dtype) + ") on " + device_id(device) + " failed (" +
                             (code_text ? code_text : std::to_string(code)) + ": " + message +
                             "); taken as unsupported");
    return false;
  };
  std::atomic<uint8_t>* slot = support_slot(device, op, dtype);
  if (slot == nullptr) return ask();  // an op this core does not know: never cached
  uint8_t v = slot->load(std::memory_order_relaxed);
  if (v == 0) {
    v = ask() ? 1 : 2;
    // Never overwrites the kSupportReady placement stores (also a yes).
    uint8_t expected = 0;
    slot->compare_exchange_strong(expected, v, std::memory_order_relaxed);
  }
  return v != 2;
}

void BackendImpl::require_dtype_capability(int32_t device, DType dtype, std::string_view api_name) const {
  const Capability flag = capability_for(dtype);
  if (static_cast<uint64_t>(flag) != 0 && has(device, flag)) return;
  const std::string dt(to_string(dtype));
  throw Error(Errc::capability_missing,
              std::string(api_name) + ": device " + device_id(device) + " (\"" +
                  devices[static_cast<std::size_t>(device)].name + "\") of backend \"" + name +
                  "\" lacks the capability '" + dt + "': it cannot hold " + dt +
                  " tensors; cast to a dtype the device has (`backplane list` shows its capabilities), use "
                  "a device with '" +
                  dt + "', or set \"op_fallback\": \"host:<backend>\" at " + config_entry + " in " +
                  config_source + " to hold them on that backend's device for this one");
}

void BackendImpl::synchronize_now(int32_t device, std::string_view what) const {
  bp_synchronize_args args{};
  args.struct_size = BP_SYNCHRONIZE_ARGS_STRUCT_SIZE;
  args.plugin = plugin;
  args.device = device;
  if (bp_status* st = call_entry(*this, "synchronize", kCallFailed, api.synchronize, &args)) [[unlikely]]
    check_on(st, what, ": synchronize ", device);
}

std::byte* BackendImpl::host_pointer(int32_t device, bp_buffer* buffer, std::string_view what) const {
  if (!has(device, Capability::host_visible) || api.buffer_pointer == nullptr) return nullptr;
  bp_buffer_pointer_args args{};
  args.struct_size = BP_BUFFER_POINTER_ARGS_STRUCT_SIZE;
  args.plugin = plugin;
  args.buffer = buffer;
  if (bp_status* st = call_entry(*this, "buffer_pointer", kCallFailed, api.buffer_pointer, &args))
      [[unlikely]]
    check_on(st, what, ": buffer_pointer on ", device);
  if (args.data == nullptr || (args.dl_device_type != BP_DL_CPU && args.dl_device_type != BP_DL_CUDA_HOST))
    throw Error(Errc::device_error,
                "backend \"" + name + "\": " + std::string(what) + ": device " + device_id(device) +
                    " declares host_visible but buffer_pointer gave no host address (data " +
                    (args.data == nullptr ? "NULL" : "set") + ", DLPack device type " +
                    std::to_string(args.dl_device_type) + "); the plugin breaks the ABI");
  return static_cast<std::byte*>(args.data);
}

void BackendImpl::check_on(bp_status* status, std::string_view what, std::string_view call,
                           int32_t device) const {
  check(status, std::string(what) + std::string(call) + device_id(device));
}

bp_status* BackendImpl::write_status(bp_buffer* buffer, uint64_t offset, const void* src,
                                     uint64_t size) const {
  bp_buffer_copy_args args = copy_args(buffer, offset, size);
  args.src = src;
  return call_entry(*this, "buffer_write", kCallFailed, api.buffer_write, &args);
}

bp_status* BackendImpl::read_status(bp_buffer* buffer, uint64_t offset, void* dst, uint64_t size) const {
  bp_buffer_copy_args args = copy_args(buffer, offset, size);
  args.dst = dst;
  return call_entry(*this, "buffer_read", kCallFailed, api.buffer_read, &args);
}

void BackendImpl::write(bp_buffer* buffer, uint64_t offset, const void* src, uint64_t size,
                        std::string_view what) const {
  check(write_status(buffer, offset, src, size), what);
}

void BackendImpl::read(bp_buffer* buffer, uint64_t offset, void* dst, uint64_t size,
                       std::string_view what) const {
  check(read_status(buffer, offset, dst, size), what);
}

bp_buffer_copy_args BackendImpl::copy_args(bp_buffer* buffer, uint64_t offset, uint64_t size) const noexcept {
  bp_buffer_copy_args args{};
  args.struct_size = BP_BUFFER_COPY_ARGS_STRUCT_SIZE;
  args.plugin = plugin;
  args.buffer = buffer;
  args.offset = offset;
  args.size = size;
  return args;
}

namespace {

// Loads one backend; a failure of any kind fails only this backend, and is
// its status and error.
void load_now(BackendImpl& b, const BackendConfig& entry, const Config& cfg) {
  std::optional<Error> failure;
  try {
    load_backend(b, entry, cfg);
  } catch (const Error& e) {
    failure = e;
  } catch (const std::exception& e) {  // e.g. bad_alloc, filesystem_error: still only this backend fails
    failure = Error(Errc::plugin_load_failed, "backend \"" + b.name + "\": " + e.what());
  } catch (...) {  // plugin calls are wrapped (call_entry); this keeps any other escape to this backend
    rethrow_if_forced_unwind();
    failure =
        Error(Errc::plugin_load_failed, "backend \"" + b.name + "\": loading threw a non-standard exception");
  }
  if (!failure) return;
  const Error& e = *failure;
  b.status = Backend::Status::failed;
  b.error = e.message();
  b.error_code = e.code();
  // Nothing of a failed plugin is used: release it now.
  if (bp_plugin* instance = std::exchange(b.plugin, nullptr)) {
    try {
      call_entry(b, "destroy", Errc::plugin_load_failed, b.api.destroy, instance);
    } catch (const Error& d) {  // the backend has failed already; the instance is abandoned
      log(LogLevel::debug, d.message());
    }
  }
  b.devices.clear();
  b.capabilities = Capabilities();
  b.library_handle.reset();
  log(LogLevel::debug, "backend \"" + b.name + "\" failed to load: " + e.message());
}

std::shared_ptr<RegistryImpl> build(const Config& cfg, RequiredPolicy policy) {
  trace::detail::start_from_env();  // BACKPLANE_TRACE: recording starts with the first registry
  auto reg = std::make_shared<RegistryImpl>();
  reg->default_backend = cfg.default_backend;
  reg->torch_devices = cfg.torch_devices;
  const auto shared_cfg = std::make_shared<const Config>(cfg);  // the optional backends' loaders keep it
  for (std::size_t i = 0; i < cfg.backends.size(); ++i) {
    const BackendConfig& entry = cfg.backends[i];
    auto b = std::make_shared<BackendImpl>();
    b->name = entry.name;
    b->config_entry = entry.path;
    b->config_source = cfg.source;
    b->config_backends = cfg.backends.size();
    b->library = entry.library;
    b->required = entry.required;
    b->collective_fallback = entry.fallback;
    b->op_fallback.set(entry.op_fallback, nullptr);  // its target is resolved below
    b->loader = [shared_cfg, i](BackendImpl& self) { load_now(self, shared_cfg->backends[i], *shared_cfg); };
    if (b->required) b->ensure_loaded();  // fail fast; optional ones wait for their first use
    reg->backends.push_back(std::move(b));
  }
  for (const auto& b : reg->backends) {
    // A target that failed to load is still named: using it gives its reason.
    const OpFallback op_fallback = b->op_fallback.configured();
    if (op_fallback.kind != OpFallback::Kind::host) continue;
    for (const auto& o : reg->backends)
      if (o != b && o->name == op_fallback.host_backend) b->op_fallback.set(op_fallback, o);
  }
  for (const auto& b : reg->backends) {
    // Never itself (no ownership cycle); a backend that fails to load stages nothing.
    if (b->collective_fallback.kind != CollectiveFallback::Kind::host) continue;
    for (const auto& o : reg->backends)
      if (o != b && o->name == b->collective_fallback.host_backend) b->collective_host = o;
  }
  if (policy == RequiredPolicy::throw_on_failure) {
    std::string failures;
    for (const auto& b : reg->backends) {
      if (!b->required || b->status == Backend::Status::loaded) continue;
      // A failed backend's error already names it; an unavailable one's is the plugin's reason.
      if (b->status == Backend::Status::unavailable)
        failures += "\n  - backend \"" + b->name + "\" is unavailable: " + b->error;
      else
        failures += "\n  - " + b->error;
    }
    if (!failures.empty())
      throw Error(Errc::backend_unavailable,
                  cfg.source + ": required backend(s) failed to load or are unavailable:" + failures +
                      "\n  (run `backplane check --config " + cfg.source + "` for details)");
  }
  return reg;
}

}  // namespace
}  // namespace detail

namespace fs = std::filesystem;

std::string CollectiveFallback::to_string() const {
  switch (kind) {
    case Kind::error:
      return "error";
    case Kind::local:
      return "local";
    case Kind::host:
      return "host:" + host_backend;
  }
  return "error";
}

// ---- Registry --------------------------------------------------------------

Registry Registry::from_json(std::string_view json, const fs::path& base_dir, std::string_view source_name,
                             RequiredPolicy policy) {
  detail::Config cfg = detail::parse_config(json, fs::absolute(base_dir), source_name);
  return Registry(detail::build(cfg, policy));
}

void Registry::check_config_permissions(const std::filesystem::path& path) {
  detail::require_private_file(path, "config file", Errc::config_error);
}

std::string Registry::read_config(const fs::path& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    throw Error(Errc::config_error, "config file " + path.string() +
                                        " does not exist (pass --config FILE or set BACKPLANE_CONFIG)");
  }
  if (!fs::is_regular_file(st)) {
    throw Error(Errc::config_error,
                "config file " + path.string() +
                    " is not a regular file (a directory?); name the backends.json file itself");
  }
  // It names the code this process will load: only its owner (or root) may change it.
  check_config_permissions(path);
  // Opened without blocking (a FIFO swapped in after the check above must not
  // stall the process), and checked again on the descriptor itself: what is
  // read is the regular file that was checked.
  const common::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  struct stat opened {};
  if (!fd || ::fstat(fd.get(), &opened) != 0) {
    throw Error(Errc::config_error, "config file " + path.string() + " cannot be read (" +
                                        std::strerror(errno) + "; check its permissions)");
  }
  if (!S_ISREG(opened.st_mode)) {
    throw Error(Errc::config_error, "config file " + path.string() +
                                        " is not a regular file; name the backends.json file itself");
  }
  // Read one byte past the limit, never more: parse_config names the limit.
  std::string text(detail::kMaxConfigBytes + 1, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(Errc::config_error,
                  "config file " + path.string() + " cannot be read (" + std::strerror(errno) + ")");
    }
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return text;
}

Registry Registry::from_config(const fs::path& path, RequiredPolicy policy) {
  const std::string text = read_config(path);
  const fs::path abs = fs::absolute(path);
  detail::Config cfg = detail::parse_config(text, abs.parent_path(), path.string());
  Registry r(detail::build(cfg, policy));
  r.impl_->config_path = abs;
  return r;
}

fs::path Registry::default_config_path() {
  if (const char* env = std::getenv("BACKPLANE_CONFIG"); env != nullptr && env[0] != '\0') return env;
  // The installed default sits beside the installed library. The current
  // folder is never searched: a backends.json planted there names code to load.
  std::error_code ec;
  fs::path here = boost::dll::this_line_location(ec);
  if (ec) return {};
  return (here.parent_path() / BACKPLANE_RELATIVE_CONFIG).lexically_normal();
}

Registry Registry::from_env() {
  const fs::path path = default_config_path();
  if (path.empty())
    throw Error(Errc::config_error,
                "no config: BACKPLANE_CONFIG is not set and the installed default cannot be "
                "located; set BACKPLANE_CONFIG=FILE or call Registry::from_config(FILE)");
  return from_config(path);
}

std::vector<Backend> Registry::backends() const {
  std::vector<Backend> out;
  out.reserve(impl_->backends.size());
  for (const auto& b : impl_->backends) out.push_back(detail::Access::make_backend(b));
  return out;
}

Backend Registry::backend(std::string_view name) const {
  for (const auto& b : impl_->backends)
    if (b->name == name) return detail::Access::make_backend(b);
  std::vector<std::string> names;
  std::string known;
  for (const auto& b : impl_->backends) {
    names.push_back(b->name);
    known += (known.empty() ? "" : ", ") + b->name;
  }
  const std::string where = impl_->config_path.empty() ? "the config" : impl_->config_path.string();
  throw Error(Errc::not_found, "no backend named \"" + std::string(name) + "\" in " + where +
                                   detail::did_you_mean(name, names) +
                                   "; configured: " + (known.empty() ? "none" : known));
}

std::optional<Backend> Registry::torch_backend(std::string_view torch_device_type) const {
  for (const auto& [type, name] : impl_->torch_devices)
    if (type == torch_device_type) return backend(name);
  if (torch_device_type == "cpu") return default_backend();
  return std::nullopt;
}

Backend Registry::default_backend() const {
  if (!impl_->default_backend.empty()) return backend(impl_->default_backend);
  for (const auto& b : impl_->backends)
    if (b->is_loaded()) return detail::Access::make_backend(b);
  throw Error(Errc::backend_unavailable, "no backend loaded, so there is no default backend");
}

const fs::path& Registry::config_path() const { return impl_->config_path; }

// ---- Backend ---------------------------------------------------------------

const std::string& Backend::name() const { return impl_->name; }
Backend::Status Backend::status() const {
  impl_->ensure_loaded();
  return impl_->status;
}
const std::string& Backend::error() const {
  impl_->ensure_loaded();
  return impl_->error;
}
std::optional<Errc> Backend::error_code() const {
  impl_->ensure_loaded();
  return impl_->error_code;
}
bool Backend::required() const { return impl_->required; }
const std::string& Backend::library() const { return impl_->library; }
const std::string& Backend::library_path() const {
  impl_->ensure_loaded();
  return impl_->library_path;
}
const std::string& Backend::version() const {
  impl_->ensure_loaded();
  return impl_->plugin_version;
}
std::string Backend::abi_version() const {
  impl_->ensure_loaded();
  if (!impl_->abi) return "";
  return std::to_string(impl_->abi->first) + "." + std::to_string(impl_->abi->second);
}
CollectiveFallback Backend::collective_fallback() const { return impl_->collective_fallback; }
Capabilities Backend::capabilities() const {
  impl_->ensure_loaded();
  return impl_->capabilities;
}
int32_t Backend::device_count() const {
  impl_->ensure_loaded();
  return static_cast<int32_t>(impl_->devices.size());
}

HostedPlugin hosted_plugin(const Backend& backend) {
  const auto& impl = detail::Access::impl(backend);
  impl->require_loaded();
  return HostedPlugin{&impl->api, impl->plugin};
}

Device Backend::device(int32_t index) const {
  impl_->require_loaded();
  if (index < 0 || index >= device_count()) {
    throw Error(Errc::not_found, "backend \"" + impl_->name + "\" has no device " + std::to_string(index) +
                                     " (it has " + std::to_string(device_count()) + ")");
  }
  return detail::Access::make_device(impl_, index);
}

std::vector<Device> Backend::devices() const {
  std::vector<Device> out;
  if (!impl_->is_loaded()) return out;
  for (int32_t i = 0; i < device_count(); ++i) out.push_back(detail::Access::make_device(impl_, i));
  return out;
}

// ---- Device ----------------------------------------------------------------

namespace {
const detail::DeviceRecord& record(const std::shared_ptr<detail::BackendImpl>& b, int32_t index) {
  if (!b) throw Error(Errc::invalid_argument, "use of an invalid (default-constructed) Device");
  if (index < 0 || static_cast<std::size_t>(index) >= b->devices.size()) {
    b->require_loaded();
    throw Error(Errc::not_found, "backend \"" + b->name + "\" has no device " + std::to_string(index) +
                                     " (it has " + std::to_string(b->devices.size()) + ")");
  }
  return b->devices[static_cast<std::size_t>(index)];
}
}  // namespace

std::string Device::id() const {
  if (!backend_) return "invalid";
  return backend_->device_id(index_);
}
const std::string& Device::name() const { return record(backend_, index_).name; }
Capabilities Device::capabilities() const { return record(backend_, index_).capabilities; }
const std::map<std::string, std::string>& Device::attributes() const {
  return record(backend_, index_).attributes;
}
std::optional<MemoryInfo> Device::memory() const {
  record(backend_, index_);
  const detail::BackendImpl& b = *backend_;
  if (b.api.device_memory == nullptr) return std::nullopt;
  bp_device_memory_args args{};
  args.struct_size = BP_DEVICE_MEMORY_ARGS_STRUCT_SIZE;
  args.plugin = b.plugin;
  args.device = index_;
  b.check(detail::call_entry(b, "device_memory", detail::kCallFailed, b.api.device_memory, &args),
          "device_memory of " + id());
  return MemoryInfo{args.free_bytes, args.total_bytes};
}
Backend Device::backend() const {
  record(backend_, index_);
  return detail::Access::make_backend(backend_);
}
bool Device::supports(Op op, DType dtype) const {
  const Capabilities caps = record(backend_, index_).capabilities;
  // The flags decide first, as they do for the ops themselves: no answer the
  // plugin gives makes a dtype it does not hold, or MATMUL without 'matmul', run.
  if (!caps.has(capability_for(dtype))) return false;
  if (op == Op::matmul && !caps.has(Capability::matmul)) return false;
  return backend_->supports(index_, static_cast<int32_t>(op), static_cast<int32_t>(dtype));
}
void Device::synchronize() const {
  record(backend_, index_);
  if (backend_->api.synchronize == nullptr) return;  // synchronous device
  bp_synchronize_args args{};
  args.struct_size = BP_SYNCHRONIZE_ARGS_STRUCT_SIZE;
  args.plugin = backend_->plugin;
  args.device = index_;
  backend_->check(
      detail::call_entry(*backend_, "synchronize", detail::kCallFailed, backend_->api.synchronize, &args),
      "synchronize " + id());
}

}  // namespace backplane
