// One client's session, without sockets: it takes verified requests (and a
// Write's payload) in arrival order and runs them on the hosted backend,
// answering through a Sender. It owns what the client allocated (buffers and
// communicators, by the client's ids) and frees all of it when it ends.
// Every field of every request is validated first (validate.hpp); a bad one
// fails that request, never the server.
// The session's jobs are files of their own: session.cpp (routing, dispatch,
// the sticky failure, release), session_buffers.cpp, session_ops.cpp and
// session_comms.cpp, with the helpers they share in session_internal.hpp.
//
// Thread-safety: handle() and release() run on one thread (the session's
// worker); abort() and abort_all() may be called from any thread at any time
// (the connection's reader calls them at once, ahead of queued work); the
// counters are atomics.
#ifndef BACKPLANE_REMOTE_SERVER_SESSION_HPP_
#define BACKPLANE_REMOTE_SERVER_SESSION_HPP_

#include "remote/server/account.hpp"
#include "remote/server/hosted.hpp"
#include "remote/server/kv_bridge.hpp"
#include "remote/server/limits.hpp"
#include "remote/server/sender.hpp"
#include "remote/server/validate.hpp"
#include "remote_generated.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace backplane::remote::server {

// What every session of a server holds, together; for tests and logs.
struct Counters {
  std::atomic<int64_t> sessions{0};
  std::atomic<int64_t> bytes{0};  // of hosted buffers
  std::atomic<int64_t> buffers{0};
  std::atomic<int64_t> comms{0};
  // Every byte counted against --max-total-bytes: the buffers' bytes and
  // what the connections hold for the sessions (account.hpp).
  MemoryAccount memory;
};

// Why the server's memory account cannot take `wanted` more bytes for
// `doing` ("allocating"): what it holds, the limit, what to do.
[[gnu::cold]] std::string no_room_text(const Counters& c, uint64_t wanted, uint64_t cap, const char* doing);

// Where a verified message from a client goes once its handshake is done.
enum class Route {
  worker,    // a request that touches a device: queued, in order
  abort,     // CommAbort: at once
  ping,      // answered at once
  kv_reply,  // the answer to one of the server's KvRequests
  goodbye,   // the client is done
};
// The route of `m`, or nullopt with `why` set for a protocol violation: a
// handshake message again, a message only the server sends, int64 vectors
// out of alignment, or payload bytes that are not exactly a Write's size.
// `m` must lie in a buffer of its own (8-byte aligned), as verified.
std::optional<Route> route(const wire::Message& m, uint64_t payload_bytes, std::string& why);

class Session {
 public:
  Session(uint64_t id, std::shared_ptr<const Hosted> hosted, const ServerLimits& limits, Counters& counters,
          Sender& sender);
  ~Session();  // release()
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  uint64_t id() const noexcept { return id_; }

  // Runs one request routed to the worker. `payload` is a Write's data (its
  // size already checked against Write.size by route()).
  void handle(const wire::Message& m, std::span<const uint8_t> payload);
  // The handshake's key of the flow ids a trace shares with the client
  // (wire::trace_flow_key): each request run is drawn as the end of the flow
  // the client's send began.
  void set_trace_flow_key(uint64_t key) noexcept { trace_flow_key_ = key; }
  // Where a Write's bytes may go straight from the socket: the host memory of
  // its range, when the buffer is this session's, lies on a host-visible
  // device and the range is inside it. Only while no request runs (the
  // caller's guarantee: its worker is idle and nothing is queued), and the
  // memory stays the buffer's until the next request. nullopt: the Write
  // takes the queue (which reports what is wrong with it, if anything).
  std::optional<std::span<uint8_t>> direct_write(const wire::Write& r) noexcept;
  // Fails a request the connection could not take in (a Write whose payload
  // found no room in the server's memory account), in its place in the
  // order: the failure is reported as the pipelined request's would be.
  void fail(const wire::Message& m, int32_t code, const std::string& why);
  // CommAbort: the hosted comm_abort on `comm` (this session's), at once.
  // An unknown id is ignored: the communicator may be gone already.
  void abort(uint64_t comm) noexcept;
  // Aborts every communicator (the session is ending).
  void abort_all() noexcept;
  // Destroys every communicator and frees every buffer; idempotent.
  void release() noexcept;

  uint64_t bytes() const noexcept { return bytes_; }
  std::size_t buffers() const noexcept { return buffers_.size(); }

 private:
  struct Buffer {
    bp_buffer* handle = nullptr;
    uint64_t size = 0;
    int32_t device = 0;
  };
  struct Comm {
    bp_comm* handle = nullptr;
    int32_t device = 0;
    int32_t world_size = 0;
    std::unique_ptr<KvBridge> kv;  // outlives the hosted communicator
    int aborting = 0;              // comm_abort calls running now (under comms_mutex_)
  };
  // The first failure of pipelined work, until a synchronising request reports it.
  struct Sticky {
    int32_t code = 0;
    std::string text;  // "execute add (request 17) on device 0: ..."
    uint64_t later = 0;
  };

  void handle_now(const wire::Message& m, std::span<const uint8_t> payload);
  void handle_traced(const wire::Message& m, std::span<const uint8_t> payload);
  void run(const wire::Message& m, std::span<const uint8_t> payload);
  void alloc(const wire::Alloc& r);
  void free(const wire::Free& r);
  void write(const wire::Write& r, std::span<const uint8_t> payload);
  void execute(const wire::Execute& r);
  void read(uint64_t id, const wire::Read& r);
  void synchronize(uint64_t id, const wire::Synchronize& r);
  void memory(uint64_t id, const wire::MemoryQuery& r);
  void comm_create(uint64_t id, const wire::CommCreate& r);
  void comm_destroy(uint64_t id, const wire::CommDestroy& r);
  void collective(uint64_t id, const wire::Collective& r);

  const HostedDevice& device(int32_t index) const;  // throws Refused
  const Buffer& buffer(uint64_t id) const;          // throws Refused
  std::shared_ptr<Comm> find_comm(uint64_t id);
  void destroy_comm(const std::shared_ptr<Comm>& comm) noexcept;
  PluginStatus free_buffer(const Buffer& b) noexcept;
  // Records a pipelined request's failure (the first is kept, later ones counted).
  void fail_pipelined(int32_t code, std::string text);
  // The reply status and text of a synchronising request: the sticky failure
  // if any (then cleared), else the request's own result.
  std::pair<int32_t, std::string> outcome(int32_t code, std::string text);

  const uint64_t id_;
  const std::shared_ptr<const Hosted> hosted_;
  const bp_plugin_api& api_;
  const ServerLimits limits_;
  Counters& counters_;
  Sender& sender_;

  std::unordered_map<uint64_t, Buffer> buffers_;  // worker only
  uint64_t bytes_ = 0;
  std::optional<Sticky> sticky_;
  std::vector<uint8_t> staging_;  // a Read's bytes on a device without buffer_pointer
  uint64_t staging_held_ = 0;     // staging_'s bytes taken from the server's memory account
  // Execute's decoded operands, kept so that their storage is reused.
  std::array<DecodedTensor, kMaxOperands> decoded_inputs_;
  std::array<DecodedTensor, kMaxOperands> decoded_outputs_;

  std::mutex comms_mutex_;
  std::condition_variable comms_idle_;  // an abort finished
  std::map<uint64_t, std::shared_ptr<Comm>> comms_;
  bool released_ = false;
  uint64_t trace_flow_key_ = 0;
};

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_SESSION_HPP_
