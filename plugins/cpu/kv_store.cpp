// The host's key-value store for the collectives (see kv_store.hpp).
#include "kv_store.hpp"

#include <algorithm>
#include <cstring>
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

// How long publishing a failure may wait for the store: short and fixed, so
// that a hung store host costs the survivors one timeout, not two.
constexpr int64_t kPublishTimeoutMs = 2000;

// timeout_ms <= 0: the store's own timeout.
void store_set(const bp_kv_store& kv, const std::string& key, const void* data, uint64_t size,
               const std::string& named, int64_t timeout_ms = 0) {
  bp_kv_set_args args{};
  args.struct_size = BP_KV_SET_ARGS_STRUCT_SIZE;
  args.ctx = kv.ctx;
  args.key = key.c_str();
  args.value = data;
  args.size = size;
  args.timeout_ms = timeout_ms;
  StoreStatus(kv, kv.set(&args)).check("set", {named});
}

std::vector<char> store_get(const bp_kv_store& kv, const std::string& key, int64_t timeout_ms,
                            const std::string& named) {
  bp_kv_get_args args{};
  args.struct_size = BP_KV_GET_ARGS_STRUCT_SIZE;
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

StoreExchange::StoreExchange(const bp_kv_store& kv, std::string prefix, Clock::time_point deadline)
    : kv_(kv), prefix_(std::move(prefix)), deadline_(deadline) {}

void StoreExchange::set(const std::string& key, const std::vector<char>& value) {
  store_set(kv_, prefix_ + key, value.data(), value.size(), key);
}

std::vector<char> StoreExchange::get(const std::string& key) {
  return store_get(kv_, prefix_ + key, remaining_ms("get", {key}), key);
}

void StoreExchange::wait(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  std::vector<const char*> pointers;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  for (const auto& k : full) pointers.push_back(k.c_str());
  bp_kv_wait_args args{};
  args.struct_size = BP_KV_WAIT_ARGS_STRUCT_SIZE;
  args.ctx = kv_.ctx;
  args.keys = pointers.data();
  args.num_keys = static_cast<int32_t>(pointers.size());
  args.timeout_ms = remaining_ms("wait", keys);
  StoreStatus(kv_, kv_.wait(&args)).check("wait", keys);
}

int64_t StoreExchange::remaining_ms(const char* operation, const std::vector<std::string>& keys) const {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now()).count();
  if (left <= 0) throw StoreFailure{BP_STATUS_TIMEOUT, operation, keys, "no time left before the deadline"};
  return left;
}

int32_t rank_of_key(const std::string& key, int32_t size) {
  const std::size_t last = key.find_last_not_of("0123456789");
  if (last != std::string::npos && key[last] != '/' && key[last] != '_') return -1;
  const std::string digits = last == std::string::npos ? key : key.substr(last + 1);
  if (digits.empty() || digits.size() > 9) return -1;
  const int32_t r = std::stoi(digits);
  return r < size ? r : -1;
}

plugin::Failure setup_failure(const StoreFailure& f, const std::string& where, const char* stage,
                              const std::string& prefix, int32_t size, milliseconds timeout) {
  std::string keys;
  for (const auto& k : f.keys) keys += (keys.empty() ? "" : ", ") + ("\"" + prefix + k + "\"");
  std::string why;
  // A wait on another rank's key that times out: that rank never joined.
  const int32_t missing = f.keys.size() == 1 ? rank_of_key(f.keys[0], size) : -1;
  if (f.code == BP_STATUS_TIMEOUT && f.operation != "set" && missing >= 0) {
    why = "rank " + std::to_string(missing) + " did not " +
          (f.keys[0].rfind("conn/", 0) == 0 ? "finish connecting" : "join") + " within " +
          std::to_string(timeout.count()) +
          " ms (did it start, and call comm_create with the same world size and key prefix?)";
  } else {
    why = "the key-value store failed to " + f.operation + " " + keys;
  }
  return plugin::Failure(f.code, where + ": " + stage + ": " + why + " [store: " + f.detail + "]");
}

void FailureBoard::publish(int32_t rank, const std::string& message) const noexcept {
  if (kv_ == nullptr) return;
  try {
    // A bounded set: on a hung store host an unbounded one would block for
    // the store's whole timeout after the collective's own, so survivors
    // would wait two timeouts instead of one.
    const std::string key = prefix_ + "failed/" + std::to_string(rank);
    store_set(*kv_, key, message.data(), message.size(), key, kPublishTimeoutMs);
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
