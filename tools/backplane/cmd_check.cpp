// `backplane check`: loads the config and prints one line per backend, "ok",
// "FAILED" or "UNAVAIL" (loaded, but its devices cannot be reached) with the
// full reason and a hint. Exit 0 when every required backend loaded (optional
// failures are warnings), 1 otherwise, 2 on a bad config. Each backend is
// loaded in a child process (isolate.hpp), so a plugin that crashes or hangs
// is one FAILED line, not the end of the check.
#include "cli.hpp"
#include "isolate.hpp"

#include <backplane/capability.hpp>
#include <backplane/error.hpp>
#include <backplane/registry.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace backplane::cli {
namespace {

namespace fs = std::filesystem;

struct CheckOptions {
  std::string config;
  int timeout_seconds = kDefaultLoadTimeoutSeconds;
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

std::string pad(std::string text, std::size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

// A string field of a report, "" for null.
std::string text_of(const Json& info, const char* key) {
  const Json& v = info[key];
  return v.is_string() ? v.get<std::string>() : std::string();
}

// "0.1.0, 1 device: host_visible, f64" for a loaded backend.
std::string loaded_summary(const Json& info) {
  const std::string version = text_of(info, "version");
  std::string text = version.empty() ? std::string() : version + ", ";
  const std::size_t n = info["devices"].size();
  text += std::to_string(n) + (n == 1 ? " device" : " devices");
  if (n > 0) {
    std::vector<std::string> names;
    for (const Json& c : info["capabilities"]) names.push_back(c.get<std::string>());
    text += ": " + (names.empty() ? std::string("none") : join(names));
  }
  return text;
}

int run_check(const CheckOptions& options) {
  const fs::path config = choose_config(options.config);
  const RegistryReport report = report_isolated(config, options.timeout_seconds);
  const std::vector<BackendReport>& backends = report.backends;
  if (backends.empty()) throw CommandError(kExitFailed, "no backends configured in " + config.string());

  std::size_t name_width = 0;
  for (const BackendReport& backend : backends)
    name_width = std::max(name_width, text_of(backend.info, "name").size());
  name_width += 2;
  constexpr std::size_t kStatusWidth = 8;     // "FAILED  "
  constexpr std::size_t kRequiredWidth = 10;  // "required  "
  const std::size_t reason_column = kStatusWidth + name_width + kRequiredWidth;

  std::vector<std::string> required_failed;
  std::vector<std::string> optional_failed;
  std::vector<std::string> required_unavailable;  // "cuda (CUDA driver not found: ...)"
  std::vector<std::string> optional_unavailable;
  std::string out = "config " + report.config.string() + "\n";
  for (const BackendReport& backend : backends) {
    const Json& info = backend.info;
    const std::string name = text_of(info, "name");
    const std::string error = text_of(info, "error");
    const bool required = info["required"].get<bool>();
    const bool loaded = info["status"] == "loaded";
    const bool unavailable = info["status"] == "unavailable";
    out += pad(loaded ? "ok" : unavailable ? "UNAVAIL" : "FAILED", kStatusWidth);
    out += pad(name, name_width);
    out += pad(required ? "required" : "optional", kRequiredWidth);
    if (loaded) {
      out += loaded_summary(info) + "\n";
      continue;
    }
    if (unavailable)  // the summary names the reason too: it is all a user needs
      (required ? required_unavailable : optional_unavailable).push_back(name + " (" + error + ")");
    else
      (required ? required_failed : optional_failed).push_back(name);
    const std::string code = text_of(info, "error_code");
    std::string reason = unavailable     ? std::string("unavailable: ")
                         : !code.empty() ? code + ": "
                                         : std::string();
    reason += error.empty() ? "(no reason given)" : error;
    reason += "\nhint: " + backend.hint;
    out += indent_continuation(reason, reason_column) + "\n";
  }
  std::cout << out << std::flush;

  auto plural = [](std::size_t n) { return std::string(n == 1 ? "" : "s"); };
  if (!optional_failed.empty()) {
    print_warning(std::to_string(optional_failed.size()) + " optional backend" +
                  plural(optional_failed.size()) + " failed to load: " + join(optional_failed));
  }
  if (!optional_unavailable.empty()) {
    print_warning(std::to_string(optional_unavailable.size()) + " optional backend" +
                  plural(optional_unavailable.size()) + " unavailable: " + join(optional_unavailable));
  }
  if (!required_failed.empty()) {
    print_error(std::to_string(required_failed.size()) + " required backend" +
                plural(required_failed.size()) + " failed to load: " + join(required_failed));
  }
  if (!required_unavailable.empty()) {
    print_error(std::to_string(required_unavailable.size()) + " required backend" +
                plural(required_unavailable.size()) + " unavailable: " + join(required_unavailable));
  }
  if (!required_failed.empty() || !required_unavailable.empty()) return kExitFailed;
  const std::size_t loaded = backends.size() - optional_failed.size() - optional_unavailable.size();
  std::cout << "all required backends loaded (" << loaded << " of " << backends.size() << " loaded)\n";
  return kExitOk;
}

}  // namespace

Command add_check_command(CLI::App& parent) {
  auto options = std::make_shared<CheckOptions>();
  CLI::App* sub = parent.add_subcommand(
      "check", "Load every configured backend and report ok / FAILED with the reason and a hint");
  sub->add_option("-c,--config", options->config, "The backends.json to read")->type_name("FILE");
  sub->add_option("--timeout", options->timeout_seconds,
                  "Seconds each backend may take to load before it is killed and reported as hung")
      ->type_name("SECONDS")
      ->check(CLI::Range(1, 86400));
  sub->footer(
      "Each backend is loaded in a child process of its own, so a plugin that crashes,\n"
      "exits or hangs while loading is reported as FAILED (with the signal, the exit\n"
      "code, or \"did not return within N s\") and the others are still checked.\n"
      "Exits 0 when every required backend loaded (optional failures and unavailable\n"
      "optional backends are warnings), 1 when a required backend failed or is unavailable\n"
      "(its devices cannot be reached), 2 when the config cannot be read or parsed.");
  return {sub, [options] { return run_check(*options); }};
}

}  // namespace backplane::cli
