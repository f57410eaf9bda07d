// What `list` and `check` show about a config's backends, gathered either in
// this process or with every backend loaded in a child process of its own
// (--isolate; always for check), so that a plugin that crashes, exits or hangs
// while loading is reported as such and the other backends are still checked.
#ifndef BACKPLANE_TOOLS_ISOLATE_HPP_
#define BACKPLANE_TOOLS_ISOLATE_HPP_

#include "cli.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace backplane::cli {

using Json = nlohmann::ordered_json;

// One backend: `info` is the object `backplane list --json` prints for it
// (name, library, library_path, version, abi_version, status, error,
// error_code, required, collective_fallback, capabilities, devices); `hint`
// says what to try when it did not load ("" when it did).
struct BackendReport {
  Json info;
  std::string hint;
};

struct RegistryReport {
  std::filesystem::path config;                // absolute, as shown
  std::optional<std::string> default_backend;  // the config's, else the first loaded
  std::vector<BackendReport> backends;         // in config order
};

// Seconds a child may take to load its backend before it is killed.
inline constexpr int kDefaultLoadTimeoutSeconds = 30;

// list --json's object for `backend`, and the report of a backend of `config`.
Json backend_json(const Backend& backend);
BackendReport backend_report(const Backend& backend, const std::filesystem::path& config);

// Loads every backend of `config` in this process (load_for_report).
RegistryReport report_in_process(const std::filesystem::path& config);

// Validates `config` in this process (loading nothing), then loads each
// backend in a child process running this executable's hidden __load-backend
// subcommand, which answers on a pipe. A child killed by a signal, exiting
// without an answer, answering garbage, or still running after
// `timeout_seconds` (then killed, with its process group: SIGTERM, SIGKILL
// after a grace) makes that backend failed with exactly that reason.
// Config errors throw CommandError(kExitConfig), as load_for_report does.
RegistryReport report_isolated(const std::filesystem::path& config, int timeout_seconds);

// The hidden subcommand a child runs: loads one backend of a config and
// writes its report as one JSON object to a file descriptor.
Command add_load_backend_command(CLI::App& parent);

}  // namespace backplane::cli

#endif  // BACKPLANE_TOOLS_ISOLATE_HPP_
