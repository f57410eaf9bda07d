// The host's key-value store (bp_kv_store) as the collectives use it: calls
// whose failure statuses become StoreFailure exceptions, Gloo's rendezvous
// store on top of it, and the board where a failing rank leaves its error for
// its peers. Every status the store returns is freed here, with its own
// status_free.
#ifndef BACKPLANE_PLUGINS_CPU_KV_STORE_HPP_
#define BACKPLANE_PLUGINS_CPU_KV_STORE_HPP_

#include <backplane/abi.h>
#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace backplane::cpu {

// A store call that failed: its status code (TIMEOUT, OUT_OF_MEMORY, or IO
// for any other), what was asked and the store's own message.
struct StoreFailure {
  bp_status_code code;
  std::string operation;          // "set", "get", "wait"
  std::vector<std::string> keys;  // as the caller named them
  std::string detail;             // the store's message
};

// Zeroes the unused bytes of each Gloo TCP address in an address list that
// Gloo's full-mesh connect publishes (see kv_store.cpp); leaves a value of
// another shape as it is.
void zero_address_padding(std::vector<char>& value);

// Checks that a store has every entry this plugin calls; "" when it does,
// else what is missing.
std::string missing_store_entries(const bp_kv_store& kv);

// Gloo's rendezvous store over the host's: keys get `prefix`, and every call
// shares one deadline (the timeouts Gloo passes are ignored). Throws
// StoreFailure naming keys without the prefix.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(const bp_kv_store& kv, std::string prefix, std::chrono::steady_clock::time_point deadline);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // Values read so far, by key (the address lists of ranks already joined).
  const std::map<std::string, std::vector<char>>& seen() const noexcept { return seen_; }

 private:
  int64_t remaining_ms(const char* operation, const std::vector<std::string>& keys) const;

  const bp_kv_store& kv_;
  const std::string prefix_;
  const std::chrono::steady_clock::time_point deadline_;
  std::map<std::string, std::vector<char>> seen_;
};

// Where a failing rank leaves its error ("<prefix>failed/<rank>") before it
// closes its connections, so that a peer which sees them close can report the
// root cause rather than only "rank 2 closed". Best effort and bounded: the
// store may be what failed, so publish waits at most 2 s for it (the set's
// timeout_ms, ABI 2.1). Safe from any thread.
class FailureBoard {
 public:
  FailureBoard() = default;  // a group of one: nothing to tell
  FailureBoard(const bp_kv_store* kv, std::string prefix) : kv_(kv), prefix_(std::move(prefix)) {}

  void publish(int32_t rank, const std::string& message) const noexcept;
  // The error `peer` published, or "" (it published none, or the store failed).
  std::string read(int32_t peer) const noexcept;

 private:
  const bp_kv_store* kv_ = nullptr;
  std::string prefix_;
};

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_KV_STORE_HPP_
