// A hosted communicator's key-value store, carried back to the client.
#include "remote/server/kv_bridge.hpp"

#include "remote/server/limits.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

namespace backplane::remote::server {

namespace {

// This store's statuses (abi.h: each producer defines its own); handed out
// as bp_status* and freed by status_free below.
struct KvStatus {
  int32_t code = BP_STATUS_OK;
  std::string message;
};

bp_status* make_status(int32_t code, std::string message) {
  auto s = std::make_unique<KvStatus>(KvStatus{code, std::move(message)});
  return reinterpret_cast<bp_status*>(s.release());
}

bp_status* to_status(const KvResult& r) {
  if (r.status == BP_STATUS_OK) return nullptr;
  // A code the ABI does not name must not reach the plugin as such.
  const int32_t code = bp_status_code_name(r.status) != nullptr ? r.status : BP_STATUS_INTERNAL;
  return make_status(code, "the client's key-value store: " + r.message);
}

std::chrono::milliseconds wait_for(int64_t timeout_ms, std::chrono::milliseconds fallback) {
  const std::chrono::milliseconds own = timeout_ms > 0 ? std::chrono::milliseconds(timeout_ms) : fallback;
  // Saturating: a timeout near int64's range must not overflow the sum.
  const auto max = std::chrono::milliseconds::max() - kKvReplyGrace;
  return std::min(own, max) + kKvReplyGrace;
}

}  // namespace

KvBridge::KvBridge(Sender& sender, std::chrono::milliseconds fallback_timeout)
    : sender_(sender), fallback_timeout_(fallback_timeout) {
  store_.struct_size = BP_KV_STORE_STRUCT_SIZE;
  store_.ctx = this;
  store_.set = &KvBridge::set;
  store_.get = &KvBridge::get;
  store_.wait = &KvBridge::wait;
  store_.free_value = &KvBridge::free_value;
  store_.status_code = &KvBridge::status_code;
  store_.status_message = &KvBridge::status_message;
  store_.status_free = &KvBridge::status_free;
}

KvResult KvBridge::call(KvCall c) {
  const std::chrono::milliseconds wait = wait_for(c.timeout_ms, fallback_timeout_);
  try {
    return sender_.kv(c, wait);
  } catch (const std::exception& e) {
    return KvResult{
        BP_STATUS_INTERNAL, std::string("the server could not forward the request: ") + e.what(), {}};
  }
}

bp_status* KvBridge::set(bp_kv_set_args* args) {
  if (args == nullptr || args->ctx == nullptr || args->key == nullptr ||
      (args->value == nullptr && args->size != 0))
    return make_status(BP_STATUS_INVALID_ARGUMENT, "kv set: a null key or value");
  auto* self = static_cast<KvBridge*>(args->ctx);
  KvCall c;
  c.kind = wire::KvKind::Set;
  c.keys.emplace_back(args->key);
  const auto* v = static_cast<const uint8_t*>(args->value);
  c.value.assign(v, v + args->size);
  c.timeout_ms = BP_HAS_FIELD(bp_kv_set_args, timeout_ms, args->struct_size) ? args->timeout_ms : 0;
  return to_status(self->call(std::move(c)));
}

bp_status* KvBridge::get(bp_kv_get_args* args) {
  if (args == nullptr || args->ctx == nullptr || args->key == nullptr)
    return make_status(BP_STATUS_INVALID_ARGUMENT, "kv get: a null key");
  auto* self = static_cast<KvBridge*>(args->ctx);
  args->value = nullptr;
  args->size = 0;
  KvCall c;
  c.kind = wire::KvKind::Get;
  c.keys.emplace_back(args->key);
  c.timeout_ms = args->timeout_ms;
  KvResult r = self->call(std::move(c));
  if (r.status != BP_STATUS_OK) return to_status(r);
  auto value = std::make_unique<uint8_t[]>(std::max<std::size_t>(r.value.size(), 1));
  std::copy(r.value.begin(), r.value.end(), value.get());
  args->size = r.value.size();
  args->value = value.release();  // the caller frees it with free_value
  return nullptr;
}

bp_status* KvBridge::wait(bp_kv_wait_args* args) {
  if (args == nullptr || args->ctx == nullptr || args->num_keys < 0 ||
      (args->keys == nullptr && args->num_keys > 0))
    return make_status(BP_STATUS_INVALID_ARGUMENT, "kv wait: null or negative keys");
  auto* self = static_cast<KvBridge*>(args->ctx);
  KvCall c;
  c.kind = wire::KvKind::Wait;
  for (int32_t i = 0; i < args->num_keys; ++i) {
    if (args->keys[i] == nullptr) return make_status(BP_STATUS_INVALID_ARGUMENT, "kv wait: a null key");
    c.keys.emplace_back(args->keys[i]);
  }
  c.timeout_ms = args->timeout_ms;
  return to_status(self->call(std::move(c)));
}

void KvBridge::free_value(void*, uint8_t* value) { std::unique_ptr<uint8_t[]> owned(value); }

int32_t KvBridge::status_code(const bp_status* status) {
  return status == nullptr ? BP_STATUS_OK : reinterpret_cast<const KvStatus*>(status)->code;
}

const char* KvBridge::status_message(const bp_status* status) {
  return status == nullptr ? "" : reinterpret_cast<const KvStatus*>(status)->message.c_str();
}

void KvBridge::status_free(bp_status* status) {
  std::unique_ptr<KvStatus> owned(reinterpret_cast<KvStatus*>(status));
}

}  // namespace backplane::remote::server
