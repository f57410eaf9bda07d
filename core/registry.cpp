// Registry, Backend and Device: building the registry from a config and the
// read-only views over what was loaded.
#include "config.hpp"
#include "internal.hpp"
#include "loader.hpp"

#include <backplane/log.hpp>
#include <backplane/registry.hpp>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace backplane {
namespace detail {

BackendImpl::~BackendImpl() {
  if (plugin != nullptr && api.destroy != nullptr) api.destroy(plugin);
}

Errc errc_from_status(int32_t code) noexcept {
  switch (code) {
    case BP_STATUS_INVALID_ARGUMENT: return Errc::invalid_argument;
    case BP_STATUS_UNSUPPORTED: return Errc::unsupported_op;
    case BP_STATUS_OUT_OF_MEMORY: return Errc::out_of_memory;
    case BP_STATUS_INTERNAL: return Errc::internal;
    case BP_STATUS_TIMEOUT: return Errc::timeout;
    case BP_STATUS_COLLECTIVE: return Errc::collective_error;
    case BP_STATUS_UNAVAILABLE: return Errc::backend_unavailable;
    case BP_STATUS_IO: return Errc::io_error;
    case BP_STATUS_DEVICE:
    default: return Errc::device_error;
  }
}

void BackendImpl::check(bp_status* status, std::string_view what) const {
  if (status == nullptr) return;
  const int32_t code = api.status_code(status);
  const char* raw = api.status_message(status);
  std::string message = raw != nullptr && raw[0] != '\0' ? raw : "(the plugin gave no message)";
  api.status_free(status);
  if (code == BP_STATUS_OK) return;  // a plugin that returns an OK status object
  throw Error(errc_from_status(code), "backend \"" + name + "\": " + std::string(what) + ": " + message);
}

void BackendImpl::require_loaded() const {
  if (status == Backend::Status::loaded) return;
  throw Error(Errc::backend_unavailable, "backend \"" + name + "\" is not available: " + error +
                                            "\n  (`backplane check` explains every backend of a config)");
}

bool BackendImpl::supports(int32_t device, int32_t op, int32_t dtype) {
  if (op <= 0 || dtype <= 0 || dtype >= kDtypeSlots) return false;
  if (op >= BP_OP_COUNT_) return api.supports_op(plugin, device, op, dtype) != 0;
  std::atomic<uint8_t>& slot =
      op_support[(static_cast<std::size_t>(device) * BP_OP_COUNT_ + static_cast<std::size_t>(op)) * kDtypeSlots +
                 static_cast<std::size_t>(dtype)];
  uint8_t v = slot.load(std::memory_order_relaxed);
  if (v == 0) {
    v = api.supports_op(plugin, device, op, dtype) != 0 ? 1 : 2;
    slot.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

namespace {

std::shared_ptr<RegistryImpl> build(const Config& cfg, RequiredPolicy policy) {
  auto reg = std::make_shared<RegistryImpl>();
  reg->default_backend = cfg.default_backend;
  for (const BackendConfig& entry : cfg.backends) {
    auto b = std::make_shared<BackendImpl>();
    b->name = entry.name;
    b->config_entry = entry.path;
    b->config_source = cfg.source;
    b->library = entry.library;
    b->required = entry.required;
    b->fallback = entry.fallback;
    std::optional<Error> failure;
    try {
      if (entry.error) throw *entry.error;
      load_backend(*b, entry, cfg);
    } catch (const Error& e) {
      failure = e;
    } catch (const std::exception& e) {  // e.g. bad_alloc, filesystem_error: still only this backend fails
      failure = Error(Errc::plugin_load_failed, "backend \"" + b->name + "\": " + e.what());
    }
    if (failure) {
      const Error& e = *failure;
      b->status = Backend::Status::failed;
      b->error = e.message();
      b->error_code = e.code();
      // Nothing of a failed plugin is used: release it now.
      if (b->plugin != nullptr) b->api.destroy(b->plugin);
      b->plugin = nullptr;
      b->devices.clear();
      b->capabilities = Capabilities();
      b->library_handle.reset();
      log(LogLevel::debug, "backend \"" + b->name + "\" failed to load: " + e.message());
    }
    reg->backends.push_back(std::move(b));
  }
  for (const auto& b : reg->backends) {
    // A failed entry stages nothing, and never itself (no ownership cycle).
    if (b->fallback.kind != CollectiveFallback::Kind::host || b->status != Backend::Status::loaded) continue;
    for (const auto& o : reg->backends)
      if (o != b && o->name == b->fallback.host_backend) b->fallback_host = o;
  }
  if (policy == RequiredPolicy::throw_on_failure) {
    std::string failures;
    for (const auto& b : reg->backends)
      if (b->required && b->status != Backend::Status::loaded) failures += "\n  - " + b->error;
    if (!failures.empty())
      throw Error(Errc::backend_unavailable,
                  cfg.source + ": required backend(s) failed to load:" + failures +
                      "\n  (run `backplane check --config " + cfg.source + "` for details)");
  }
  return reg;
}

}  // namespace
}  // namespace detail

namespace fs = std::filesystem;

std::string CollectiveFallback::to_string() const {
  switch (kind) {
    case Kind::error: return "error";
    case Kind::local: return "local";
    case Kind::host: return "host:" + host_backend;
  }
  return "error";
}

// ---- Registry --------------------------------------------------------------

Registry Registry::from_json(std::string_view json, const fs::path& base_dir, std::string_view source_name,
                             RequiredPolicy policy) {
  detail::Config cfg = detail::parse_config(json, fs::absolute(base_dir), source_name);
  return Registry(detail::build(cfg, policy));
}

Registry Registry::from_config(const fs::path& path, RequiredPolicy policy) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    throw Error(Errc::config_error,
                "config file " + path.string() + " does not exist (pass --config FILE or set BACKPLANE_CONFIG)");
  }
  if (!fs::is_regular_file(st)) {
    throw Error(Errc::config_error, "config file " + path.string() +
                                        " is not a regular file (a directory?); name the backends.json file itself");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(Errc::config_error, "config file " + path.string() + " cannot be read (check its permissions)");
  }
  std::stringstream text;
  text << in.rdbuf();
  const fs::path abs = fs::absolute(path);
  detail::Config cfg = detail::parse_config(text.str(), abs.parent_path(), path.string());
  Registry r(detail::build(cfg, policy));
  r.impl_->config_path = abs;
  return r;
}

fs::path Registry::default_config_path() {
  if (const char* env = std::getenv("BACKPLANE_CONFIG"); env != nullptr && env[0] != '\0') return env;
  std::error_code ec;
  if (fs::is_regular_file("backends.json", ec)) return fs::absolute("backends.json");
  // The installed default sits beside the installed library.
  fs::path here = boost::dll::this_line_location(ec);
  if (!ec) {
    fs::path installed = (here.parent_path() / BACKPLANE_RELATIVE_CONFIG).lexically_normal();
    if (fs::is_regular_file(installed, ec)) return installed;
  }
  return fs::absolute("backends.json");
}

Registry Registry::from_env() { return from_config(default_config_path()); }

std::vector<Backend> Registry::backends() const {
  std::vector<Backend> out;
  out.reserve(impl_->backends.size());
  for (const auto& b : impl_->backends) out.emplace_back(b);
  return out;
}

Backend Registry::backend(std::string_view name) const {
  std::string known;
  for (const auto& b : impl_->backends) {
    if (b->name == name) return Backend(b);
    known += (known.empty() ? "" : ", ") + b->name;
  }
  throw Error(Errc::not_found, "no backend named \"" + std::string(name) + "\" in the config (configured: " +
                                   (known.empty() ? "none" : known) + ")");
}

Backend Registry::default_backend() const {
  if (!impl_->default_backend.empty()) return backend(impl_->default_backend);
  for (const auto& b : impl_->backends)
    if (b->status == Backend::Status::loaded) return Backend(b);
  throw Error(Errc::backend_unavailable, "no backend loaded, so there is no default backend");
}

const fs::path& Registry::config_path() const { return impl_->config_path; }

// ---- Backend ---------------------------------------------------------------

const std::string& Backend::name() const { return impl_->name; }
Backend::Status Backend::status() const { return impl_->status; }
const std::string& Backend::error() const { return impl_->error; }
std::optional<Errc> Backend::error_code() const { return impl_->error_code; }
bool Backend::required() const { return impl_->required; }
const std::string& Backend::library() const { return impl_->library; }
const std::string& Backend::library_path() const { return impl_->library_path; }
const std::string& Backend::version() const { return impl_->plugin_version; }
std::string Backend::abi_version() const {
  if (!impl_->abi) return "";
  return std::to_string(impl_->abi->first) + "." + std::to_string(impl_->abi->second);
}
CollectiveFallback Backend::collective_fallback() const { return impl_->fallback; }
Capabilities Backend::capabilities() const { return impl_->capabilities; }
int32_t Backend::device_count() const { return static_cast<int32_t>(impl_->devices.size()); }

Device Backend::device(int32_t index) const {
  impl_->require_loaded();
  if (index < 0 || index >= device_count()) {
    throw Error(Errc::not_found, "backend \"" + impl_->name + "\" has no device " + std::to_string(index) + " (it has " +
                                     std::to_string(device_count()) + ")");
  }
  return Device(impl_, index);
}

std::vector<Device> Backend::devices() const {
  std::vector<Device> out;
  if (impl_->status != Status::loaded) return out;
  for (int32_t i = 0; i < device_count(); ++i) out.emplace_back(impl_, i);
  return out;
}

// ---- Device ----------------------------------------------------------------

namespace {
const detail::DeviceRecord& record(const std::shared_ptr<detail::BackendImpl>& b, int32_t index) {
  if (!b) throw Error(Errc::invalid_argument, "use of an invalid (default-constructed) Device");
  if (index < 0 || static_cast<std::size_t>(index) >= b->devices.size()) {
    b->require_loaded();
    throw Error(Errc::not_found, "backend \"" + b->name + "\" has no device " + std::to_string(index) + " (it has " +
                                     std::to_string(b->devices.size()) + ")");
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
const std::map<std::string, std::string>& Device::attributes() const { return record(backend_, index_).attributes; }
uint64_t Device::memory_bytes() const { return record(backend_, index_).memory_bytes; }
Backend Device::backend() const {
  record(backend_, index_);
  return Backend(backend_);
}
bool Device::supports(int32_t op, DType dtype) const {
  record(backend_, index_);
  return backend_->supports(index_, op, static_cast<int32_t>(dtype));
}
void Device::synchronize() const {
  record(backend_, index_);
  if (backend_->api.synchronize == nullptr) return;  // synchronous device
  backend_->check(backend_->api.synchronize(backend_->plugin, index_), "synchronize " + id());
}

}  // namespace backplane
