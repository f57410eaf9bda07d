// `backplane train`'s checkpoints (see checkpoint.hpp).
#include "checkpoint.hpp"

#include <backplane/log.hpp>
#include <backplane/safetensors.hpp>
#include <backplane_common/atomic_file.hpp>
#include <backplane_common/crypto.hpp>
#include <backplane_common/hex.hpp>

#include <nlohmann/json.hpp>

#include <set>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <span>
#include <string_view>

namespace backplane::cli {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "step-";
constexpr std::string_view kSuffix = ".safetensors";
constexpr const char* kFormatKey = "backplane.checkpoint";
// 2: the checksum covers the metadata and every tensor's name, dtype and
// shape as well as its bytes. 1 (read, with a warning): tensors' bytes only.
constexpr const char* kFormat = "2";
constexpr const char* kFormatTensorsOnly = "1";
constexpr const char* kChecksumKey = "checksum";
// Bytes hashed per read when a checkpoint is checked: no tensor is copied whole.
constexpr std::size_t kHashChunk = std::size_t{1} << 20;

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

// The hex digest of everything `hasher` was given.
std::string finish_hex(common::Sha256Hasher& hasher) {
  const std::optional<common::Sha256> digest = hasher.finish();
  if (!digest)
    throw Error(Errc::internal,
                "train: checkpoint checksum: SHA-256 failed in libcrypto (check the OpenSSL installation)");
  return common::to_hex(*digest);
}

// A checkpoint's checksum: SHA-256 over its metadata (every key but the
// checksum, sorted, each key and value length-prefixed) and then, per tensor
// in the file's order, its name, dtype, shape and bytes. One definition for
// writing and checking.
class CheckpointHasher {
 public:
  void metadata(const std::map<std::string, std::string>& metadata) {
    number(metadata.size() - metadata.count(kChecksumKey));
    for (const auto& [key, value] : metadata) {
      if (key == kChecksumKey) continue;
      text(key);
      text(value);
    }
  }
  void tensor(const std::string& name, DType dtype, const Shape& shape, uint64_t nbytes) {
    text(name);
    text(to_string(dtype));
    number(static_cast<uint64_t>(shape.rank()));
    for (const int64_t d : shape.to_vector()) number(static_cast<uint64_t>(d));
    number(nbytes);
  }
  void bytes(std::span<const uint8_t> data) { hasher_.update(data); }
  std::string finish() { return "sha256:" + finish_hex(hasher_); }

 private:
  void number(uint64_t value) {
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(value >> (8 * i));
    hasher_.update(le);
  }
  void text(std::string_view t) {
    number(t.size());
    hasher_.update({reinterpret_cast<const uint8_t*>(t.data()), t.size()});
  }
  common::Sha256Hasher hasher_;
};

// Hashes the bytes of `e` from the file, a chunk at a time.
void hash_file_bytes(const SafetensorsReader& file, const SafetensorsReader::Entry& e,
                     common::Sha256Hasher* plain, CheckpointHasher* checkpoint, std::vector<uint8_t>& chunk) {
  for (uint64_t done = 0; done < e.size;) {
    const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(kHashChunk, e.size - done));
    chunk.resize(n);
    file.read(e.offset + done, chunk.data(), n);
    if (plain) plain->update(chunk);
    if (checkpoint) checkpoint->bytes(chunk);
    done += n;
  }
}

// Names, dtypes and shapes against the run's layout, before a byte of a
// tensor is read: a planted file declaring a huge tensor costs nothing.
void check_layout(const SafetensorsReader& file, const CheckpointLayout& layout) {
  std::map<std::string, const TensorSpec*> specs;
  for (const TensorSpec& spec : layout) specs.emplace(spec.name, &spec);
  std::set<std::string> seen;
  for (const SafetensorsReader::Entry& e : file.entries()) {
    const auto it = specs.find(e.name);
    if (it == specs.end())
      invalid(file.path(),
              "it holds the tensor \"" + e.name + "\", which this run's model and optimizer do not have");
    const TensorSpec& spec = *it->second;
    if (e.dtype != spec.dtype || e.shape != spec.shape)
      invalid(file.path(), "its tensor \"" + e.name + "\" is " + std::string(to_string(e.dtype)) + " " +
                               e.shape.to_string() + ", this run's is " + std::string(to_string(spec.dtype)) +
                               " " + spec.shape.to_string());
    seen.insert(e.name);
  }
  for (const TensorSpec& spec : layout)
    if (spec.required && seen.count(spec.name) == 0)
      invalid(file.path(), "it lacks the tensor \"" + spec.name + "\" of this run's model");
}

}  // namespace

CheckpointFolderLock::CheckpointFolderLock(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path file = dir / ".backplane-train.lock";
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0644);
  if (fd_ < 0) {
    const int error = errno;
    throw Error(Errc::io_error, "cannot make the checkpoint folder's lock file " + file.string() + ": " +
                                    std::strerror(error) +
                                    (error == ELOOP ? " (it is a symbolic link; remove it)" : ""));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : std::string();
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (error != EWOULDBLOCK)
      throw Error(Errc::io_error, "cannot lock the checkpoint folder " + dir.string() + " (" + file.string() +
                                      "): " + std::strerror(error));
    throw Error(Errc::io_error,
                "the checkpoint folder " + dir.string() + " is in use by another train job (" +
                    (who.empty() ? std::string("its lock file names nobody yet") : who) +
                    "): two jobs in one folder would prune each other's checkpoints; wait for that job to "
                    "end, or pass another --checkpoint-dir");
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[64] = {};
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const std::string who = "pid " + std::to_string(::getpid()) + " on " + host + ", since " + when + "\n";
  // Who holds it, for the next job's message; the lock works without it.
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, who.data(), who.size(), 0) < 0)
    log(LogLevel::debug, "train: cannot note the holder in " + file.string() + ": " + std::strerror(errno));
}

CheckpointFolderLock::~CheckpointFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::string exact_text(double value) {
  char text[40];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);  // shortest that reads back exactly
  return ec == std::errc() ? std::string(text, end) : std::string("nan");
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    // Links are listed (a resume says it skips them), never followed.
    if (const std::optional<int64_t> step = step_of(it->path().filename().string())) {
      const fs::file_status st = it->symlink_status(ec);
      if (!ec && (fs::is_regular_file(st) || fs::is_symlink(st))) out.emplace_back(*step, it->path());
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

int remove_interrupted_writes(const fs::path& dir) {
  // The temporary files of save_safetensors' atomic writes of checkpoints.
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<std::string> final_name =
        common::final_name_of_temporary(it->path().filename().string());
    if (!final_name || !step_of(*final_name)) continue;
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
  return finish_hex(hasher);
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
  CheckpointHasher hasher;
  hasher.metadata(metadata);
  std::vector<uint8_t> bytes;
  for (const auto& [name, t] : tensors) {
    hasher.tensor(name, t.dtype(), t.shape(), t.nbytes());
    bytes.resize(t.nbytes());
    t.read_into(t.dtype(), bytes.data(), static_cast<std::size_t>(t.numel()));
    hasher.bytes(bytes);
  }
  metadata[kChecksumKey] = hasher.finish();

  // A link in the folder is replaced, never followed: the checkpoint lands
  // in the folder whatever was planted under its name.
  const fs::path file = dir / file_name(position.step);
  save_safetensors(file, tensors, metadata, SafetensorsLink::not_followed);
  // Keep this one and the newest keep - 1 before it. Checkpoints of later
  // steps are what a resume skipped as damaged (a valid one would have been
  // resumed from): left, they would count among the kept and push out the
  // ones this run can resume from.
  std::size_t kept = 0;
  for (const auto& [step, path] : list_checkpoints(dir)) {
    std::error_code rm;
    if (fs::is_symlink(fs::symlink_status(path, rm))) continue;  // not one this run wrote: left alone
    const bool keep_it = step <= position.step && kept < static_cast<std::size_t>(std::max(keep, 1));
    if (keep_it) {
      ++kept;
      continue;
    }
    if (!fs::remove(path, rm) && rm)
      log(LogLevel::warning, "train: cannot remove the old checkpoint " + path.string() + ": " +
                                 rm.message() + " (remove it by hand, or the folder keeps growing)");
  }
  return file;
}

Checkpoint load_checkpoint(const fs::path& file, const Device& device, const CheckpointLayout& layout) {
  // A link in the folder is refused, not followed.
  const SafetensorsReader reader(file, SafetensorsLink::not_followed);
  const std::map<std::string, std::string>& meta = reader.metadata();
  const auto format = meta.find(kFormatKey);
  if (format == meta.end())
    invalid(file,
            "not a backplane train checkpoint (its metadata has no \"" + std::string(kFormatKey) + "\")");
  const bool tensors_only = format->second == kFormatTensorsOnly;
  if (format->second != kFormat && !tensors_only)
    invalid(file, "checkpoint format " + format->second + ", but this backplane reads formats " +
                      kFormatTensorsOnly + " and " + kFormat);
  const std::string& checksum = required(file, meta, kChecksumKey);
  check_layout(reader, layout);

  common::Sha256Hasher plain;
  CheckpointHasher full;
  if (!tensors_only) full.metadata(meta);
  std::vector<uint8_t> chunk;
  for (const SafetensorsReader::Entry& e : reader.entries()) {
    if (!tensors_only) full.tensor(e.name, e.dtype, e.shape, e.size);
    hash_file_bytes(reader, e, tensors_only ? &plain : nullptr, tensors_only ? nullptr : &full, chunk);
  }
  const std::string actual = tensors_only ? "sha256:" + finish_hex(plain) : full.finish();
  if (checksum != actual)
    invalid(file, std::string(tensors_only ? "its tensors do not" : "its contents do not") +
                      " match their checksum (recorded " + checksum + ", computed " + actual +
                      "): the file is damaged");
  if (tensors_only)
    log(LogLevel::warning,
        "train: " + file.string() +
            " is a format-1 checkpoint, whose checksum covers only its tensors' bytes: its "
            "metadata (step, losses) is not checked; the checkpoints this run writes cover "
            "every byte");
  SafetensorsFile read = reader.load(device, SafetensorsLoad::copy);

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
