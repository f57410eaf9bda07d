// The remote backend plugin (libbackplane_remote): the devices that
// `backplane serve` endpoints host, as local devices remote:0, remote:1, ...
// in endpoint order. create() only parses options; device_count() connects.
// Every device is asynchronous: allocations, writes, ops and frees are
// pipelined; reads, synchronize, memory queries and collectives wait.
#include <backplane/plugin.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "plugins/remote/connection.hpp"
#include "plugins/remote/options.hpp"

namespace backplane::remote::client {
namespace {

using plugin::fail;

// What bp_buffer* points to: the server's id for the buffer and where it lives.
struct RemoteBuffer {
  static constexpr uint64_t kMagic = 0x62705f72656d6f74;  // "bp_remot"
  uint64_t magic = kMagic;
  Connection* connection = nullptr;
  uint64_t id = 0;
  uint64_t size = 0;
  int32_t device = 0;  // the plugin's index (remote:N)
};

// What bp_comm* points to.
struct RemoteComm {
  Connection* connection = nullptr;
  uint64_t id = 0;
  int32_t device = 0;
  int64_t timeout_ms = 0;
};

// One local device: a server device behind a connection.
struct Slot {
  Connection* connection = nullptr;
  int32_t server_device = 0;
  const ServerDevice* desc = nullptr;
  plugin::DeviceInfo info;
};

class RemotePlugin {
 public:
  using Features = plugin::Features<plugin::Feature::device_memory, plugin::Feature::synchronize,
                                    plugin::Feature::collectives>;

  explicit RemotePlugin(const plugin::CreateArgs& args) : options_(parse_options(args.options_json)) {
    token_ = read_token(options_);
    if (!options_.tls_ca.empty()) {
      try {
        tls_ = wire::client_tls_context(options_.tls_ca);
      } catch (const std::exception& e) {
        fail(BP_STATUS_INVALID_ARGUMENT, std::string("remote: option \"tls_ca\": ") + e.what());
      }
    }
  }

  // Connects to every endpoint at once (each bounded by connect_timeout_ms);
  // all or nothing, so device numbers never depend on which server answered.
  int32_t device_count() {
    std::lock_guard<std::mutex> lock(connect_mutex_);
    if (!ready_.load(std::memory_order_acquire)) connect_all();
    return static_cast<int32_t>(slots_.size());
  }

  plugin::DeviceInfo device_info(int32_t device) { return slot(device).info; }

  bool supports_op(int32_t device, int32_t op, int32_t dtype) {
    if (!ready_.load(std::memory_order_acquire) || device < 0 ||
        static_cast<std::size_t>(device) >= slots_.size())
      return false;
    return slots_[static_cast<std::size_t>(device)].desc->supports(op, dtype);
  }

  plugin::MemoryInfo device_memory(int32_t device) {
    const Slot& s = slot(device);
    const auto [free_bytes, total_bytes] = s.connection->memory(s.server_device);
    return {free_bytes, total_bytes};
  }

  bp_buffer* buffer_alloc(int32_t device, uint64_t size) {
    const Slot& s = slot(device);
    auto buffer = std::make_unique<RemoteBuffer>();
    buffer->connection = s.connection;
    buffer->id = s.connection->new_object_id();
    buffer->size = size;
    buffer->device = device;
    // Pipelined: a failure (out of memory, over the session's limits) surfaces
    // at the next synchronising call, naming buffer_alloc.
    s.connection->alloc(buffer->id, s.server_device, size);
    return reinterpret_cast<bp_buffer*>(buffer.release());
  }

  void buffer_free(bp_buffer* buffer) {
    if (buffer == nullptr) return;
    std::unique_ptr<RemoteBuffer> owned(live(buffer, "buffer_free"));
    owned->connection->free(owned->id);
  }

  void buffer_write(bp_buffer* buffer, uint64_t offset, const void* src, uint64_t size) {
    const RemoteBuffer* b = live(buffer, "buffer_write");
    b->connection->write(b->id, offset, src, size);
  }

  void buffer_read(bp_buffer* buffer, uint64_t offset, void* dst, uint64_t size) {
    const RemoteBuffer* b = live(buffer, "buffer_read");
    b->connection->read(b->id, offset, dst, size);
  }

  void execute(const bp_execute_args& args) {
    const Slot& s = slot(args.device);
    const char* name = bp_op_name(args.op) != nullptr ? bp_op_name(args.op) : "op";
    std::vector<Operand> inputs(static_cast<std::size_t>(std::max(args.num_inputs, 0)));
    std::vector<Operand> outputs(static_cast<std::size_t>(std::max(args.num_outputs, 0)));
    for (std::size_t i = 0; i < inputs.size(); ++i)
      inputs[i] = operand(args.inputs[i], args.device, name, "inputs", i);
    for (std::size_t i = 0; i < outputs.size(); ++i)
      outputs[i] = operand(args.outputs[i], args.device, name, "outputs", i);
    s.connection->execute(s.server_device, args.op, inputs, outputs, *args.attrs);
  }

  void synchronize(int32_t device) {
    const Slot& s = slot(device);
    s.connection->synchronize(s.server_device);
  }

  bp_comm* comm_create(const bp_comm_create_args& a) {
    const Slot& s = slot(a.device);
    if ((s.info.capabilities & BP_CAP_COLLECTIVE) == 0)
      fail(BP_STATUS_UNSUPPORTED, "remote: comm_create: remote:" + std::to_string(a.device) + " (device " +
                                      std::to_string(s.server_device) + " of server " +
                                      s.connection->endpoint() + ") does not declare 'collective'");
    if (a.store == nullptr) fail(BP_STATUS_INVALID_ARGUMENT, "remote: comm_create: no key-value store given");
    auto comm = std::make_unique<RemoteComm>();
    comm->connection = s.connection;
    comm->id = s.connection->new_object_id();
    comm->device = a.device;
    comm->timeout_ms = a.timeout_ms;
    s.connection->comm_create(comm->id, s.server_device, a.rank, a.world_size, a.timeout_ms,
                              a.key_prefix != nullptr ? a.key_prefix : "", a.store);
    return reinterpret_cast<bp_comm*>(comm.release());
  }

  void comm_destroy(bp_comm* comm) {
    if (comm == nullptr) return;
    std::unique_ptr<RemoteComm> owned(reinterpret_cast<RemoteComm*>(comm));
    owned->connection->comm_destroy(owned->id);
  }

  void comm_abort(bp_comm* comm) {
    const RemoteComm* c = reinterpret_cast<RemoteComm*>(comm);
    c->connection->comm_abort(c->id);
  }

  void all_reduce(bp_comm* comm, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op) {
    const RemoteComm* c = reinterpret_cast<RemoteComm*>(comm);
    const Operand i = operand(in, c->device, "all_reduce", "input", 0);
    const Operand o = operand(out, c->device, "all_reduce", "output", 0);
    c->connection->collective(c->id, wire::CollectiveKind::AllReduce, &i, &o, op, 0, c->timeout_ms);
  }

  void broadcast(bp_comm* comm, const bp_tensor& tensor, int32_t root) {
    const RemoteComm* c = reinterpret_cast<RemoteComm*>(comm);
    const Operand t = operand(tensor, c->device, "broadcast", "output", 0);
    c->connection->collective(c->id, wire::CollectiveKind::Broadcast, nullptr, &t, 0, root, c->timeout_ms);
  }

  void all_gather(bp_comm* comm, const bp_tensor& in, const bp_tensor& out) {
    const RemoteComm* c = reinterpret_cast<RemoteComm*>(comm);
    const Operand i = operand(in, c->device, "all_gather", "input", 0);
    const Operand o = operand(out, c->device, "all_gather", "output", 0);
    c->connection->collective(c->id, wire::CollectiveKind::AllGather, &i, &o, 0, 0, c->timeout_ms);
  }

  void reduce_scatter(bp_comm* comm, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op) {
    const RemoteComm* c = reinterpret_cast<RemoteComm*>(comm);
    const Operand i = operand(in, c->device, "reduce_scatter", "input", 0);
    const Operand o = operand(out, c->device, "reduce_scatter", "output", 0);
    c->connection->collective(c->id, wire::CollectiveKind::ReduceScatter, &i, &o, op, 0, c->timeout_ms);
  }

  void barrier(bp_comm* comm) {
    const RemoteComm* c = reinterpret_cast<RemoteComm*>(comm);
    c->connection->collective(c->id, wire::CollectiveKind::Barrier, nullptr, nullptr, 0, 0, c->timeout_ms);
  }

 private:
  ConnectionSettings settings_for(const std::string& endpoint) const {
    ConnectionSettings s;
    s.endpoint = endpoint;
    s.token = token_;
    if (!options_.token_file.empty())
      s.token_source = "the token comes from the file '" + options_.token_file + "' (option \"token_file\")";
    else if (token_.empty())
      s.token_source = "put the server's token into the environment variable " + options_.token_env +
                       " (option \"token_env\"), or name a file holding it with option \"token_file\"";
    else
      s.token_source =
          "the token comes from the environment variable " + options_.token_env + " (option \"token_env\")";
    s.tls = tls_.get();
    s.tls_server_name = options_.tls_server_name;
    s.connect_timeout = milliseconds(options_.connect_timeout_ms);
    s.request_timeout = milliseconds(options_.request_timeout_ms);
    s.heartbeat = milliseconds(options_.heartbeat_ms);
    s.max_coalesce_bytes = options_.max_coalesce_bytes;
    s.client_version = BACKPLANE_VERSION;
    return s;
  }

  void connect_all() {
    const std::size_t n = options_.endpoints.size();
    std::vector<std::unique_ptr<Connection>> connections;
    for (const auto& endpoint : options_.endpoints)
      connections.push_back(std::make_unique<Connection>(settings_for(endpoint)));
    std::vector<std::string> errors(n);
    const auto open = [&](std::size_t i) {
      try {
        connections[i]->open();
      } catch (const plugin::Failure& e) {
        errors[i] = e.what();
      } catch (const std::exception& e) {
        errors[i] = "cannot connect to " + options_.endpoints[i] + ": " + e.what();
      }
    };
    if (n == 1) {
      open(0);
    } else {
      std::vector<std::thread> threads;
      for (std::size_t i = 0; i < n; ++i) threads.emplace_back(open, i);
      for (auto& t : threads) t.join();
    }
    std::string failed;
    for (const auto& e : errors)
      if (!e.empty()) failed += (failed.empty() ? "" : "; ") + e;
    if (!failed.empty()) fail(BP_STATUS_UNAVAILABLE, "remote: " + failed);

    std::vector<Slot> slots;
    for (const auto& c : connections) {
      const ServerInfo& server = c->info();
      for (std::size_t d = 0; d < server.devices.size(); ++d) {
        const ServerDevice& desc = server.devices[d];
        Slot s;
        s.connection = c.get();
        s.server_device = static_cast<int32_t>(d);
        s.desc = &desc;
        s.info.name = desc.name + " @ " + c->endpoint();
        // The server's flags, plus remote and async; its memory is never host memory here.
        s.info.capabilities = (desc.capabilities | BP_CAP_REMOTE | BP_CAP_ASYNC) & ~BP_CAP_HOST_VISIBLE;
        for (const auto& [k, v] : desc.attributes) s.info.attributes.emplace_back("server." + k, v);
        s.info.attributes.emplace_back("endpoint", c->endpoint());
        s.info.attributes.emplace_back("server_device", std::to_string(d));
        s.info.attributes.emplace_back("server_backend", server.backend);
        s.info.attributes.emplace_back("server_version", server.server_version);
        s.info.attributes.emplace_back("protocol", std::to_string(server.protocol));
        s.info.attributes.emplace_back("tls", c->tls() ? "yes" : "no");
        slots.push_back(std::move(s));
      }
    }
    if (slots.size() > kMaxServerDevices)
      fail(BP_STATUS_UNAVAILABLE, "remote: the endpoints serve " + std::to_string(slots.size()) +
                                      " devices, more than the " + std::to_string(kMaxServerDevices) +
                                      " a backend may have; list fewer endpoints");
    connections_ = std::move(connections);
    slots_ = std::move(slots);
    ready_.store(true, std::memory_order_release);
  }

  const Slot& slot(int32_t device) const {
    if (!ready_.load(std::memory_order_acquire))
      fail(BP_STATUS_INVALID_ARGUMENT,
           "remote: no devices yet: device_count() connects to the servers first");
    if (device < 0 || static_cast<std::size_t>(device) >= slots_.size())
      fail(BP_STATUS_INVALID_ARGUMENT, "remote: no device " + std::to_string(device) +
                                           " (the remote backend has " + std::to_string(slots_.size()) + ")");
    return slots_[static_cast<std::size_t>(device)];
  }

  // The host passes only live handles; the magic turns a stale one (a use
  // after free) into a status rather than a wild read.
  static RemoteBuffer* live(bp_buffer* buffer, const char* what) {
    auto* b = reinterpret_cast<RemoteBuffer*>(buffer);
    if (b == nullptr || b->magic != RemoteBuffer::kMagic) [[unlikely]]
      fail(BP_STATUS_INVALID_ARGUMENT,
           std::string("remote: ") + what + ": not a live remote buffer (NULL, freed, or another backend's)");
    return b;
  }

  // An operand of a call on `device`: its buffer must live there (one server
  // device runs the call; the host's checks do not know where buffers live).
  Operand operand(const bp_tensor& t, int32_t device, const char* op, const char* list, std::size_t i) const {
    const RemoteBuffer* b = live(t.buffer, op);
    if (b->device != device) {
      const std::string field =
          std::string(list) + (std::strcmp(list, "inputs") == 0 || std::strcmp(list, "outputs") == 0
                                   ? "[" + std::to_string(i) + "]"
                                   : "");
      fail(BP_STATUS_INVALID_ARGUMENT,
           std::string("remote: ") + op + ": " + field + " lives on remote:" + std::to_string(b->device) +
               " (" + b->connection->endpoint() + "), not on remote:" + std::to_string(device) +
               "; every tensor of one call must be on the same device: move it first with to()");
    }
    return Operand{&t, b->id};
  }

  const Options options_;
  std::string token_;
  std::unique_ptr<asio::ssl::context> tls_;
  std::mutex connect_mutex_;
  std::atomic<bool> ready_{false};
  // Written once by device_count before ready_; read-only afterwards.
  std::vector<std::unique_ptr<Connection>> connections_;
  std::vector<Slot> slots_;
};

}  // namespace
}  // namespace backplane::remote::client

// BACKPLANE_VERSION comes from project() in the top-level CMakeLists.txt.
BP_DEFINE_PLUGIN(backplane::remote::client::RemotePlugin, "remote", BACKPLANE_VERSION)
