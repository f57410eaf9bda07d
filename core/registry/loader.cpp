// Plugin loading: resolve the file, dlopen it with Boost.DLL (RTLD_NOW, so an
// unresolved symbol fails here and not later), check the ABI table, create
// the instance and enumerate devices. Each failure names what and where.
#include "registry/loader.hpp"
#include "common/suggest.hpp"
#include "trace/recorder.hpp"
#include "trace/trace_format.hpp"

#include <backplane/log.hpp>
#include <backplane/version.hpp>

#include <boost/dll/shared_library.hpp>

#include <cxxabi.h>
#include <dlfcn.h>
#include <algorithm>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <typeinfo>
#include <unordered_set>

namespace backplane::detail {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> candidate_names(const std::string& spec) {
  std::string file = fs::path(spec).filename().string();
  if (file.size() > 3 && (file.ends_with(".so") || file.find(".so.") != std::string::npos)) return {spec};
  fs::path parent = fs::path(spec).parent_path();
  return {spec, (parent / ("lib" + file + ".so")).string(), spec + ".so"};
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);  // follows symlinks
}

// "libx.so" and "x.so" -> "x"; anything else as it is.
std::string library_stem(std::string file) {
  if (file.ends_with(".so")) file.resize(file.size() - 3);
  if (file.starts_with("lib")) file.erase(0, 3);
  return file;
}

// ' (did you mean "backplane_cpu"?)' for the plugin library in `dirs` whose
// name is closest to `spec`'s (libbackplane_cpu.so is "backplane_cpu"); ""
// when none is close.
std::string closest_library(const std::string& spec, const std::vector<fs::path>& dirs) {
  std::vector<std::string> present;
  for (const fs::path& dir : dirs) {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string file = it->path().filename().string();
      if (file.size() > 6 && file.starts_with("lib") && file.ends_with(".so"))
        present.push_back(library_stem(file));
    }
  }
  return did_you_mean(library_stem(fs::path(spec).filename().string()), present);
}

// The useful part of Boost.DLL's message is the dlerror text it embeds.
std::string dlerror_text(const std::string& what) {
  const std::string marker = "dlerror system message: ";
  auto start = what.find(marker);
  if (start == std::string::npos) return what;
  start += marker.size();
  auto end = what.rfind(')');
  if (end == std::string::npos || end < start) return what.substr(start);
  return what.substr(start, end - start);
}

[[noreturn]] void fail(Errc code, const BackendImpl& b, const std::string& what) {
  throw Error(code, "backend \"" + b.name + "\" (" + b.library_path + "): " + what);
}

std::string abi_string(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// The smallest table abi.h allows: through `execute`, the last required entry.
// What lies beyond a table's struct_size reads as NULL.
constexpr std::size_t kMinTableSize = BP_STRUCT_SIZE(bp_plugin_api, execute);

// "0.2" from "0.2.0": the release whose abi.h a plugin should be rebuilt against.
std::string release_major_minor() {
  const std::string v = kVersion;
  const auto first = v.find('.');
  const auto second = first == std::string::npos ? std::string::npos : v.find('.', first + 1);
  return second == std::string::npos ? v : v.substr(0, second);
}

const void* fn_ptr(auto fn) noexcept { return reinterpret_cast<const void*>(fn); }

// Called from plugin frames: nothing may propagate out of it.
void host_log(void* /*ctx*/, int32_t level, const char* message) noexcept {
  if (message == nullptr) return;
  LogLevel l = level <= BP_LOG_DEBUG     ? LogLevel::debug
               : level == BP_LOG_INFO    ? LogLevel::info
               : level == BP_LOG_WARNING ? LogLevel::warning
                                         : LogLevel::error;
  try {
    log(l, message);
  } catch (...) {  // a throwing host log handler loses the message, not the process
  }
}

// The type of the exception being handled, demangled ("int", "std::runtime_error").
std::string demangled_current_type() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  if (type == nullptr) return "unknown";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(
      abi::__cxa_demangle(type->name(), nullptr, nullptr, &status), &std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(type->name());
}

// The "tried:" list of a library not found shows this many locations.
constexpr std::size_t kMaxTriedShown = 20;

int32_t host_trace_active(void*) noexcept { return trace::detail::active() ? 1 : 0; }
void host_trace_event(void*, const bp_trace_event* event) noexcept {
  trace::detail::record_plugin_event(event);
}

const bp_host_api kHostApi = {BP_HOST_API_STRUCT_SIZE, BP_ABI_MAJOR,     BP_ABI_MINOR, nullptr, &host_log,
                              &host_trace_active,      &host_trace_event};

}  // namespace

const bp_host_api* host_api() noexcept { return &kHostApi; }

void rethrow_if_forced_unwind() {
  try {
    throw;
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
  }
}

Error entry_threw(const BackendImpl& b, std::string_view entry, Errc code) {
  std::string what;
  try {
    throw;
  } catch (const std::exception& e) {
    what = "threw an exception (" + demangled_current_type() + ": " + e.what() + ")";
  } catch (...) {
    what = "threw a non-standard exception (of type " + demangled_current_type() + ")";
  }
  const std::string where = b.library_path.empty() ? b.library : b.library_path;
  return Error(code,
               "backend \"" + b.name + "\" (" + where + "): plugin entry " + std::string(entry) + " " + what +
                   "; plugin entries must return a status and never throw (a C++ plugin should define "
                   "its entries with plugin.hpp's BP_DEFINE_PLUGIN, which turns exceptions into statuses)");
}

void entry_failed(const BackendImpl& b, std::string_view entry, Errc code) {
  rethrow_if_forced_unwind();
  throw entry_threw(b, entry, code);
}

fs::path resolve_library(const std::string& spec, const Config& config) {
  fs::path p(spec);
  // `tried` keeps the order for the message; `seen` makes each candidate
  // cost O(1), so a long plugin_dirs is searched in linear time.
  std::vector<fs::path> tried;
  std::vector<fs::path> searched;  // the folders, for "did you mean"
  std::unordered_set<std::string> seen;
  const std::vector<std::string> names = candidate_names(spec);
  auto try_dir = [&](const fs::path& dir) -> std::optional<fs::path> {
    searched.push_back(dir);
    for (const auto& name : names) {
      fs::path c = (dir / name).lexically_normal();
      if (!seen.insert(c.native()).second) continue;
      tried.push_back(c);
      if (is_file(c)) return fs::absolute(c);
    }
    return std::nullopt;
  };
  if (p.is_absolute()) {
    if (is_file(p)) return p;
    tried.push_back(p);
    searched.push_back(p.parent_path());
  } else {
    if (auto r = try_dir(config.base_dir)) return *r;
    for (const auto& dir : config.plugin_dirs)
      if (auto r = try_dir(dir)) return *r;
    if (const char* env = std::getenv("BACKPLANE_PLUGIN_PATH")) {
      std::stringstream ss(env);
      std::string dir;
      while (std::getline(ss, dir, ':'))
        if (!dir.empty())
          if (auto r = try_dir(dir)) return *r;
    }
  }
  std::string msg = "library \"" + spec + "\" not found" + closest_library(spec, searched) + "; tried:";
  const std::size_t shown = std::min(tried.size(), kMaxTriedShown);
  for (std::size_t i = 0; i < shown; ++i) msg += "\n    " + tried[i].string();
  if (tried.size() > shown) msg += "\n    ... and " + std::to_string(tried.size() - shown) + " more";
  msg += "\n  (fix the \"library\" path, add its folder to plugin_dirs, or set BACKPLANE_PLUGIN_PATH)";
  throw Error(Errc::plugin_load_failed, msg);
}

void load_backend(BackendImpl& b, const BackendConfig& entry, const Config& config) {
  try {
    b.library_path = resolve_library(entry.library, config).string();
    // Whoever can write the library chooses the code this process runs.
    require_private_file(b.library_path, "plugin library", Errc::plugin_load_failed);
  } catch (const Error& e) {
    throw Error(e.code(), "backend \"" + b.name + "\": " + e.message());
  }

  auto lib = std::make_shared<boost::dll::shared_library>();
  try {
    // RTLD_NOW: an unresolved symbol fails here, not at first use.
    // RTLD_NODELETE: a plugin is never unmapped. Runtimes it links (OpenMP,
    // CUDA, NCCL) keep threads alive inside their code after the last
    // handle closes; unmapping under them crashes the process at exit.
    lib->load(b.library_path,
              static_cast<boost::dll::load_mode::type>(RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE));
  } catch (const std::exception& e) {
    fail(Errc::plugin_load_failed, b, "cannot load: " + dlerror_text(e.what()));
  }
  if (!lib->has(BP_PLUGIN_ENTRY_SYMBOL)) {
    fail(Errc::plugin_load_failed, b,
         "does not export the entry symbol " BP_PLUGIN_ENTRY_SYMBOL
         " (is it a backplane plugin? `nm -D --defined-only` lists what it exports)");
  }
  auto entry_fn = lib->get<const bp_plugin_api*(const bp_host_api*)>(BP_PLUGIN_ENTRY_SYMBOL);
  b.library_handle = lib;

  const bp_plugin_api* table =
      call_entry(b, BP_PLUGIN_ENTRY_SYMBOL, Errc::plugin_load_failed, entry_fn, &kHostApi);
  if (table == nullptr)
    fail(Errc::plugin_load_failed, b, BP_PLUGIN_ENTRY_SYMBOL " returned NULL (the plugin refused to start)");

  if (!BP_HAS_FIELD(bp_plugin_api, abi_minor, table->struct_size)) {
    fail(Errc::abi_mismatch, b,
         "plugin table struct_size " + std::to_string(table->struct_size) +
             " is too small to hold even the ABI version; set it to BP_PLUGIN_API_STRUCT_SIZE from abi.h");
  }
  b.abi = {table->abi_major, table->abi_minor};
  if (table->abi_major != BP_ABI_MAJOR) {
    fail(Errc::abi_mismatch, b,
         "built for plugin ABI " + abi_string(table->abi_major, table->abi_minor) +
             ", but this backplane speaks ABI " + abi_string(BP_ABI_MAJOR, BP_ABI_MINOR) +
             "; rebuild it against backplane " + release_major_minor() + "'s abi.h (the major must match)");
  }
  if (table->struct_size < kMinTableSize) {
    fail(Errc::abi_mismatch, b,
         "plugin table struct_size " + std::to_string(table->struct_size) + " is smaller than the " +
             std::to_string(kMinTableSize) + " bytes every ABI " + std::to_string(BP_ABI_MAJOR) +
             ".x table has; set it to BP_PLUGIN_API_STRUCT_SIZE from abi.h (the table is truncated or "
             "its size was computed by hand)");
  }
  // Whole fields only: every field from plugin_name on is one pointer, so a
  // struct_size that cuts one (one byte short of an entry) must leave that
  // entry NULL, not hold the bytes that were declared.
  static_assert(offsetof(bp_plugin_api, plugin_name) % sizeof(void*) == 0 &&
                sizeof(bp_plugin_api) % sizeof(void*) == 0 &&
                kMinTableSize > offsetof(bp_plugin_api, plugin_name));
  std::size_t whole = std::min<std::size_t>(table->struct_size, sizeof(bp_plugin_api));
  whole -= whole % sizeof(void*);
  std::memcpy(&b.api, table, whole);
  b.api.struct_size = whole;

  // The entries abi.h marks (required), listed by name when NULL.
  const bp_plugin_api& a = b.api;
  std::vector<std::string> missing;
  if (a.plugin_name == nullptr) missing.emplace_back("plugin_name");
  if (a.plugin_version == nullptr) missing.emplace_back("plugin_version");
  for (const auto& [fn, name] : std::initializer_list<std::pair<const void*, const char*>>{
           {fn_ptr(a.status_code), "status_code"},
           {fn_ptr(a.status_message), "status_message"},
           {fn_ptr(a.status_free), "status_free"},
           {fn_ptr(a.create), "create"},
           {fn_ptr(a.destroy), "destroy"},
           {fn_ptr(a.device_count), "device_count"},
           {fn_ptr(a.device_info), "device_info"},
           {fn_ptr(a.supports_op), "supports_op"},
           {fn_ptr(a.buffer_alloc), "buffer_alloc"},
           {fn_ptr(a.buffer_free), "buffer_free"},
           {fn_ptr(a.buffer_write), "buffer_write"},
           {fn_ptr(a.buffer_read), "buffer_read"},
           {fn_ptr(a.execute), "execute"}})
    if (fn == nullptr) missing.emplace_back(name);
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    fail(Errc::abi_mismatch, b, "required table entries are NULL: " + list);
  }
  b.plugin_version = a.plugin_version;

  bp_create_args args{};
  args.struct_size = BP_CREATE_ARGS_STRUCT_SIZE;
  args.backend_name = b.name.c_str();
  args.options_json = entry.options_json.c_str();
  args.host = &kHostApi;
  constexpr Errc kLoad = Errc::plugin_load_failed;
  bp_status* created = call_entry(b, "create", kLoad, a.create, &args);
  if (created != nullptr && args.plugin != nullptr) {
    bp_plugin* handed_out = args.plugin;  // a failing create() should not hand one out; free it if it did
    args.plugin = nullptr;
    call_entry(b, "destroy", kLoad, a.destroy, handed_out);
  }
  try {
    b.check(created, "create");
  } catch (const Error& e) {
    throw Error(Errc::plugin_load_failed, e.message());
  }
  if (args.plugin == nullptr)
    fail(Errc::plugin_load_failed, b, "create() succeeded but returned no instance");
  b.plugin = args.plugin;

  try {
    bp_device_count_args count{};
    count.struct_size = BP_DEVICE_COUNT_ARGS_STRUCT_SIZE;
    count.plugin = b.plugin;
    if (bp_status* st = call_entry(b, "device_count", kLoad, a.device_count, &count)) {
      // UNAVAILABLE is an answer, not a failure: the backend is kept, with no
      // devices and the plugin's reason ("CUDA driver not found: ...").
      if (call_entry(b, "status_code", kLoad, a.status_code, st) == BP_STATUS_UNAVAILABLE) {
        const char* raw = call_entry(b, "status_message", kLoad, a.status_message, st);
        std::string reason = raw != nullptr && raw[0] != '\0' ? raw : "(the plugin gave no reason)";
        call_entry(b, "status_free", kLoad, a.status_free, st);
        b.status = Backend::Status::unavailable;
        b.error = std::move(reason);
        b.error_code = Errc::backend_unavailable;
        return;
      }
      b.check(st, "device_count");
    }
    if (count.num_devices < 0 || count.num_devices > 4096)
      fail(Errc::plugin_load_failed, b,
           "device_count returned " + std::to_string(count.num_devices) + " (expected 0..4096)");
    for (int32_t d = 0; d < count.num_devices; ++d) {
      bp_device_info_args info{};
      info.struct_size = BP_DEVICE_INFO_ARGS_STRUCT_SIZE;
      info.plugin = b.plugin;
      info.device = d;
      b.check(call_entry(b, "device_info", kLoad, a.device_info, &info),
              "device_info(" + std::to_string(d) + ")");
      DeviceRecord rec;
      rec.name = info.name != nullptr ? info.name : b.device_id(d);
      rec.capabilities = Capabilities(info.capabilities);
      if (info.num_attributes > 0 && info.attributes != nullptr) {
        for (int32_t i = 0; i < info.num_attributes; ++i) {
          const bp_attribute& at = info.attributes[i];
          if (at.name != nullptr) rec.attributes[at.name] = at.value != nullptr ? at.value : "";
        }
      }
      b.devices.push_back(std::move(rec));
    }
  } catch (const Error& e) {
    if (e.code() == Errc::plugin_load_failed) throw;
    throw Error(Errc::plugin_load_failed, e.message());
  }

  // A flag promises entries: check the promise before anyone relies on it.
  for (std::size_t d = 0; d < b.devices.size(); ++d) {
    const Capabilities caps = b.devices[d].capabilities;
    std::vector<std::string> absent;
    auto promise = [&](Capability cap, std::initializer_list<std::pair<const void*, const char*>> fns) {
      if (!caps.has(cap)) return;
      std::string names;
      for (const auto& [fn, name] : fns)
        if (fn == nullptr) names += (names.empty() ? "" : ", ") + std::string(name);
      if (!names.empty())
        absent.push_back("declares '" + std::string(to_string(cap)) + "' on device " + std::to_string(d) +
                         " but leaves " + names + " NULL");
    };
    promise(Capability::collective, {{fn_ptr(a.comm_create), "comm_create"},
                                     {fn_ptr(a.comm_destroy), "comm_destroy"},
                                     {fn_ptr(a.comm_abort), "comm_abort"},
                                     {fn_ptr(a.all_reduce), "all_reduce"},
                                     {fn_ptr(a.broadcast), "broadcast"},
                                     {fn_ptr(a.all_gather), "all_gather"},
                                     {fn_ptr(a.reduce_scatter), "reduce_scatter"},
                                     {fn_ptr(a.barrier), "barrier"}});
    promise(Capability::async, {{fn_ptr(a.synchronize), "synchronize"}});
    promise(Capability::host_visible, {{fn_ptr(a.buffer_pointer), "buffer_pointer"}});
    if (!absent.empty()) {
      std::string msg = "the plugin's capabilities contradict its table: ";
      for (std::size_t i = 0; i < absent.size(); ++i) msg += (i ? "; " : "") + absent[i];
      fail(Errc::abi_mismatch, b, msg + "; the plugin is rejected");
    }
    b.capabilities = Capabilities(b.capabilities.bits() | caps.bits());
  }

  const std::size_t slots = b.devices.size() * BP_OP_COUNT_ * BP_DTYPE_COUNT_;
  b.op_support = std::make_unique<std::atomic<uint8_t>[]>(slots);
  for (std::size_t i = 0; i < slots; ++i) b.op_support[i].store(0, std::memory_order_relaxed);
  b.trace_labels = std::make_unique<std::atomic<uint32_t>[]>(b.devices.size());
  for (std::size_t d = 0; d < b.devices.size(); ++d) b.trace_labels[d].store(0, std::memory_order_relaxed);
  b.status = Backend::Status::loaded;
}

}  // namespace backplane::detail
