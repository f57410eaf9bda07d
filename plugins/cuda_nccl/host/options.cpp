// Parsing of the cuda plugin's options object (options.hpp).
#include "options.hpp"

#include <backplane/plugin/status.hpp>
#include <nlohmann/json.hpp>

namespace backplane::cuda {
namespace {

using plugin::fail;

bool bool_option(const std::string& key, const nlohmann::json& value) {
  if (!value.is_boolean())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cuda: option " + nlohmann::json(key).dump() + " must be true or false, got " + value.dump());
  return value.get<bool>();
}

int64_t mib_option(const std::string& key, const nlohmann::json& value, int64_t max) {
  // nlohmann stores non-negative integers as unsigned, negative ones as signed.
  if (!value.is_number_unsigned() || value.get<uint64_t>() > static_cast<uint64_t>(max))
    fail(BP_STATUS_INVALID_ARGUMENT, "cuda: option " + nlohmann::json(key).dump() +
                                         " must be an integer number of MiB from 0 to " +
                                         std::to_string(max) + ", got " + value.dump());
  return static_cast<int64_t>(value.get<uint64_t>());
}

}  // namespace

Options parse_options(const std::string& json_text) {
  nlohmann::json options;
  try {
    options = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cuda: options are not valid JSON: ") + e.what());
  }
  Options parsed;
  if (options.is_null()) return parsed;
  if (!options.is_object())
    fail(BP_STATUS_INVALID_ARGUMENT, "cuda: options must be a JSON object, got " + options.dump());
  for (const auto& [key, value] : options.items()) {
    if (key == "tf32") {
      parsed.tf32 = bool_option(key, value);
    } else if (key == "collective") {
      parsed.collective = bool_option(key, value);
    } else if (key == "staging_mib") {
      parsed.staging_mib = mib_option(key, value, kMaxStagingMiB);
    } else if (key == "pool_keep_mib") {
      parsed.pool_keep_mib = mib_option(key, value, int64_t{1} << 40);
    } else {
      fail(BP_STATUS_INVALID_ARGUMENT,
           "cuda: unknown option " + nlohmann::json(key).dump() +
               " (accepted: \"tf32\", \"collective\", \"staging_mib\", \"pool_keep_mib\")");
    }
  }
  return parsed;
}

}  // namespace backplane::cuda
