// The NCCL unique-id exchange and the bounded non-blocking join (comm_setup.hpp).
#include "comm_setup.hpp"

#include <backplane/plugin/status.hpp>

#include <algorithm>
#include <thread>

namespace backplane::cuda {
namespace {

using plugin::fail;
using plugin::Failure;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The store's status as a Failure: its code where it is one a caller acts on.
[[noreturn]] void store_fail(const bp_kv_store& kv, bp_status* status, const std::string& what) {
  const int32_t code = kv.status_code(status);
  const char* text = kv.status_message(status);
  std::string message = what + ": " + (text != nullptr && *text != '\0' ? text : "the store gave no reason");
  kv.status_free(status);
  fail(code == BP_STATUS_TIMEOUT         ? BP_STATUS_TIMEOUT
       : code == BP_STATUS_OUT_OF_MEMORY ? BP_STATUS_OUT_OF_MEMORY
                                         : BP_STATUS_IO,
       std::move(message));
}

std::string rank_text(const CommSetup& s) {
  return "rank " + std::to_string(s.rank) + " of " + std::to_string(s.size);
}

}  // namespace

std::string unique_id_key(const std::string& key_prefix) { return key_prefix + "nccl/unique_id"; }

void store_set(const bp_kv_store& kv, const std::string& key, const void* data, uint64_t size) {
  bp_kv_set_args args{};
  args.struct_size = BP_KV_SET_ARGS_STRUCT_SIZE;
  args.ctx = kv.ctx;
  args.key = key.c_str();
  args.value = data;
  args.size = size;
  if (bp_status* s = kv.set(&args)) store_fail(kv, s, "setting \"" + key + "\" in the store");
}

std::vector<uint8_t> store_get(const bp_kv_store& kv, const std::string& key, int64_t timeout_ms) {
  bp_kv_get_args args{};
  args.struct_size = BP_KV_GET_ARGS_STRUCT_SIZE;
  args.ctx = kv.ctx;
  args.key = key.c_str();
  args.timeout_ms = timeout_ms;
  bp_status* s = kv.get(&args);
  if (s != nullptr) {
    if (args.value != nullptr) kv.free_value(kv.ctx, args.value);
    store_fail(kv, s, "getting \"" + key + "\" from the store");
  }
  std::vector<uint8_t> value(args.value, args.value + args.size);
  if (args.value != nullptr) kv.free_value(kv.ctx, args.value);
  return value;
}

std::string missing_store_entries(const bp_kv_store& kv) {
  std::string missing;
  auto need = [&](bool present, const char* name) {
    if (!present) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  const bool sized = BP_HAS_FIELD(bp_kv_store, status_free, kv.struct_size);
  need(sized && kv.set != nullptr, "set");
  need(sized && kv.get != nullptr, "get");
  need(sized && kv.free_value != nullptr, "free_value");
  need(sized && kv.status_code != nullptr, "status_code");
  need(sized && kv.status_message != nullptr, "status_message");
  need(sized && kv.status_free != nullptr, "status_free");
  return missing;
}

void establish_comm(const bp_kv_store& store, const CommSetup& s, CommInit& init) {
  const auto start = Clock::now();
  const auto deadline = start + milliseconds(std::max<int64_t>(s.timeout_ms, 1));
  const std::string key = unique_id_key(s.key_prefix);
  const std::string who = "comm_create on " + rank_text(s);
  try {
    std::vector<uint8_t> id;
    if (s.rank == 0) {
      id = init.make_id();
      store_set(store, key, id.data(), id.size());
    } else {
      const int64_t left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      try {
        id = store_get(store, key, std::max<int64_t>(left, 1));
      } catch (const Failure& f) {
        if (f.code() != BP_STATUS_TIMEOUT) throw;
        fail(BP_STATUS_TIMEOUT, who + ": waited " + std::to_string(s.timeout_ms) +
                                    " ms for rank 0's NCCL unique id under \"" + key +
                                    "\"; rank 0 never published it: check that every rank started and "
                                    "joins the same group (" +
                                    f.what() + ")");
      }
      if (id.size() != init.id_bytes())
        fail(BP_STATUS_COLLECTIVE, who + ": the NCCL unique id under \"" + key + "\" has " +
                                       std::to_string(id.size()) + " bytes, not " +
                                       std::to_string(init.id_bytes()) +
                                       "; another program (or another NCCL version) shares this key prefix");
    }
    init.start(id, s.rank, s.size);
    // Poll the non-blocking init: every millisecond at first, then every 10 ms.
    auto pause = std::chrono::microseconds(200);
    for (;;) {
      std::string error;
      const Progress p = init.poll(error);
      if (p == Progress::done) return;
      if (p == Progress::failed)
        fail(BP_STATUS_COLLECTIVE, who + ": NCCL initialisation failed: " + error +
                                       " (set NCCL_DEBUG=INFO for NCCL's own account)");
      if (Clock::now() >= deadline)
        fail(BP_STATUS_TIMEOUT,
             who + ": NCCL initialisation did not finish within " + std::to_string(s.timeout_ms) +
                 " ms, so it was aborted: every rank must call comm_create for the same "
                 "group; a slow network needs a longer timeout (NCCL_DEBUG=INFO says more)");
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, milliseconds(10));
    }
  } catch (...) {
    init.abort();
    throw;
  }
}

}  // namespace backplane::cuda
