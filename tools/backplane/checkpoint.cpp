// `backplane train`'s checkpoints (see checkpoint.hpp).
#include "checkpoint.hpp"

#include <backplane/log.hpp>
#include <backplane/safetensors.hpp>
#include <backplane_common/crypto.hpp>
#include <backplane_common/hex.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace backplane::cli {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "step-";
constexpr std::string_view kSuffix = ".safetensors";
constexpr const char* kFormatKey = "backplane.checkpoint";
constexpr const char* kFormat = "1";

[[noreturn]] [[gnu::cold]] void invalid(const fs::path& file, const std::string& what) {
  throw Error(Errc::invalid_argument, file.string() + ": " + what);
}

// The step of "step-<digits>.safetensors"; nullopt for any other name.
std::optional<int64_t> step_of(const std::string& name) {
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0 ||
      name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return std::nullopt;
  const char* first = name.data() + kPrefix.size();
  const char* last = name.data() + name.size() - kSuffix.size();
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || end != last || step < 0) return std::nullopt;
  return step;
}

std::string file_name(int64_t step) {
  char name[48];
  std::snprintf(name, sizeof name, "step-%010lld.safetensors", static_cast<long long>(step));
  return name;
}

// A number exact_text wrote. A loss may be nan or inf (a run that diverged
// still resumes where it stopped); to_chars writes those as strtod reads them.
double parse_exact(const fs::path& file, const std::string& key, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || (errno == ERANGE && std::isfinite(value)))
    invalid(file, "metadata \"" + key + "\" holds \"" + text + "\", which is not a number");
  return value;
}

int64_t parse_count(const fs::path& file, const std::string& key, const std::string& text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 0)
    invalid(file, "metadata \"" + key + "\" holds \"" + text + "\", which is not a count (0 or more)");
  return value;
}

std::string numbers_text(const std::vector<double>& values) {
  nlohmann::json array = nlohmann::json::array();
  for (const double v : values) array.push_back(exact_text(v));
  return array.dump();
}

std::vector<double> parse_numbers(const fs::path& file, const std::string& key, const std::string& text) {
  const nlohmann::json array = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!array.is_array()) invalid(file, "metadata \"" + key + "\" is not a JSON array");
  std::vector<double> out;
  out.reserve(array.size());
  for (const nlohmann::json& v : array) {
    if (!v.is_string()) invalid(file, "metadata \"" + key + "\" holds a value that is not a string");
    out.push_back(parse_exact(file, key, v.get<std::string>()));
  }
  return out;
}

const std::string& required(const fs::path& file, const std::map<std::string, std::string>& metadata,
                            const std::string& key) {
  const auto it = metadata.find(key);
  if (it == metadata.end()) invalid(file, "its metadata lacks \"" + key + "\"");
  return it->second;
}

}  // namespace

std::string exact_text(double value) {
  char text[40];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);  // shortest that reads back exactly
  return ec == std::errc() ? std::string(text, end) : std::string("nan");
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (const std::optional<int64_t> step = step_of(it->path().filename().string()))
      if (it->is_regular_file(ec)) out.emplace_back(*step, it->path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

int remove_interrupted_writes(const fs::path& dir) {
  // The temporary names of an atomic write: ".<name>.tmp-<suffix>".
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto tmp = name.find(".tmp-");
    if (name.size() < 2 || name[0] != '.' || tmp == std::string::npos) continue;
    if (!step_of(name.substr(1, tmp - 1))) continue;
    std::error_code rm;
    if (fs::remove(it->path(), rm)) ++removed;
  }
  return removed;
}

std::string tensors_sha256(const std::vector<const NamedTensors*>& groups) {
  common::Sha256Hasher hasher;
  std::vector<uint8_t> bytes;
  for (const NamedTensors* group : groups) {
    for (const auto& [name, t] : *group) {
      bytes.resize(t.nbytes());
      t.read_into(t.dtype(), bytes.data(), static_cast<std::size_t>(t.numel()));
      hasher.update(bytes);
    }
  }
  const std::optional<common::Sha256> digest = hasher.finish();
  if (!digest)
    throw Error(Errc::internal,
                "train: checkpoint checksum: SHA-256 failed in libcrypto (check the OpenSSL installation)");
  return common::to_hex(*digest);
}

fs::path save_checkpoint(const fs::path& dir, const TrainPosition& position, const RunIdentity& identity,
                         const std::vector<std::string>& command, const NamedTensors& model,
                         const NamedTensors& optimizer, int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(Errc::io_error, "cannot make the checkpoint folder " + dir.string() + ": " + ec.message());
  NamedTensors tensors;
  for (const auto& [name, t] : model) tensors.emplace_back("model." + name, t);
  for (const auto& [name, t] : optimizer) tensors.emplace_back("optimizer." + name, t);

  std::map<std::string, std::string> metadata;
  metadata[kFormatKey] = kFormat;
  metadata["step"] = std::to_string(position.step);
  metadata["completed_epochs"] = std::to_string(position.completed_epochs);
  metadata["epoch_step"] = std::to_string(position.epoch_step);
  metadata["loss_sums"] = numbers_text(position.loss_sums);
  metadata["epoch_loss"] = numbers_text(position.epoch_loss);
  metadata["step_loss"] = numbers_text(position.step_loss);
  metadata["args"] = nlohmann::json(identity).dump();
  // Arguments need not be UTF-8 (a path in another encoding): replaced, not refused.
  metadata["command"] =
      nlohmann::json(command).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  metadata["checksum"] = "sha256:" + tensors_sha256({&tensors});

  const fs::path file = dir / file_name(position.step);
  save_safetensors(file, tensors, metadata);
  // Keep this one and the newest keep - 1 before it. Checkpoints of later
  // steps are what a resume skipped as damaged (a valid one would have been
  // resumed from): left, they would count among the kept and push out the
  // ones this run can resume from.
  std::size_t kept = 0;
  for (const auto& [step, path] : list_checkpoints(dir)) {
    const bool keep_it = step <= position.step && kept < static_cast<std::size_t>(std::max(keep, 1));
    if (keep_it) {
      ++kept;
      continue;
    }
    std::error_code rm;
    if (!fs::remove(path, rm) && rm)
      log(LogLevel::warning, "train: cannot remove the old checkpoint " + path.string() + ": " +
                                 rm.message() + " (remove it by hand, or the folder keeps growing)");
  }
  return file;
}

Checkpoint load_checkpoint(const fs::path& file, const Device& device) {
  SafetensorsFile read = load_safetensors(file, device);
  const std::map<std::string, std::string>& meta = read.metadata;
  const auto format = meta.find(kFormatKey);
  if (format == meta.end())
    invalid(file,
            "not a backplane train checkpoint (its metadata has no \"" + std::string(kFormatKey) + "\")");
  if (format->second != kFormat)
    invalid(file, "checkpoint format " + format->second + ", but this backplane reads format " + kFormat);

  const std::string& checksum = required(file, meta, "checksum");
  const std::string actual = "sha256:" + tensors_sha256({&read.tensors});
  if (checksum != actual)
    invalid(file, "its tensors do not match their checksum (recorded " + checksum + ", computed " + actual +
                      "): the file is damaged");

  Checkpoint c;
  c.path = file;
  TrainPosition& p = c.position;
  p.step = parse_count(file, "step", required(file, meta, "step"));
  const int64_t epochs = parse_count(file, "completed_epochs", required(file, meta, "completed_epochs"));
  if (epochs > INT32_MAX) invalid(file, "metadata \"completed_epochs\" is out of range");
  p.completed_epochs = static_cast<int32_t>(epochs);
  p.epoch_step = parse_count(file, "epoch_step", required(file, meta, "epoch_step"));
  p.loss_sums = parse_numbers(file, "loss_sums", required(file, meta, "loss_sums"));
  p.epoch_loss = parse_numbers(file, "epoch_loss", required(file, meta, "epoch_loss"));
  p.step_loss = parse_numbers(file, "step_loss", required(file, meta, "step_loss"));
  if (p.epoch_step > 0 && p.loss_sums.empty())
    invalid(file, "it stops inside an epoch (step " + std::to_string(p.epoch_step) +
                      " of it) but records no partial loss sums");
  if (p.epoch_loss.size() != static_cast<std::size_t>(p.completed_epochs))
    invalid(file, "it records " + std::to_string(p.epoch_loss.size()) + " epoch losses for " +
                      std::to_string(p.completed_epochs) + " completed epochs");

  const nlohmann::json args = nlohmann::json::parse(required(file, meta, "args"), nullptr, false);
  if (!args.is_object()) invalid(file, "metadata \"args\" is not a JSON object");
  for (const auto& [key, value] : args.items()) {
    if (!value.is_string()) invalid(file, "metadata \"args\" holds a value that is not a string");
    c.identity[key] = value.get<std::string>();
  }

  for (auto& [name, t] : read.tensors) {
    if (name.rfind("model.", 0) == 0)
      c.model.emplace_back(name.substr(6), std::move(t));
    else if (name.rfind("optimizer.", 0) == 0)
      c.optimizer.emplace_back(name.substr(10), std::move(t));
    else
      invalid(file, "tensor \"" + name + "\" is neither model.* nor optimizer.*");
  }
  return c;
}

std::string identity_mismatch(const RunIdentity& theirs, const RunIdentity& ours) {
  std::string out;
  auto add = [&](const std::string& key, const std::string& was, const std::string& now) {
    out += (out.empty() ? "" : ", ") + key + " " + was + " (this run: " + now + ")";
  };
  for (const auto& [key, value] : ours) {
    const auto it = theirs.find(key);
    if (it == theirs.end())
      add(key, "unset", value);
    else if (it->second != value)
      add(key, it->second, value);
  }
  for (const auto& [key, value] : theirs)
    if (ours.find(key) == ours.end()) add(key, value, "unset");
  return out;
}

}  // namespace backplane::cli
