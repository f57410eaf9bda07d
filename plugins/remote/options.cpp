// Parsing of the remote plugin's options object, and reading its token.
#include "plugins/remote/options.hpp"

#include <backplane/plugin/status.hpp>
#include <backplane_common/edit_distance.hpp>
#include <backplane_common/secret_file.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "remote/wire/stream.hpp"

namespace backplane::remote::client {
namespace {

using plugin::fail;

constexpr const char* kNames[] = {"endpoints",          "token_env",    "token_file", "connect_timeout_ms",
                                  "request_timeout_ms", "heartbeat_ms", "tls_ca",     "tls_server_name",
                                  "max_coalesce_bytes"};
constexpr uint64_t kMaxCoalesceLimit = uint64_t{16} << 20;

[[noreturn]] void bad(const std::string& key, const std::string& what, const nlohmann::json& got) {
  fail(BP_STATUS_INVALID_ARGUMENT,
       "remote: option " + nlohmann::json(key).dump() + " must be " + what + ", got " + got.dump());
}

std::string string_option(const std::string& key, const nlohmann::json& value) {
  if (!value.is_string() || value.get<std::string>().empty()) bad(key, "a non-empty string", value);
  return value.get<std::string>();
}

// nlohmann stores non-negative integers as unsigned, negative ones as signed.
uint64_t integer_option(const std::string& key, const nlohmann::json& value, uint64_t low, uint64_t high,
                        const char* unit) {
  const std::string range = "an integer from " + std::to_string(low) + " to " + std::to_string(high) + unit;
  if (!value.is_number_unsigned()) bad(key, range, value);
  const uint64_t n = value.get<uint64_t>();
  if (n < low || n > high) bad(key, range, value);
  return n;
}

std::string read_token_file(const std::string& path) {
  try {
    return common::read_secret_file(path, "the token file (option \"token_file\")");
  } catch (const common::SecretFileError& e) {
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("remote: ") + e.what());
  }
}

}  // namespace

std::string closest_option(const std::string& key) {
  std::string best;
  std::size_t best_distance = 3;
  for (const char* name : kNames) {
    const std::size_t d = common::edit_distance(key, name);
    if (d < best_distance) {
      best_distance = d;
      best = name;
    }
  }
  return best;
}

Options parse_options(const std::string& json_text) {
  nlohmann::json options;
  try {
    options = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("remote: options are not valid JSON: ") + e.what());
  }
  if (!options.is_object())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "remote: options must be a JSON object with at least \"endpoints\" (e.g. {\"endpoints\": "
         "[\"127.0.0.1:7070\"]}), got " +
             options.dump());
  Options parsed;
  bool token_env_given = false;
  for (const auto& [key, value] : options.items()) {
    if (key == "endpoints") {
      const char* what = "a non-empty array of \"HOST:PORT\" strings (e.g. [\"127.0.0.1:7070\"])";
      if (!value.is_array() || value.empty()) bad(key, what, value);
      std::set<std::string> seen;
      for (const auto& e : value) {
        if (!e.is_string()) bad(key, what, value);
        const std::string endpoint = e.get<std::string>();
        try {
          wire::split_endpoint(endpoint);
        } catch (const std::invalid_argument& ex) {
          fail(BP_STATUS_INVALID_ARGUMENT, std::string("remote: option \"endpoints\": ") + ex.what());
        }
        if (!seen.insert(endpoint).second)
          fail(BP_STATUS_INVALID_ARGUMENT,
               "remote: option \"endpoints\" names \"" + endpoint +
                   "\" twice; each server is listed once (its devices all appear)");
        parsed.endpoints.push_back(endpoint);
      }
    } else if (key == "token_env") {
      parsed.token_env = string_option(key, value);
      if (parsed.token_env.find('=') != std::string::npos)
        bad(key, "the name of an environment variable (no '=')", value);
      token_env_given = true;
    } else if (key == "token_file") {
      parsed.token_file = string_option(key, value);
    } else if (key == "connect_timeout_ms") {
      parsed.connect_timeout_ms = static_cast<int64_t>(integer_option(key, value, 1, 3'600'000, " (ms)"));
    } else if (key == "request_timeout_ms") {
      parsed.request_timeout_ms = static_cast<int64_t>(integer_option(key, value, 1, 86'400'000, " (ms)"));
    } else if (key == "heartbeat_ms") {
      parsed.heartbeat_ms =
          static_cast<int64_t>(integer_option(key, value, 0, 3'600'000, " (ms; 0: no heartbeat)"));
    } else if (key == "tls_ca") {
      parsed.tls_ca = string_option(key, value);
    } else if (key == "tls_server_name") {
      parsed.tls_server_name = string_option(key, value);
    } else if (key == "max_coalesce_bytes") {
      parsed.max_coalesce_bytes = integer_option(key, value, 0, kMaxCoalesceLimit, " (bytes)");
    } else {
      const std::string near = closest_option(key);
      std::string accepted;
      for (const char* name : kNames)
        accepted += std::string(accepted.empty() ? "" : ", ") + "\"" + name + "\"";
      fail(BP_STATUS_INVALID_ARGUMENT, "remote: unknown option " + nlohmann::json(key).dump() +
                                           (near.empty() ? "" : " (did you mean \"" + near + "\"?)") +
                                           "; accepted: " + accepted);
    }
  }
  if (parsed.endpoints.empty())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "remote: option \"endpoints\" is required: the servers to use, e.g. \"endpoints\": "
         "[\"127.0.0.1:7070\"] "
         "(start each with `backplane serve --listen HOST:PORT`)");
  if (token_env_given && !parsed.token_file.empty())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "remote: options \"token_env\" and \"token_file\" both say where the token is; set one of them");
  if (!parsed.tls_server_name.empty() && parsed.tls_ca.empty())
    fail(
        BP_STATUS_INVALID_ARGUMENT,
        "remote: option \"tls_server_name\" needs \"tls_ca\" (the CA that signed the servers' certificates): "
        "without it the connection is not TLS");
  return parsed;
}

std::string read_token(const Options& options) {
  if (!options.token_file.empty()) return read_token_file(options.token_file);
  const char* value = std::getenv(options.token_env.c_str());
  return value != nullptr ? std::string(value) : std::string();
}

}  // namespace backplane::remote::client
