// Shared pieces of the backplane CLI: exit codes, the subcommand hook, config
// choice and loading, and text helpers. One file per subcommand (cmd_*.cpp)
// adds itself with an add_*_command function declared here.
#ifndef BACKPLANE_TOOLS_CLI_HPP_
#define BACKPLANE_TOOLS_CLI_HPP_

#include <backplane/registry.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace CLI {
class App;
}

namespace backplane::cli {

// Process exit codes; main.cpp prints this table in --help.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailed = 1,     // a required backend failed to load, or the command failed
  kExitConfig = 2,     // the config cannot be found, read, parsed or validated
  kExitUsage = 64,     // bad command line
  kExitInternal = 70,  // an unexpected error: a bug
  // launch: the command cannot be found or executed (the shell's code for it)
  kExitNotExecutable = 127,
};

// Thrown by a subcommand to stop with "backplane: error: <message>" and `code`.
class CommandError : public std::runtime_error {
 public:
  CommandError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

// A subcommand: `app` is its CLI11 node; `run` is called after parsing when
// it was chosen and returns the exit code. add_*_command adds the subcommand
// and its options to `parent`; the option values live in run's closure.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
Command add_list_command(CLI::App& parent);
Command add_check_command(CLI::App& parent);
Command add_conformance_command(CLI::App& parent);
Command add_launch_command(CLI::App& parent);
Command add_train_command(CLI::App& parent);

// The config a subcommand reads: `flag` (--config) when not empty, else
// Registry::default_config_path() (BACKPLANE_CONFIG, else the installed
// default; never ./backends.json unless named). Throws CommandError(kExitConfig) when the file is missing.
std::filesystem::path choose_config(const std::string& flag);

// Loads every backend of `config` and keeps the failed ones, required or not,
// in the registry (RequiredPolicy::report). Config errors become
// CommandError(kExitConfig).
Registry load_for_report(const std::filesystem::path& config);

// The config file a registry came from, absolute ("chosen" if it has none).
std::filesystem::path shown_config_path(const Registry& registry, const std::filesystem::path& chosen);

// "backplane: error: <message>" on stderr (continuation lines indented).
void print_error(std::string_view message);
void print_warning(std::string_view message);

// `text` with every line after the first prefixed by `indent` spaces.
std::string indent_continuation(std::string_view text, std::size_t indent);
// "15.6 GiB", "512 MiB", "unknown" for 0.
std::string format_bytes(uint64_t bytes);
// What to try when a backend failed, from its error code and paths.
std::string failure_hint(const Backend& backend, const std::filesystem::path& config);

}  // namespace backplane::cli

#endif  // BACKPLANE_TOOLS_CLI_HPP_
