// The bp_kv_store a hosted communicator gets: each set/get/wait becomes a
// KvRequest to the client over the session's connection (Sender::kv), so a
// job's rendezvous stays with the job's own store, wherever its devices are.
// Lives as long as the communicator (abi.h: valid until comm_destroy).
#ifndef BACKPLANE_REMOTE_SERVER_KV_BRIDGE_HPP_
#define BACKPLANE_REMOTE_SERVER_KV_BRIDGE_HPP_

#include "remote/server/sender.hpp"

#include <backplane/abi.h>

#include <chrono>

namespace backplane::remote::server {

class KvBridge {
 public:
  // `fallback_timeout` is used for a set that names none (the communicator's timeout).
  KvBridge(Sender& sender, std::chrono::milliseconds fallback_timeout);
  KvBridge(const KvBridge&) = delete;
  KvBridge& operator=(const KvBridge&) = delete;

  // The table handed to comm_create; its ctx is this object.
  const bp_kv_store* store() const noexcept { return &store_; }

 private:
  static bp_status* set(bp_kv_set_args* args);
  static bp_status* get(bp_kv_get_args* args);
  static bp_status* wait(bp_kv_wait_args* args);
  static void free_value(void* ctx, uint8_t* value);
  static int32_t status_code(const bp_status* status);
  static const char* status_message(const bp_status* status);
  static void status_free(bp_status* status);

  KvResult call(KvCall c);

  Sender& sender_;
  std::chrono::milliseconds fallback_timeout_;
  bp_kv_store store_{};
};

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_KV_BRIDGE_HPP_
