// backends.json: parsing and validation into a Config, with JSON-path errors.
#ifndef BACKPLANE_CORE_CONFIG_HPP_
#define BACKPLANE_CORE_CONFIG_HPP_

#include <backplane/error.hpp>
#include <backplane/registry.hpp>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::detail {

struct BackendConfig {
  std::string path;  // "backends[2]"
  std::string name;  // the configured name, or `path` when unreadable
  std::string library;
  bool required = false;
  std::string options_json = "{}";
  CollectiveFallback fallback;
  OpFallback op_fallback;  // "op_fallback": the target's rules are checked in parse_config
};

struct Config {
  std::string source;              // file path or a caller's name, for messages
  std::filesystem::path base_dir;  // relative library paths resolve here
  int schema_version = 1;
  std::vector<std::filesystem::path> plugin_dirs;  // absolute
  std::string default_backend;
  std::vector<BackendConfig> backends;
  // "torch_devices": which backend serves tensors of a torch device type
  // ("cpu", "cuda") in the PyTorch bridge; names are checked against backends.
  std::vector<std::pair<std::string, std::string>> torch_devices;
};

// Limits checked before a document is built, so that no input can make the
// parser recurse or allocate without bound. A backends.json needs a few
// levels and a few kilobytes; raise these constants to accept more.
inline constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;  // 1 MiB
inline constexpr std::size_t kMaxConfigDepth = 64;                    // nested arrays and objects
// Backend names appear in device ids ("cpu:0"), in "host:<backend>" and on
// terminals: [A-Za-z0-9_.-], 1 to kMaxBackendName characters.
inline constexpr std::size_t kMaxBackendName = 64;

// Throws Errc::config_error naming the JSON path for any problem anywhere in
// the file: malformed JSON, a schema error in any entry, a number out of
// range, a NUL in any string, a bad or repeated backend name. A config is
// valid as a whole or not at all; only loading a plugin fails per backend.
Config parse_config(std::string_view text, const std::filesystem::path& base_dir, std::string_view source);

// Refuses (throws `code`) a file that someone other than its owner and root
// could have written: a group- or other-writable file or containing folder
// (a sticky folder such as /tmp excepted), or one owned by another user.
// `what` names the file in the message ("config file", "plugin library").
void require_private_file(const std::filesystem::path& file, std::string_view what, Errc code);

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_CONFIG_HPP_
