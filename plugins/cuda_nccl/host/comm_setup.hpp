// How the cuda plugin joins a communicator, without CUDA or NCCL in sight so
// that the CPU tests can run it with a fake: rank 0 makes the NCCL unique id
// and sets it in the host's key-value store, the others get it, then every
// rank starts a non-blocking init and polls it against the communicator's
// timeout, aborting it when the time is up. CommInit is the seam: the plugin
// implements it with ncclGetUniqueId / ncclCommInitRankConfig (blocking off) /
// ncclCommGetAsyncError / ncclCommAbort; the tests with a fake.
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_HOST_COMM_SETUP_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_HOST_COMM_SETUP_HPP_

#include <backplane/abi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace backplane::cuda {

// The state of a non-blocking operation (NCCL: ncclSuccess / ncclInProgress /
// anything else).
enum class Progress { done, pending, failed };

class CommInit {
 public:
  virtual ~CommInit() = default;
  // Bytes of the unique id (NCCL_UNIQUE_ID_BYTES).
  virtual std::size_t id_bytes() const = 0;
  // Rank 0 only: a fresh unique id. Throws plugin::Failure.
  virtual std::vector<uint8_t> make_id() = 0;
  // Starts joining the group; returns without waiting for the peers.
  virtual void start(const std::vector<uint8_t>& id, int32_t rank, int32_t size) = 0;
  // Where the join stands; on failed, `error` says why.
  virtual Progress poll(std::string& error) = 0;
  // Gives up the join (or the communicator); safe after any of the above.
  virtual void abort() noexcept = 0;
};

struct CommSetup {
  int32_t rank = 0;
  int32_t size = 1;
  int64_t timeout_ms = 0;  // the whole join: store exchange and init together
  std::string key_prefix;  // the host's namespace for this communicator
};

// The store key of the unique id (under the prefix).
std::string unique_id_key(const std::string& key_prefix);

// Exchanges the id and joins; returns once init is done. On any failure (a
// store error, the deadline, init failing) init.abort() has been called and a
// plugin::Failure names the rank, the stage and what to do: TIMEOUT when time
// ran out, COLLECTIVE when NCCL failed, IO (or the store's code) when the
// store did.
void establish_comm(const bp_kv_store& store, const CommSetup& setup, CommInit& init);

// The host's store, with its statuses turned into plugin::Failure (and freed
// with the store's own status_free).
void store_set(const bp_kv_store& kv, const std::string& key, const void* data, uint64_t size);
std::vector<uint8_t> store_get(const bp_kv_store& kv, const std::string& key, int64_t timeout_ms);
// "" when the store has every entry this plugin calls, else what is missing.
std::string missing_store_entries(const bp_kv_store& kv);

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_HOST_COMM_SETUP_HPP_
