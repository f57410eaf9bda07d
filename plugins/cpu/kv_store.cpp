// The host's key-value store for the collectives (see kv_store.hpp).
#include "kv_store.hpp"

#include <memory>
#include <utility>

namespace backplane::cpu {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A status owned by the store, freed by the store.
class StoreStatus {
 public:
  StoreStatus(const bp_kv_store& kv, bp_status* status) noexcept : kv_(kv), status_(status) {}
  ~StoreStatus() {
    if (status_ != nullptr) kv_.status_free(status_);
  }
  StoreStatus(const StoreStatus&) = delete;
  StoreStatus& operator=(const StoreStatus&) = delete;

  bool ok() const noexcept { return status_ == nullptr; }
  // Throws StoreFailure when the call failed.
  void check(const char* operation, std::vector<std::string> keys) const {
    if (ok()) return;
    const int32_t code = kv_.status_code(status_);
    const char* message = kv_.status_message(status_);
    throw StoreFailure{code == BP_STATUS_TIMEOUT         ? BP_STATUS_TIMEOUT
                       : code == BP_STATUS_OUT_OF_MEMORY ? BP_STATUS_OUT_OF_MEMORY
                                                         : BP_STATUS_IO,
                       operation, std::move(keys),
                       message != nullptr && *message != '\0' ? message : "the store gave no reason"};
  }

 private:
  const bp_kv_store& kv_;
  bp_status* status_;
};

// A value returned by get, freed by the store.
struct StoreValue {
  const bp_kv_store& kv;
  uint8_t* data = nullptr;
  ~StoreValue() {
    if (data != nullptr) kv.free_value(kv.ctx, data);
  }
};

void store_set(const bp_kv_store& kv, const std::string& key, const void* data, uint64_t size,
               const std::string& named) {
  bp_kv_set_args args{};
  args.struct_size = sizeof(args);
  args.ctx = kv.ctx;
  args.key = key.c_str();
  args.value = data;
  args.size = size;
  StoreStatus(kv, kv.set(&args)).check("set", {named});
}

std::vector<char> store_get(const bp_kv_store& kv, const std::string& key, int64_t timeout_ms,
                            const std::string& named) {
  bp_kv_get_args args{};
  args.struct_size = sizeof(args);
  args.ctx = kv.ctx;
  args.key = key.c_str();
  args.timeout_ms = timeout_ms;
  const StoreStatus status(kv, kv.get(&args));
  const StoreValue value{kv, args.value};
  status.check("get", {named});
  const auto* bytes = reinterpret_cast<const char*>(value.data);
  return bytes != nullptr ? std::vector<char>(bytes, bytes + args.size) : std::vector<char>();
}

}  // namespace

std::string missing_store_entries(const bp_kv_store& kv) {
  std::string missing;
  auto need = [&](bool present, const char* name) {
    if (!present) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  const bool sized = BP_HAS_FIELD(bp_kv_store, status_free, kv.struct_size);
  need(sized && kv.set != nullptr, "set");
  need(sized && kv.get != nullptr, "get");
  need(sized && kv.wait != nullptr, "wait");
  need(sized && kv.free_value != nullptr, "free_value");
  need(sized && kv.status_code != nullptr, "status_code");
  need(sized && kv.status_message != nullptr, "status_message");
  need(sized && kv.status_free != nullptr, "status_free");
  return missing;
}

GlooStore::GlooStore(const bp_kv_store& kv, std::string prefix, Clock::time_point deadline)
    : kv_(kv), prefix_(std::move(prefix)), deadline_(deadline) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  store_set(kv_, prefix_ + key, data.data(), data.size(), key);
}

std::vector<char> GlooStore::get(const std::string& key) {
  std::vector<char> value = store_get(kv_, prefix_ + key, remaining_ms("get", {key}), key);
  seen_[key] = value;
  return value;
}

void GlooStore::wait(const std::vector<std::string>& keys) { wait(keys, milliseconds(0)); }

void GlooStore::wait(const std::vector<std::string>& keys, const milliseconds&) {
  std::vector<std::string> full;
  std::vector<const char*> pointers;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  for (const auto& k : full) pointers.push_back(k.c_str());
  bp_kv_wait_args args{};
  args.struct_size = sizeof(args);
  args.ctx = kv_.ctx;
  args.keys = pointers.data();
  args.num_keys = static_cast<int32_t>(pointers.size());
  args.timeout_ms = remaining_ms("wait", keys);
  StoreStatus(kv_, kv_.wait(&args)).check("wait", keys);
}

int64_t GlooStore::remaining_ms(const char* operation, const std::vector<std::string>& keys) const {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now()).count();
  if (left <= 0) throw StoreFailure{BP_STATUS_TIMEOUT, operation, keys, "no time left before the deadline"};
  return left;
}

void FailureBoard::publish(int32_t rank, const std::string& message) const noexcept {
  if (kv_ == nullptr) return;
  try {
    const std::string key = prefix_ + "failed/" + std::to_string(rank);
    store_set(*kv_, key, message.data(), message.size(), key);
  } catch (...) {
    // Nothing to do: the peers then report the closed connection alone.
  }
}

std::string FailureBoard::read(int32_t peer) const noexcept {
  if (kv_ == nullptr || peer < 0) return "";
  try {
    const std::string key = prefix_ + "failed/" + std::to_string(peer);
    // The peer wrote the key before closing, so it is there already or never.
    const std::vector<char> value = store_get(*kv_, key, 0, key);
    return std::string(value.begin(), value.end());
  } catch (...) {
    return "";
  }
}

}  // namespace backplane::cpu
