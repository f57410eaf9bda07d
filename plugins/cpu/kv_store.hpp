// The host's key-value store (bp_kv_store) as the collectives use it: calls
// whose failure statuses become StoreFailure exceptions, the key-value
// exchange a transport sets itself up through, and the board where a failing
// rank leaves its error for its peers. Every status the store returns is freed
// here, with its own status_free.
#ifndef BACKPLANE_PLUGINS_CPU_KV_STORE_HPP_
#define BACKPLANE_PLUGINS_CPU_KV_STORE_HPP_

#include <backplane/abi.h>

#include <backplane/plugin.hpp>
#include <chrono>
#include <cstdint>
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

// Checks that a store has every entry this plugin calls; "" when it does,
// else what is missing.
std::string missing_store_entries(const bp_kv_store& kv);

// What a transport exchanges with its peers while it sets itself up: values
// under keys relative to the communicator's prefix, each set by one rank and
// read by the others. Every call throws StoreFailure, naming keys as the
// caller did.
class KeyValueExchange {
 public:
  virtual ~KeyValueExchange() = default;

  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  // Blocks until every key is set.
  virtual void wait(const std::vector<std::string>& keys) = 0;
  // The value of a key that is set (wait for it first).
  virtual std::vector<char> get(const std::string& key) = 0;
};

// The exchange over the host's store: keys get `prefix`, and every call
// shares one deadline.
class StoreExchange final : public KeyValueExchange {
 public:
  StoreExchange(const bp_kv_store& kv, std::string prefix, std::chrono::steady_clock::time_point deadline);

  void set(const std::string& key, const std::vector<char>& value) override;
  void wait(const std::vector<std::string>& keys) override;
  std::vector<char> get(const std::string& key) override;

 private:
  int64_t remaining_ms(const char* operation, const std::vector<std::string>& keys) const;

  const bp_kv_store& kv_;
  const std::string prefix_;
  const std::chrono::steady_clock::time_point deadline_;
};

// The rank a setup key belongs to, or -1: a key ending in "/<r>" or "_<r>",
// or that is "<r>" (Gloo's full-mesh connect uses "rank_<r>" and "<r>").
int32_t rank_of_key(const std::string& key, int32_t size);

// A StoreFailure during comm_create's `stage` ("rendezvous"), as the status
// to return: a wait on another rank's key that timed out names that rank.
// `where` is "comm_create on rank 0 of 2", `prefix` the store's key prefix.
plugin::Failure setup_failure(const StoreFailure& f, const std::string& where, const char* stage,
                              const std::string& prefix, int32_t size, std::chrono::milliseconds timeout);

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
