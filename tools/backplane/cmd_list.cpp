// `backplane list`: every configured backend with its library, version, ABI,
// status (and the reason when it failed or is unavailable), capabilities and
// devices with their memory; as an aligned tree, or as one JSON object with --json.
#include "cli.hpp"
#include "isolate.hpp"

#include <backplane/capability.hpp>
#include <backplane/error.hpp>
#include <backplane/registry.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace backplane::cli {
namespace {

namespace fs = std::filesystem;

struct ListOptions {
  std::string config;
  bool json = false;
  bool isolate = false;
  int timeout_seconds = kDefaultLoadTimeoutSeconds;
};

constexpr std::size_t kKeyWidth = 14;

// A string field of a report, "" for null.
std::string text_of(const Json& info, const char* key) {
  const Json& v = info[key];
  return v.is_string() ? v.get<std::string>() : std::string();
}

// "collective, host_visible, f64" or "none", as Capabilities::to_string.
std::string capabilities_text(const Json& names) {
  std::string out;
  for (const Json& n : names) out += (out.empty() ? "" : ", ") + n.get<std::string>();
  return out.empty() ? "none" : out;
}

// ---- JSON --------------------------------------------------------------------

std::string list_json(const RegistryReport& report) {
  Json root;
  root["config"] = report.config.string();
  root["default_backend"] = report.default_backend ? Json(*report.default_backend) : Json(nullptr);
  Json backends = Json::array();
  for (const BackendReport& backend : report.backends) backends.push_back(backend.info);
  root["backends"] = std::move(backends);
  // Plugin messages may carry bytes that are not UTF-8 (file names): replace them.
  return root.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

// ---- text --------------------------------------------------------------------

// "<indent><key padded to width><value>", continuation lines of value aligned.
void field(std::string& out, std::size_t indent, std::string_view key, std::string_view value,
           std::size_t width = kKeyWidth) {
  out.append(indent, ' ');
  out += key;
  out.append(width > key.size() ? width - key.size() : 1, ' ');
  out += indent_continuation(value, indent + std::max(width, key.size() + 1));
  out += '\n';
}

std::string attributes_text(const Json& attributes) {
  if (attributes.empty()) return "none";
  std::size_t width = 0;
  for (const auto& [key, value] : attributes.items()) width = std::max(width, key.size());
  std::string text;
  for (const auto& [key, value] : attributes.items()) {
    if (!text.empty()) text += '\n';
    text += key;
    text.append(width - key.size() + 2, ' ');
    text += value.get<std::string>();
  }
  return text;
}

void device_text(std::string& out, const std::string& backend_name, const Json& device) {
  out += "    [" + std::to_string(device["index"].get<int64_t>()) + "] " + backend_name + ":" +
         std::to_string(device["index"].get<int64_t>()) + "  " + text_of(device, "name") + "\n";
  constexpr std::size_t kIndent = 8;
  field(out, kIndent, "capabilities", capabilities_text(device["capabilities"]));
  const std::string error = device.contains("memory_error") ? text_of(device, "memory_error") : std::string();
  const bool memory = !device["memory_bytes"].is_null() && !device["memory_free_bytes"].is_null();
  field(out, kIndent, "memory",
        memory ? format_bytes(device["memory_bytes"].get<uint64_t>()) + " (" +
                     format_bytes(device["memory_free_bytes"].get<uint64_t>()) + " free)"
        : error.empty() ? std::string("not reported")
                        : "unknown (" + error + ")");
  field(out, kIndent, "attributes", attributes_text(device["attributes"]));
}

void backend_text(std::string& out, const Json& info, bool is_default) {
  const std::string name = text_of(info, "name");
  const std::string error = text_of(info, "error");
  const std::string code = text_of(info, "error_code");
  out += name;
  if (is_default) out += "  (default)";
  out += '\n';
  const bool loaded = info["status"] == "loaded";
  const bool unavailable = info["status"] == "unavailable";
  if (loaded) {
    field(out, 2, "status", "loaded");
  } else if (unavailable) {
    field(out, 2, "status", "unavailable");
  } else {
    field(out, 2, "status", std::string("FAILED") + (!code.empty() ? " (" + code + ")" : ""));
  }
  field(out, 2, "required", info["required"].get<bool>() ? "yes" : "no");
  const std::string library = text_of(info, "library");
  const std::string library_path = text_of(info, "library_path");
  field(out, 2, "library", library.empty() ? "(none)" : library);
  field(out, 2, "resolved", library_path.empty() ? "(not found)" : library_path);
  if (const std::string version = text_of(info, "version"); !version.empty())
    field(out, 2, "version", version);
  if (const std::string abi = text_of(info, "abi_version"); !abi.empty()) field(out, 2, "abi", abi);
  const std::string fallback = "collective_fallback: " + text_of(info, "collective_fallback");
  // What the devices lack runs on this backend's device 0 ("error": nowhere).
  field(out, 2, "op_fallback", text_of(info, "op_fallback"));
  if (unavailable) {  // loaded, but no device can be reached: the plugin's reason
    field(out, 2, "collectives", fallback);
    field(out, 2, "devices", "0 (" + (error.empty() ? std::string("no reason given") : error) + ")");
    return;
  }
  if (!loaded) {
    field(out, 2, "collectives", fallback);
    field(out, 2, "error", error.empty() ? "(no reason given)" : error);
    return;
  }
  const Json& caps = info["capabilities"];
  const bool collective =
      std::find(caps.begin(), caps.end(), Json(to_string(Capability::collective))) != caps.end();
  field(out, 2, "collectives", collective ? "yes" : "no (" + fallback + ")");
  field(out, 2, "capabilities", capabilities_text(caps));
  const Json& devices = info["devices"];
  field(out, 2, "devices", std::to_string(devices.size()));
  for (const Json& device : devices) device_text(out, name, device);
}

std::string list_text(const RegistryReport& report) {
  const std::vector<BackendReport>& backends = report.backends;
  const auto loaded = std::count_if(backends.begin(), backends.end(),
                                    [](const BackendReport& b) { return b.info["status"] == "loaded"; });
  const auto unavailable = std::count_if(backends.begin(), backends.end(), [](const BackendReport& b) {
    return b.info["status"] == "unavailable";
  });

  std::string out;
  field(out, 0, "config", report.config.string(), 10);
  std::string counts = std::to_string(backends.size()) + " configured, " + std::to_string(loaded) + " loaded";
  if (unavailable > 0) counts += ", " + std::to_string(unavailable) + " unavailable";
  field(out, 0, "backends", counts, 10);
  // One line per unavailable backend up front: "cuda: 0 devices (CUDA driver not found: ...)".
  for (const BackendReport& backend : backends)
    if (backend.info["status"] == "unavailable")
      out += text_of(backend.info, "name") + ": 0 devices (" + text_of(backend.info, "error") + ")\n";
  for (const BackendReport& backend : backends) {
    out += '\n';
    backend_text(out, backend.info,
                 report.default_backend && *report.default_backend == text_of(backend.info, "name"));
  }
  return out;
}

int run_list(const ListOptions& options) {
  const fs::path config = choose_config(options.config);
  const RegistryReport report =
      options.isolate ? report_isolated(config, options.timeout_seconds) : report_in_process(config);
  const std::string out = options.json ? list_json(report) : list_text(report);
  std::cout << out << std::flush;
  return kExitOk;
}

}  // namespace

Command add_list_command(CLI::App& parent) {
  auto options = std::make_shared<ListOptions>();
  CLI::App* sub = parent.add_subcommand(
      "list", "Show every configured backend: library, version, status, capabilities and devices");
  sub->add_option("-c,--config", options->config, "The backends.json to read")->type_name("FILE");
  sub->add_flag("--json", options->json, "Print one JSON object instead of the table");
  sub->add_flag(
      "--isolate", options->isolate,
      "Load each backend in a child process, so a plugin that crashes or hangs is reported, not fatal");
  sub->add_option("--timeout", options->timeout_seconds,
                  "With --isolate: seconds each backend may take to load before it is killed")
      ->type_name("SECONDS")
      ->check(CLI::Range(1, 86400));
  sub->footer("Exits 0 once the config was read, even when backends failed (see 'backplane check').");
  return {sub, [options] { return run_list(*options); }};
}

}  // namespace backplane::cli
