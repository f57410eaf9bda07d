// One remote plugin connection to one `backplane serve` endpoint: the
// handshake, an io thread that owns the socket (TLS allows no concurrent read
// and write from two threads), a send queue that coalesces small frames into
// one gathered write, synchronising calls that wait (bounded) for their reply,
// and the key-value bridge that answers the server's KvRequests from the
// job's store. Every entry may be called from any thread.
#ifndef BACKPLANE_PLUGINS_REMOTE_CLIENT_CONNECTION_HPP_
#define BACKPLANE_PLUGINS_REMOTE_CLIENT_CONNECTION_HPP_

#include <backplane/abi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "plugins/remote/messages.hpp"
#include "remote/wire/frame.hpp"
#include "remote/wire/stream.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

namespace backplane::remote::client {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct ConnectionSettings {
  std::string endpoint;               // "HOST:PORT" as configured
  std::string token;                  // "" = no token
  std::string token_source;           // where the token comes from, or how to give one (for messages)
  asio::ssl::context* tls = nullptr;  // TLS when set (shared; outlives the connection)
  std::string tls_server_name;        // "" = the endpoint's host
  milliseconds connect_timeout{15000};
  milliseconds request_timeout{60000};
  milliseconds heartbeat{10000};  // 0 = no heartbeat
  uint64_t max_coalesce_bytes = 64 * 1024;
  std::string client_version;
};

// A tensor operand: the view and the id the server knows its buffer by.
struct Operand {
  const bp_tensor* tensor = nullptr;
  uint64_t buffer = 0;
};

// Counters for tests and benchmarks (monotonic).
struct ConnectionStats {
  uint64_t frames_sent = 0;
  uint64_t writes = 0;  // gathered writes handed to the socket
};

class Connection {
 public:
  explicit Connection(ConnectionSettings settings);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects (bounded by connect_timeout), runs TLS and the handshake and
  // starts the io thread. Throws plugin::Failure (BP_STATUS_UNAVAILABLE) with
  // a message naming the endpoint and what to do.
  void open();

  const ServerInfo& info() const noexcept { return info_; }
  const std::string& endpoint() const noexcept { return settings_.endpoint; }
  bool tls() const noexcept { return settings_.tls != nullptr; }
  // A fresh buffer or communicator id (nonzero, unique in the session).
  uint64_t new_object_id() noexcept { return next_object_.fetch_add(1, std::memory_order_relaxed); }
  // Why the connection is dead, or nullopt while it works.
  std::optional<std::string> dead_reason() const;
  ConnectionStats stats() const;

  // Pipelined: queued, no reply; a failure surfaces at the next synchronising call.
  void alloc(uint64_t buffer, int32_t device, uint64_t size);
  void free(uint64_t buffer);  // quiet on a dead connection: nothing is left to free
  // Small writes are copied; larger ones are sent from `src` and return once written.
  void write(uint64_t buffer, uint64_t offset, const void* src, uint64_t size);
  void execute(int32_t device, int32_t op, std::span<const Operand> inputs, std::span<const Operand> outputs,
               const bp_op_attrs& attrs);

  // Synchronising: wait for the reply (bounded by request_timeout).
  void read(uint64_t buffer, uint64_t offset, void* dst, uint64_t size);
  void synchronize(int32_t device);
  std::pair<uint64_t, uint64_t> memory(int32_t device);  // free, total

  // Collectives. `store` stays valid until comm_destroy.
  void comm_create(uint64_t comm, int32_t device, int32_t rank, int32_t world_size, int64_t timeout_ms,
                   const std::string& key_prefix, const bp_kv_store* store);
  void comm_destroy(uint64_t comm);  // quiet on a dead connection
  void comm_abort(uint64_t comm);
  void collective(uint64_t comm, wire::CollectiveKind kind, const Operand* input, const Operand* output,
                  int32_t reduce_op, int32_t root, int64_t timeout_ms);

 private:
  using Lock = std::unique_lock<std::mutex>;

  // A synchronising request waiting for its reply (shared by the caller and
  // the io thread; every field is guarded by mu_).
  struct Pending {
    enum Kind { reply, read, memory, ping };
    Kind kind = reply;
    uint64_t id = 0;
    const char* what = "";   // "synchronize", "buffer_read", ... for messages
    uint64_t comm = 0;       // a collective's communicator (comm_abort fails it)
    uint8_t* dst = nullptr;  // read: where the payload goes (the caller's memory)
    uint64_t size = 0;
    bool done = false;
    bool abandoned = false;  // the caller left (comm_abort): the reply is dropped
    int32_t status = BP_STATUS_OK;
    std::string message;
    uint64_t free_bytes = 0;
    uint64_t total_bytes = 0;
  };
  // A large write sent from the caller's memory: the caller waits until the
  // io thread no longer touches it.
  struct WriteTicket {
    bool done = false;
    bool written = false;
  };
  // Frames queued for the socket: owned bytes, then optionally a borrowed payload.
  struct Segment {
    std::vector<uint8_t> bytes;
    const uint8_t* borrowed = nullptr;
    uint64_t borrowed_size = 0;
    std::shared_ptr<WriteTicket> ticket;
  };
  // A communicator on this connection: where its KvRequests go.
  struct CommEntry {
    uint64_t id = 0;
    std::string key_prefix;
    const bp_kv_store* store = nullptr;
    int active_tasks = 0;  // kv calls running on its store
    bool aborted = false;
  };
  struct KvTask {
    uint64_t id = 0;  // the server's request id, answered with the same
    wire::KvKind kind = wire::KvKind::Set;
    std::vector<std::string> keys;
    std::vector<uint8_t> value;
    int64_t timeout_ms = 0;
    std::shared_ptr<CommEntry> comm;
  };

  // Handshake (caller's thread, before the io thread starts).
  void connect(Clock::time_point deadline);
  void handshake(Clock::time_point deadline);
  template <class Start>
  bool step(Clock::time_point deadline, boost::system::error_code& ec, Start start);
  void send_now(Clock::time_point deadline, const wire::Encoded& frame);
  const wire::Message* receive_now(Clock::time_point deadline, const char* expecting);
  [[noreturn]] void refuse(const std::string& message) const;

  // Queueing (callers hold mu_).
  void check_alive_locked() const;
  void push_locked(uint64_t id, wire::Body type, flatbuffers::Offset<void> body, const void* payload,
                   uint64_t payload_bytes, const std::shared_ptr<WriteTicket>& ticket, bool urgent = false);
  std::shared_ptr<Pending> call_locked(wire::Body type, flatbuffers::Offset<void> body, int kind,
                                       const char* what, uint64_t comm = 0);
  void wait_locked(Lock& lock, Pending& p, Clock::time_point deadline);  // traced when a trace records
  void wait_for_reply_locked(Lock& lock, Pending& p, Clock::time_point deadline);
  void trace_sent(uint64_t id, wire::Body type, uint64_t payload_bytes) const noexcept;
  void finish_or_throw(const Pending& p) const;
  uint64_t chunk_limit() const noexcept;

  // The io thread.
  void flush();
  void on_written(const boost::system::error_code& ec);
  void read_header();
  void on_header(const boost::system::error_code& ec);
  void on_message(const boost::system::error_code& ec);
  void on_payload(const boost::system::error_code& ec);
  void complete(const std::shared_ptr<Pending>& p, int32_t status, std::string message);
  void handle_kv_request(uint64_t id, const wire::KvRequest& request);
  void arm_heartbeat();
  void on_heartbeat();
  void die(const std::string& reason);   // io thread only
  void kill(const std::string& reason);  // any thread: posts die()

  // The key-value bridge's workers.
  void kv_worker();
  void run_kv_task(KvTask& task);
  void send_kv_reply(uint64_t id, int32_t status, const std::string& message,
                     const std::vector<uint8_t>& value);

  const ConnectionSettings settings_;
  std::string host_;
  uint16_t port_ = 0;
  ServerInfo info_;

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::unique_ptr<wire::Stream> stream_;
  int plain_fd_ = -1;  // the socket, for callers' direct sends; -1 with TLS (set before the io thread starts)
  asio::steady_timer heartbeat_timer_;
  std::thread thread_;

  // Reading state: io thread only.
  std::array<uint8_t, wire::kHeaderBytes> header_{};
  wire::Header frame_{};
  std::vector<uint8_t> message_;
  std::shared_ptr<Pending> reading_into_;  // a Read whose payload is being received
  std::vector<Segment> writing_;           // the batch the socket is writing
  Clock::time_point last_send_;            // guarded by mu_
  std::shared_ptr<Pending> ping_;
  Clock::time_point ping_sent_;

  // Everything below is guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;  // a pending finished, a write finished, a kv task ended
  bool dead_ = false;
  bool shutting_down_ = false;  // the destructor runs: the end is expected, not worth a warning
  std::string dead_reason_;
  flatbuffers::FlatBufferBuilder fbb_;
  uint64_t next_request_ = 1;
  uint64_t trace_flow_key_ = 0;  // the handshake's: the flow ids a trace shares with the server
  std::deque<Segment> queue_;
  bool write_scheduled_ = false;  // a flush is posted or a write is in flight
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending_;
  std::map<uint64_t, std::shared_ptr<CommEntry>> comms_;
  ConnectionStats stats_;

  // The kv workers (guarded by mu_ too).
  std::condition_variable kv_cv_;
  std::deque<KvTask> kv_queue_;
  std::vector<std::thread> kv_threads_;
  int kv_idle_ = 0;
  bool kv_stopping_ = false;

  std::atomic<uint64_t> next_object_{1};
};

}  // namespace backplane::remote::client

#endif  // BACKPLANE_PLUGINS_REMOTE_CLIENT_CONNECTION_HPP_
