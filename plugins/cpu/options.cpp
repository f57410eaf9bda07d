// Parsing of the cpu plugin's options object.
#include "options.hpp"

#include "fp_mode.hpp"

#include <backplane/plugin/status.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <vector>

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

bool bool_option(const std::string& key, const nlohmann::json& value) {
  if (!value.is_boolean())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: option " + nlohmann::json(key).dump() + " must be true or false, got " + value.dump());
  return value.get<bool>();
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

int32_t pair_rings_option(const nlohmann::json& value) {
  if (!value.is_number_unsigned() || value.get<uint64_t>() > static_cast<uint64_t>(kMaxPairRingsOption))
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: option \"shared_memory_pair_rings\" must be an integer from 0 to " +
             std::to_string(kMaxPairRingsOption) +
             " (the largest group on one host given a ring per pair of ranks; 0: every group uses inboxes), "
             "got " +
             value.dump());
  return static_cast<int32_t>(value.get<uint64_t>());
}

// "\"a\", \"b\", ...": the names name_of gives the values 1 .. count - 1 (abi.h's tables).
std::string quoted_names(int32_t count, const char* (*name_of)(int32_t)) {
  std::string out;
  for (int32_t v = 1; v < count; ++v) out += (v == 1 ? "" : ", ") + nlohmann::json(name_of(v)).dump();
  return out;
}

// The values an array option of names lists ("ops", "dtypes"; `what` is "op" or
// "dtype"). Each must be a name of abi.h's table, once: a typo or a repeat in a
// test's config would otherwise model a different backend than its author meant.
std::vector<int32_t> names_option(const std::string& key, const nlohmann::json& value, const char* what,
                                  int32_t count, const char* (*name_of)(int32_t)) {
  const auto bad = [&](const std::string& problem) {
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: option " + nlohmann::json(key).dump() + " " + problem +
                                         " (accepted " + what + " names: " + quoted_names(count, name_of) +
                                         ")");
  };
  if (!value.is_array()) bad(std::string("must be an array of ") + what + " names, got " + value.dump());
  std::vector<int32_t> values;
  for (const nlohmann::json& item : value) {
    if (!item.is_string()) bad(std::string("must list ") + what + " names as strings, got " + item.dump());
    int32_t v = 1;
    while (v < count && item.get<std::string>() != name_of(v)) ++v;
    if (v == count) bad(std::string("names an unknown ") + what + ", " + item.dump());
    if (std::find(values.begin(), values.end(), v) != values.end()) bad("lists " + item.dump() + " twice");
    values.push_back(v);
  }
  return values;
}

// An empty list is accepted: a device that runs no op models a backend that only
// holds memory, so every op goes to the host's op_fallback.
OpSet ops_option(const nlohmann::json& value) {
  OpSet ops;
  for (const int32_t op : names_option("ops", value, "op", BP_OP_COUNT_, bp_op_name)) ops.set(op);
  return ops;
}

uint64_t dtypes_option(const nlohmann::json& value) {
  uint64_t flags = 0;
  for (const int32_t dtype : names_option("dtypes", value, "dtype", BP_DTYPE_COUNT_, bp_dtype_name))
    flags |= BP_CAP_DTYPE(dtype);
  // A device that holds no dtype could not hold a single tensor: surely a mistake.
  if (flags == 0)
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: option \"dtypes\" must list at least one dtype, got [] (accepted dtype names: " +
             quoted_names(BP_DTYPE_COUNT_, bp_dtype_name) + ")");
  return flags;
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
      parsed.collective = bool_option(key, value);
    } else if (key == "ops") {
      parsed.ops = ops_option(value);
    } else if (key == "dtypes") {
      parsed.dtypes = dtypes_option(value);
    } else if (key == "shared_memory") {
      parsed.network.shared_memory = bool_option(key, value);
    } else if (key == "shared_memory_pair_rings") {
      parsed.network.pair_rings_max_ranks = pair_rings_option(value);
    } else if (key == "flush_denormals") {
      parsed.flush_denormals = bool_option(key, value);
      if (parsed.flush_denormals && !kCanFlushDenormals)
        fail(BP_STATUS_UNSUPPORTED,
             "cpu: option \"flush_denormals\": this build cannot switch the floating-point mode (x86-64 "
             "only); "
             "remove the option");
    } else if (key == "hierarchical") {
      parsed.network.hierarchical = bool_option(key, value);
    } else if (key == "hostname") {
      parsed.network.hostname = string_option(key, value);
    } else if (key == "interface") {
      parsed.network.interface = string_option(key, value);
    } else {
      fail(BP_STATUS_INVALID_ARGUMENT,
           "cpu: unknown option " + nlohmann::json(key).dump() +
               " (accepted: \"threads\", \"collective\", \"ops\", \"dtypes\", \"hostname\", \"interface\", "
               "\"shared_memory\", \"shared_memory_pair_rings\", \"hierarchical\", \"flush_denormals\")");
    }
  }
  if (!parsed.network.hostname.empty() && !parsed.network.interface.empty())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: options \"hostname\" and \"interface\" both say where collectives listen; set one of them");
  return parsed;
}

}  // namespace backplane::cpu
