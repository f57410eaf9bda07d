// The cpu plugin's side of the host's key-value store, against a recording
// store: publishing a failure asks for a bounded set (ABI 2.1's timeout_ms),
// so a hung store host cannot hold a failing rank for the store's whole
// timeout; the values it writes are exactly the message. And what a failed
// setup says: the rank a setup key belongs to, named when it never came.
#include "cpu/kv_store.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace {

struct Recorder {
  std::map<std::string, std::string> values;
  std::vector<int64_t> set_timeouts;
  std::vector<std::size_t> set_struct_sizes;
};

bp_status* record_set(bp_kv_set_args* args) {
  auto* r = static_cast<Recorder*>(args->ctx);
  r->set_struct_sizes.push_back(args->struct_size);
  r->set_timeouts.push_back(BP_HAS_FIELD(bp_kv_set_args, timeout_ms, args->struct_size) ? args->timeout_ms
                                                                                        : -1);
  r->values[args->key] = std::string(static_cast<const char*>(args->value), args->size);
  return nullptr;
}
bp_status* never_get(bp_kv_get_args*) { return nullptr; }
bp_status* never_wait(bp_kv_wait_args*) { return nullptr; }
void free_value(void*, uint8_t*) {}
int32_t status_code(const bp_status*) { return BP_STATUS_IO; }
const char* status_message(const bp_status*) { return ""; }
void status_free(bp_status*) {}

bp_kv_store recording_store(Recorder& r) {
  bp_kv_store kv{};
  kv.struct_size = BP_KV_STORE_STRUCT_SIZE;
  kv.ctx = &r;
  kv.set = record_set;
  kv.get = never_get;
  kv.wait = never_wait;
  kv.free_value = free_value;
  kv.status_code = status_code;
  kv.status_message = status_message;
  kv.status_free = status_free;
  return kv;
}

}  // namespace

TEST_CASE("kv store: publishing a failure is one bounded set of exactly the message") {
  Recorder r;
  const bp_kv_store kv = recording_store(r);
  const backplane::cpu::FailureBoard board(&kv, "job/g0/");
  board.publish(2, "rank 2: all_reduce timed out");
  REQUIRE(r.set_timeouts.size() == 1);
  CHECK(r.set_struct_sizes[0] == BP_KV_SET_ARGS_STRUCT_SIZE);
  CHECK(r.set_timeouts[0] > 0);      // bounded...
  CHECK(r.set_timeouts[0] <= 5000);  // ...and short, whatever the store's own timeout
  CHECK(r.values.at("job/g0/failed/2") == "rank 2: all_reduce timed out");
}

TEST_CASE("kv store: a setup key names the rank it belongs to") {
  using backplane::cpu::rank_of_key;
  CHECK(rank_of_key("rank_1", 4) == 1);  // Gloo's host name
  CHECK(rank_of_key("3", 4) == 3);       // Gloo's address list
  CHECK(rank_of_key("conn/2", 4) == 2);
  CHECK(rank_of_key("shm/host/0", 4) == 0);
  CHECK(rank_of_key("shm/ready/3", 4) == 3);
  CHECK(rank_of_key("shm/segment", 4) == -1);
  CHECK(rank_of_key("4", 4) == -1);  // not a rank of the group
  CHECK(rank_of_key("x1", 4) == -1);
  CHECK(rank_of_key("", 4) == -1);
}

TEST_CASE("kv store: a setup that times out waiting on a rank's key names that rank") {
  using backplane::cpu::setup_failure;
  using backplane::cpu::StoreFailure;
  const std::chrono::milliseconds timeout(1500);
  const auto joined =
      setup_failure(StoreFailure{BP_STATUS_TIMEOUT, "wait", {"shm/ready/2"}, "timed out"},
                    "comm_create on rank 0 of 4", "shared-memory setup", "job/cpu.gloo/", 4, timeout);
  CHECK(joined.code() == BP_STATUS_TIMEOUT);
  CHECK(std::string(joined.what()) ==
        "comm_create on rank 0 of 4: shared-memory setup: rank 2 did not join within 1500 ms (did it start, "
        "and call comm_create with the same world size and key prefix?) [store: timed out]");
  const auto connecting = setup_failure(StoreFailure{BP_STATUS_TIMEOUT, "wait", {"conn/1"}, "timed out"},
                                        "comm_create on rank 0 of 2", "exchanging connection addresses",
                                        "job/cpu.gloo/", 2, timeout);
  CHECK(std::string(connecting.what()).find("rank 1 did not finish connecting within 1500 ms") !=
        std::string::npos);
  // A failed set is the store's fault, not a missing rank's: it names the key in full.
  const auto set =
      setup_failure(StoreFailure{BP_STATUS_IO, "set", {"shm/host/0"}, "connection refused"},
                    "comm_create on rank 0 of 2", "shared-memory setup", "job/cpu.gloo/", 2, timeout);
  CHECK(set.code() == BP_STATUS_IO);
  CHECK(std::string(set.what()) ==
        "comm_create on rank 0 of 2: shared-memory setup: the key-value store failed to set "
        "\"job/cpu.gloo/shm/host/0\" [store: connection refused]");
}
