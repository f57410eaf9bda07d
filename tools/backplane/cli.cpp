// Shared helpers of the backplane CLI: config choice and loading, error
// printing, and the text formatting that list and check have in common.
#include "cli.hpp"

#include <backplane/error.hpp>
#include <backplane/version.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <system_error>
#include <vector>

namespace backplane::cli {
namespace fs = std::filesystem;

namespace {

bool is_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

void print_prefixed(std::string_view prefix, std::string_view message) {
  std::string text(prefix);
  text += indent_continuation(message, 2);
  text += '\n';
  std::cout.flush();  // keep interleaved stdout / stderr lines in order
  std::fflush(stdout);
  std::cerr << text;
  std::cerr.flush();
}

// The folders a config's relative "library" is looked up in, as the loader
// does: the config's own folder, its plugin_dirs, then BACKPLANE_PLUGIN_PATH.
std::vector<fs::path> library_search_dirs(const fs::path& config) {
  std::error_code ec;
  const fs::path base = fs::absolute(config, ec).parent_path();
  std::vector<fs::path> dirs{base};
  std::string text;
  try {
    text = Registry::read_config(config);  // never blocks on a FIFO, as an ifstream would
  } catch (const Error&) {                 // the caller reports the config's own error
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("plugin_dirs") && j["plugin_dirs"].is_array())
    for (const nlohmann::json& d : j["plugin_dirs"])
      if (d.is_string()) {
        const fs::path p = d.get<std::string>();
        dirs.push_back((p.is_absolute() ? p : base / p).lexically_normal());
      }
  if (const char* env = std::getenv("BACKPLANE_PLUGIN_PATH")) {
    std::stringstream list(env);
    std::string dir;
    while (std::getline(list, dir, ':'))
      if (!dir.empty()) dirs.emplace_back(dir);
  }
  return dirs;
}

// A library not found: the plugin folders this config actually searches and
// how plugins get there from here (a build tree, an install tree). The
// closest library name is in the backend's error (the loader suggests it).
std::string library_not_found_hint(const Backend& backend, const fs::path& config) {
  const std::vector<fs::path> dirs = library_search_dirs(config);
  std::vector<fs::path> existing;
  std::error_code ec;
  for (std::size_t i = 1; i < dirs.size(); ++i)
    if (fs::is_directory(dirs[i], ec)) existing.push_back(dirs[i]);
  std::string hint =
      "no plugin library \"" + backend.library() + "\" in the folders " + config.string() + " searches";
  std::string shown;
  for (std::size_t i = 1; i < dirs.size(); ++i) shown += (shown.empty() ? "" : ", ") + dirs[i].string();
  if (!shown.empty()) hint += " (plugin_dirs: " + shown + ")";
  if (existing.empty())
    return hint + "; none of its plugin_dirs exists: fix plugin_dirs in " + config.string() +
           " or build the plugins first";
  // A folder of a CMake build tree: say how to build into it; else it is an install tree's.
  for (const fs::path& dir : existing) {
    for (fs::path up = dir; !up.empty() && up != up.parent_path(); up = up.parent_path()) {
      if (!fs::exists(up / "CMakeCache.txt", ec)) continue;
      return hint + "; is the plugin built? `cmake --build " + up.string() +
             "` puts the bundled plugins in " + dir.string() + ", or fix the \"library\" value";
    }
  }
  return hint + "; install the plugin into " + existing.front().string() + " or fix the \"library\" value";
}

}  // namespace

fs::path choose_config(const std::string& flag) {
  if (!flag.empty()) {
    const fs::path path = flag;
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      throw CommandError(kExitConfig, "config file '" + flag + "' does not exist");
    }
    if (fs::is_directory(path, ec)) {
      throw CommandError(kExitConfig,
                         "config '" + flag + "' is a directory; pass the backends.json file in it");
    }
    return path;
  }

  const fs::path path = Registry::default_config_path();
  const char* env = std::getenv("BACKPLANE_CONFIG");
  if (env != nullptr && *env != '\0') {
    if (!is_file(path)) {
      throw CommandError(kExitConfig, "BACKPLANE_CONFIG names '" + path.string() +
                                          "', which does not exist or is not a file");
    }
    return path;
  }
  // Beside this executable first (the build tree's generated default, or the
  // install tree's), then beside the library (a relocated library).
  const fs::path share = share_dir();
  if (!share.empty() && is_file(share / "backends.json")) return share / "backends.json";
  if (!path.empty() && is_file(path)) return path;
  throw CommandError(
      kExitConfig,
      "no config found: BACKPLANE_CONFIG is not set and there is no default config beside this "
      "program (" +
          (share.empty() ? std::string("share/backplane") : share.string()) +
          "/backends.json); a backends.json in the current folder is not read unless named\n"
          "pass --config FILE or set BACKPLANE_CONFIG=FILE");
}

fs::path share_dir() {
  std::error_code ec;
  const fs::path exe = fs::canonical("/proc/self/exe", ec);
  if (ec) return {};
  return (exe.parent_path() / BACKPLANE_CLI_SHARE_DIR).lexically_normal();
}

Backend find_backend(const Registry& registry, const std::string& name, int code) {
  try {
    return registry.backend(name);
  } catch (const Error& e) {  // not_found names the config, the closest name and the configured ones
    if (e.code() != Errc::not_found) throw;
    throw CommandError(code, e.message());
  }
}

Registry load_for_report(const fs::path& config) {
  try {
    return Registry::from_config(config, RequiredPolicy::report);
  } catch (const Error& e) {
    switch (e.code()) {
      case Errc::config_error:
      case Errc::not_found:
      case Errc::io_error:
        throw CommandError(kExitConfig, e.message());
      default:
        throw;
    }
  }
}

fs::path shown_config_path(const Registry& registry, const fs::path& chosen) {
  const fs::path& path = registry.config_path().empty() ? chosen : registry.config_path();
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  return ec ? path : absolute.lexically_normal();
}

void print_error(std::string_view message) { print_prefixed("backplane: error: ", message); }
void print_warning(std::string_view message) { print_prefixed("backplane: warning: ", message); }

std::string indent_continuation(std::string_view text, std::size_t indent) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    out += c;
    if (c == '\n') out.append(indent, ' ');
  }
  return out;
}

std::string format_bytes(uint64_t bytes) {
  if (bytes == 0) return "unknown";
  static constexpr const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

std::string failure_hint(const Backend& backend, const fs::path& config) {
  const std::string cfg = config.string();
  const std::string& error = backend.error();
  const std::optional<Errc> code = backend.error_code();
  if (backend.status() == Backend::Status::unavailable) {
    const std::string why =
        "the plugin loaded but cannot reach its devices (a driver, a device or a server is missing)";
    if (backend.required())
      return why + "; fix that, or mark the backend \"required\": false in " + cfg + " to run without it";
    return why + "; it is optional, so everything else runs without it";
  }
  if (code == Errc::config_error) return "fix this backend's entry in " + cfg;
  if (code == Errc::abi_mismatch) {
    // A version mismatch, a table of the wrong size and a table that
    // contradicts its flags need different fixes.
    if (error.find("struct_size") != std::string::npos)
      return "set the table's struct_size to BP_PLUGIN_API_STRUCT_SIZE from abi.h (plugin.hpp's "
             "BP_DEFINE_PLUGIN does) and rebuild the plugin";
    if (backend.abi_version().empty() ||
        backend.abi_version().rfind(std::to_string(kAbiMajor) + ".", 0) != 0) {
      return "rebuild the plugin against this backplane's abi.h (plugin ABI " + std::to_string(kAbiMajor) +
             "." + std::to_string(kAbiMinor) + "; the major must match)";
    }
    return "the plugin's table breaks the ABI rules named above; fix the plugin (set the entries its "
           "capability flags promise, or drop those flags) and rebuild it";
  }
  if (backend.library_path().empty()) return library_not_found_hint(backend, config);
  if (error.find("cannot load:") != std::string::npos) {
    return "a dependency is missing or the plugin is linked wrongly; try: ldd " + backend.library_path();
  }
  if (error.find(": create:") != std::string::npos) {
    return "the plugin refused to start; check this backend's \"options\" in " + cfg;
  }
  if (error.find("but its class does not implement Feature::") != std::string::npos) {
    return "the plugin's device declares a capability its class does not implement: add the Feature the "
           "message names to the class's Features (and the member it needs), or drop the flag, and rebuild";
  }
  if (error.find("device_count") != std::string::npos || error.find("device_info") != std::string::npos) {
    return "the plugin could not enumerate its devices; is the device (driver, server) present?";
  }
  return "BACKPLANE_LOG_LEVEL=debug shows more detail";
}

}  // namespace backplane::cli
