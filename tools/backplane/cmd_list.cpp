// `backplane list`: every configured backend with its library, version, ABI,
// status (and the reason when it failed or is unavailable), capabilities and
// devices with their memory; as an aligned tree, or as one JSON object with --json.
#include "cli.hpp"

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
using Json = nlohmann::ordered_json;

struct ListOptions {
  std::string config;
  bool json = false;
};

constexpr std::size_t kKeyWidth = 14;

std::optional<std::string> default_backend_name(const Registry& registry) {
  try {
    return registry.default_backend().name();
  } catch (const Error&) {
    return std::nullopt;  // no default and nothing loaded
  }
}

Json or_null(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

// ---- JSON --------------------------------------------------------------------

// The device's memory, or nullopt with `error` set when the plugin failed to
// answer (a listing shows it rather than failing).
std::optional<MemoryInfo> memory_of(const Device& device, std::string& error) {
  try {
    return device.memory();
  } catch (const Error& e) {
    error = e.message();
    return std::nullopt;
  }
}

Json device_json(const Device& device) {
  Json attributes = Json::object();
  for (const auto& [key, value] : device.attributes()) attributes[key] = value;
  std::string error;
  const std::optional<MemoryInfo> memory = memory_of(device, error);
  // null when the plugin does not report memory (or failed to: memory_error).
  Json j{{"index", device.index()},
         {"name", device.name()},
         {"capabilities", device.capabilities().names()},
         {"attributes", std::move(attributes)},
         {"memory_bytes", memory ? Json(memory->total_bytes) : Json(nullptr)},
         {"memory_free_bytes", memory ? Json(memory->free_bytes) : Json(nullptr)}};
  if (!error.empty()) j["memory_error"] = error;
  return j;
}

const char* status_name(Backend::Status status) {
  switch (status) {
    case Backend::Status::loaded:
      return "loaded";
    case Backend::Status::unavailable:
      return "unavailable";
    case Backend::Status::failed:
      return "failed";
  }
  return "failed";
}

Json backend_json(const Backend& backend) {
  Json j;
  j["name"] = backend.name();
  j["library"] = backend.library();
  j["library_path"] = or_null(backend.library_path());
  j["version"] = or_null(backend.version());
  j["abi_version"] = or_null(backend.abi_version());
  j["status"] = status_name(backend.status());
  j["error"] = backend.loaded() ? Json(nullptr) : Json(backend.error());
  const std::optional<Errc> code = backend.error_code();
  j["error_code"] = code ? Json(to_string(*code)) : Json(nullptr);
  j["required"] = backend.required();
  j["collective_fallback"] = backend.collective_fallback().to_string();
  Json devices = Json::array();
  if (backend.loaded()) {
    j["capabilities"] = backend.capabilities().names();
    for (const Device& device : backend.devices()) devices.push_back(device_json(device));
  } else {
    j["capabilities"] = Json::array();
  }
  j["devices"] = std::move(devices);
  return j;
}

std::string list_json(const Registry& registry, const fs::path& config) {
  Json root;
  root["config"] = shown_config_path(registry, config).string();
  root["default_backend"] = or_null(default_backend_name(registry).value_or(""));
  Json backends = Json::array();
  for (const Backend& backend : registry.backends()) backends.push_back(backend_json(backend));
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

std::string attributes_text(const std::map<std::string, std::string>& attributes) {
  if (attributes.empty()) return "none";
  std::size_t width = 0;
  for (const auto& [key, value] : attributes) width = std::max(width, key.size());
  std::string text;
  for (const auto& [key, value] : attributes) {
    if (!text.empty()) text += '\n';
    text += key;
    text.append(width - key.size() + 2, ' ');
    text += value;
  }
  return text;
}

void device_text(std::string& out, const Device& device) {
  out += "    [" + std::to_string(device.index()) + "] " + device.id() + "  " + device.name() + "\n";
  constexpr std::size_t kIndent = 8;
  field(out, kIndent, "capabilities", device.capabilities().to_string());
  std::string error;
  const std::optional<MemoryInfo> memory = memory_of(device, error);
  field(out, kIndent, "memory",
        memory ? format_bytes(memory->total_bytes) + " (" + format_bytes(memory->free_bytes) + " free)"
        : error.empty() ? std::string("not reported")
                        : "unknown (" + error + ")");
  field(out, kIndent, "attributes", attributes_text(device.attributes()));
}

void backend_text(std::string& out, const Backend& backend, bool is_default) {
  out += backend.name();
  if (is_default) out += "  (default)";
  out += '\n';
  const std::optional<Errc> code = backend.error_code();
  const bool unavailable = backend.status() == Backend::Status::unavailable;
  if (backend.loaded()) {
    field(out, 2, "status", "loaded");
  } else if (unavailable) {
    field(out, 2, "status", "unavailable");
  } else {
    field(out, 2, "status", std::string("FAILED") + (code ? std::string(" (") + to_string(*code) + ")" : ""));
  }
  field(out, 2, "required", backend.required() ? "yes" : "no");
  field(out, 2, "library", backend.library().empty() ? "(none)" : backend.library());
  field(out, 2, "resolved", backend.library_path().empty() ? "(not found)" : backend.library_path());
  if (!backend.version().empty()) field(out, 2, "version", backend.version());
  if (!backend.abi_version().empty()) field(out, 2, "abi", backend.abi_version());
  const std::string fallback = "collective_fallback: " + backend.collective_fallback().to_string();
  if (unavailable) {  // loaded, but no device can be reached: the plugin's reason
    field(out, 2, "collectives", fallback);
    field(out, 2, "devices",
          "0 (" + (backend.error().empty() ? std::string("no reason given") : backend.error()) + ")");
    return;
  }
  if (!backend.loaded()) {
    field(out, 2, "collectives", fallback);
    field(out, 2, "error", backend.error().empty() ? "(no reason given)" : backend.error());
    return;
  }
  const Capabilities caps = backend.capabilities();
  field(out, 2, "collectives", caps.has(Capability::collective) ? "yes" : "no (" + fallback + ")");
  field(out, 2, "capabilities", caps.to_string());
  const std::vector<Device> devices = backend.devices();
  field(out, 2, "devices", std::to_string(devices.size()));
  for (const Device& device : devices) device_text(out, device);
}

std::string list_text(const Registry& registry, const fs::path& config) {
  const std::vector<Backend> backends = registry.backends();
  const std::optional<std::string> default_name = default_backend_name(registry);
  const auto loaded =
      std::count_if(backends.begin(), backends.end(), [](const Backend& b) { return b.loaded(); });
  const auto unavailable = std::count_if(backends.begin(), backends.end(), [](const Backend& b) {
    return b.status() == Backend::Status::unavailable;
  });

  std::string out;
  field(out, 0, "config", shown_config_path(registry, config).string(), 10);
  std::string counts = std::to_string(backends.size()) + " configured, " + std::to_string(loaded) + " loaded";
  if (unavailable > 0) counts += ", " + std::to_string(unavailable) + " unavailable";
  field(out, 0, "backends", counts, 10);
  // One line per unavailable backend up front: "cuda: 0 devices (CUDA driver not found: ...)".
  for (const Backend& backend : backends)
    if (backend.status() == Backend::Status::unavailable)
      out += backend.name() + ": 0 devices (" + backend.error() + ")\n";
  for (const Backend& backend : backends) {
    out += '\n';
    backend_text(out, backend, default_name && *default_name == backend.name());
  }
  return out;
}

int run_list(const ListOptions& options) {
  const fs::path config = choose_config(options.config);
  const Registry registry = load_for_report(config);
  const std::string out = options.json ? list_json(registry, config) : list_text(registry, config);
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
  sub->footer("Exits 0 once the config was read, even when backends failed (see 'backplane check').");
  return {sub, [options] { return run_list(*options); }};
}

}  // namespace backplane::cli
