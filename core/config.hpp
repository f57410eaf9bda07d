// backends.json: parsing and validation into a Config, with JSON-path errors.
#ifndef BACKPLANE_CORE_CONFIG_HPP_
#define BACKPLANE_CORE_CONFIG_HPP_

#include <backplane/error.hpp>
#include <backplane/registry.hpp>

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
  // Set when this entry is invalid: the backend is kept, failed, with this.
  std::optional<Error> error;
};

struct Config {
  std::string source;               // file path or a caller's name, for messages
  std::filesystem::path base_dir;   // relative library paths resolve here
  int schema_version = 1;
  std::vector<std::filesystem::path> plugin_dirs;  // absolute
  std::string default_backend;
  std::vector<BackendConfig> backends;
};

// Throws Errc::config_error for malformed JSON and for top-level problems.
// A problem inside one backends[] entry is recorded in that entry instead,
// so the other backends still load.
Config parse_config(std::string_view text, const std::filesystem::path& base_dir, std::string_view source);

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_CONFIG_HPP_
