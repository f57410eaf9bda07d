// A session's communicators: comm_create (its rendezvous through the
// client's store, KvBridge), comm_destroy, the collectives, and comm_abort,
// which any thread may call at any time (session.hpp).
#include "remote/server/messages.hpp"
#include "remote/server/session.hpp"
#include "remote/server/session_internal.hpp"
#include "remote/server/validate.hpp"

#include <chrono>
#include <utility>
#include <vector>

namespace backplane::remote::server {

std::shared_ptr<Session::Comm> Session::find_comm(uint64_t id) {
  std::lock_guard lock(comms_mutex_);
  const auto it = comms_.find(id);
  return it == comms_.end() ? nullptr : it->second;
}

void Session::comm_create(uint64_t id, const wire::CommCreate& r) {
  if (sticky_) {  // the job's earlier work failed: say so instead of joining a group
    auto [c, t] = outcome(BP_STATUS_OK, "");
    sender_.send(encode_reply(id, c, t));
    return;
  }
  const HostedDevice& dev = device(r.device());
  if (!dev.has(BP_CAP_COLLECTIVE) || api_.comm_create == nullptr)
    refuse("device " + std::to_string(r.device()) + " of backend '" + hosted_->backend_name() +
               "' has no 'collective' capability",
           BP_STATUS_UNSUPPORTED);
  if (r.comm() == 0) refuse("communicator id 0 is not valid (the client's ids are nonzero)");
  if (find_comm(r.comm()) != nullptr)
    refuse("communicator id " + std::to_string(r.comm()) + " is already in use in this session");
  {
    std::lock_guard lock(comms_mutex_);
    if (comms_.size() >= kMaxCommsPerSession)
      refuse(
          "this session already has " + std::to_string(comms_.size()) + " communicators, the server's limit",
          BP_STATUS_OUT_OF_MEMORY);
  }
  if (r.world_size() < 1 || r.world_size() > kMaxWorldSize)
    refuse("world_size " + std::to_string(r.world_size()) + " is outside 1.." +
           std::to_string(kMaxWorldSize));
  if (r.rank() < 0 || r.rank() >= r.world_size())
    refuse("rank " + std::to_string(r.rank()) + " is outside 0.." + std::to_string(r.world_size() - 1));
  constexpr int64_t kMaxTimeoutMs = int64_t{365} * 24 * 3600 * 1000;
  if (r.timeout_ms() <= 0 || r.timeout_ms() > kMaxTimeoutMs)
    refuse("timeout_ms " + std::to_string(r.timeout_ms()) + " is outside 1.." +
           std::to_string(kMaxTimeoutMs));
  const flatbuffers::String* prefix = r.key_prefix();
  if (prefix == nullptr) refuse("key_prefix is missing");
  if (prefix->size() > kMaxKeyPrefixBytes || prefix->string_view().find('\0') != std::string_view::npos)
    refuse("key_prefix is longer than " + std::to_string(kMaxKeyPrefixBytes) + " bytes or holds a NUL byte");

  auto comm = std::make_shared<Comm>();
  comm->device = r.device();
  comm->world_size = r.world_size();
  comm->kv = std::make_unique<KvBridge>(sender_, std::chrono::milliseconds(r.timeout_ms()));
  bp_comm_create_args a{};
  a.struct_size = BP_COMM_CREATE_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.device = r.device();
  a.rank = r.rank();
  a.world_size = r.world_size();
  a.timeout_ms = r.timeout_ms();
  a.store = comm->kv->store();
  a.key_prefix = prefix->c_str();
  check(PluginStatus(api_, api_.comm_create(&a)));  // blocks until every rank joined
  comm->handle = a.comm;
  {
    std::lock_guard lock(comms_mutex_);
    comms_.emplace(r.comm(), comm);
  }
  ++counters_.comms;
  auto [c, t] = outcome(BP_STATUS_OK, "");
  sender_.send(encode_reply(id, c, t));
}

// The communicator is out of the table already, so no new abort can start;
// the ones running finish before comm_destroy (abi.h: never concurrent).
void Session::destroy_comm(const std::shared_ptr<Comm>& comm) noexcept {
  {
    std::unique_lock lock(comms_mutex_);
    comms_idle_.wait(lock, [&] { return comm->aborting == 0; });
  }
  --counters_.comms;
  bp_comm_args a{};
  a.struct_size = BP_COMM_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.comm = comm->handle;
  PluginStatus s(api_, api_.comm_destroy(&a));
}

void Session::comm_destroy(uint64_t id, const wire::CommDestroy& r) {
  std::shared_ptr<Comm> comm;
  {
    std::lock_guard lock(comms_mutex_);
    const auto it = comms_.find(r.comm());
    if (it != comms_.end()) {
      comm = std::move(it->second);
      comms_.erase(it);
    }
  }
  if (!comm) refuse("communicator " + std::to_string(r.comm()) + " is not a communicator of this session");
  destroy_comm(comm);
  auto [c, t] = outcome(BP_STATUS_OK, "");
  sender_.send(encode_reply(id, c, t));
}

void Session::collective(uint64_t id, const wire::Collective& r) {
  const std::shared_ptr<Comm> comm = find_comm(r.comm());
  if (!comm) refuse("communicator " + std::to_string(r.comm()) + " is not a communicator of this session");
  const BufferLookup lookup = [this](uint64_t buffer) -> std::optional<OwnedBuffer> {
    const auto it = buffers_.find(buffer);
    if (it == buffers_.end()) return std::nullopt;
    return OwnedBuffer{it->second.handle, it->second.size, it->second.device};
  };
  DecodedTensor in_d, out_d;
  const bp_tensor* in = nullptr;
  const bp_tensor* out = nullptr;
  if (r.input() != nullptr) {
    decode_tensor(r.input(), comm->device, lookup, "input", in_d);
    in = &in_d.tensor;
  }
  if (r.output() != nullptr) {
    decode_tensor(r.output(), comm->device, lookup, "output", out_d);
    out = &out_d.tensor;
  }
  validate_collective(r.kind(), in, out, r.reduce_op(), r.root(), comm->world_size);
  const HostedDevice& dev = hosted_->devices()[static_cast<std::size_t>(comm->device)];
  for (const bp_tensor* t : {in, out})
    if (t != nullptr && !dev.holds(t->dtype))
      refuse("device " + std::to_string(comm->device) + " does not hold " + dtype_text(t->dtype) + " tensors",
             BP_STATUS_UNSUPPORTED);
  bp_status* (*entry)(bp_collective_args*) = nullptr;
  switch (r.kind()) {
    case wire::CollectiveKind::AllReduce:
      entry = api_.all_reduce;
      break;
    case wire::CollectiveKind::Broadcast:
      entry = api_.broadcast;
      break;
    case wire::CollectiveKind::AllGather:
      entry = api_.all_gather;
      break;
    case wire::CollectiveKind::ReduceScatter:
      entry = api_.reduce_scatter;
      break;
    case wire::CollectiveKind::Barrier:
      entry = api_.barrier;
      break;
  }
  if (entry == nullptr)
    refuse("backend '" + hosted_->backend_name() + "' has no " + collective_text(r.kind()),
           BP_STATUS_UNSUPPORTED);
  bp_collective_args a{};
  a.struct_size = BP_COLLECTIVE_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.comm = comm->handle;
  a.input = in;
  a.output = out;
  a.reduce_op = r.reduce_op();
  a.root = r.root();
  check(PluginStatus(api_, entry(&a)));
  auto [c, t] = outcome(BP_STATUS_OK, "");
  sender_.send(encode_reply(id, c, t));
}

void Session::abort(uint64_t comm_id) noexcept {
  std::shared_ptr<Comm> comm;
  {
    std::lock_guard lock(comms_mutex_);
    const auto it = comms_.find(comm_id);
    if (it == comms_.end()) return;
    comm = it->second;
    ++comm->aborting;
  }
  bp_comm_args a{};
  a.struct_size = BP_COMM_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.comm = comm->handle;
  PluginStatus s(api_, api_.comm_abort(&a));
  {
    std::lock_guard lock(comms_mutex_);
    --comm->aborting;
  }
  comms_idle_.notify_all();
}

void Session::abort_all() noexcept {
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(comms_mutex_);
    for (const auto& [id, comm] : comms_) ids.push_back(id);
  }
  for (const uint64_t id : ids) abort(id);
}

}  // namespace backplane::remote::server
