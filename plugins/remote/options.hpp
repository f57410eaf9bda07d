// The remote plugin's options (the backend's "options" object in
// backends.json): parsed once by create, immutable afterwards. The names are
// part of the contract (docs/remote.md lists each with its default).
#ifndef BACKPLANE_PLUGINS_REMOTE_CLIENT_OPTIONS_HPP_
#define BACKPLANE_PLUGINS_REMOTE_CLIENT_OPTIONS_HPP_

#include <cstdint>
#include <string>
#include <vector>

namespace backplane::remote::client {

inline constexpr const char* kDefaultTokenEnv = "BACKPLANE_REMOTE_TOKEN";

struct Options {
  std::vector<std::string> endpoints;        // "HOST:PORT", at least one, no duplicates
  std::string token_env = kDefaultTokenEnv;  // env var holding the token; unset/empty = no token
  std::string token_file;                    // alternative to token_env: a private file's first line
  // Connect + TLS + handshake, per endpoint: longer than a server makes a
  // client wait for a handshake slot under a flood (its --handshake-timeout-ms,
  // 5000 by default) plus the handshake itself.
  int64_t connect_timeout_ms = 15000;
  int64_t request_timeout_ms = 60000;       // longest wait of a synchronising call for its reply
  int64_t heartbeat_ms = 10000;             // Ping after this long without sending; 0 = never
  std::string tls_ca;                       // PEM CA file: enables TLS
  std::string tls_server_name;              // name checked against the certificate; "" = the endpoint's host
  uint64_t max_coalesce_bytes = 64 * 1024;  // writes up to this size are copied and coalesced
};

// Parses the options JSON text ("{}" or "null" for none). Unknown keys (with
// a did-you-mean when one is close), values of the wrong type or range, and
// combinations that contradict each other fail with
// BP_STATUS_INVALID_ARGUMENT naming the option and what is accepted.
Options parse_options(const std::string& json_text);

// The token the options name: token_file's first line (trimmed; the file must
// be private to its owner), else the variable token_env names; "" = no
// token. Throws BP_STATUS_INVALID_ARGUMENT naming what cannot be used.
std::string read_token(const Options& options);

// The accepted option name closest to `key` (edit distance <= 2), or "".
std::string closest_option(const std::string& key);

}  // namespace backplane::remote::client

#endif  // BACKPLANE_PLUGINS_REMOTE_CLIENT_OPTIONS_HPP_
