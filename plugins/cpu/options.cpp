// Parsing of the cpu plugin's options object.
#include "options.hpp"

#include <backplane/plugin/status.hpp>
#include <nlohmann/json.hpp>

namespace backplane::cpu {
namespace {

using plugin::fail;

// A non-empty string option, or a clear error.
std::string string_option(const std::string& key, const nlohmann::json& value) {
  if (!value.is_string() || value.get<std::string>().empty())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: option " + nlohmann::json(key).dump() + " must be a non-empty string, got " + value.dump());
  return value.get<std::string>();
}

int64_t threads_option(const nlohmann::json& value) {
  // nlohmann stores non-negative integers as unsigned, negative ones as signed.
  if (!value.is_number_unsigned())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: option \"threads\" must be a non-negative integer (0: one per core), got " + value.dump());
  const uint64_t n = value.get<uint64_t>();
  if (n > static_cast<uint64_t>(kMaxThreadsOption))
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: option \"threads\" must be at most " +
                                         std::to_string(kMaxThreadsOption) + ", got " + value.dump());
  return static_cast<int64_t>(n);
}

}  // namespace

Options parse_options(const std::string& json_text) {
  nlohmann::json options;
  try {
    options = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cpu: options are not valid JSON: ") + e.what());
  }
  Options parsed;
  if (options.is_null()) return parsed;
  if (!options.is_object())
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: options must be a JSON object, got " + options.dump());
  for (const auto& [key, value] : options.items()) {
    if (key == "threads") {
      parsed.threads = threads_option(value);
    } else if (key == "collective") {
      if (!value.is_boolean())
        fail(BP_STATUS_INVALID_ARGUMENT,
             "cpu: option \"collective\" must be true or false, got " + value.dump());
      parsed.collective = value.get<bool>();
    } else if (key == "hostname") {
      parsed.network.hostname = string_option(key, value);
    } else if (key == "interface") {
      parsed.network.interface = string_option(key, value);
    } else {
      fail(BP_STATUS_INVALID_ARGUMENT,
           "cpu: unknown option " + nlohmann::json(key).dump() +
               " (accepted: \"threads\", \"collective\", \"hostname\", \"interface\")");
    }
  }
  if (!parsed.network.hostname.empty() && !parsed.network.interface.empty())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: options \"hostname\" and \"interface\" both say where collectives listen; set one of them");
  return parsed;
}

}  // namespace backplane::cpu
