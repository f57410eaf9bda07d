// One client connection of the server, from accept to the end of its
// session: the handshake, a buffered frame reader, the session's worker
// thread with its queue, a gathering writer and the teardown. Every
// connection's socket work runs on its own strand; the hosted backend is
// called only from the worker (and comm_abort from the strand). Each of those
// jobs is a file of its own: connection_handshake.cpp, connection_reader.cpp,
// connection_queue.cpp, connection_writer.cpp (with the Sender entries) and
// connection_teardown.cpp. Internal to remote/server; the acceptor
// (server.cpp) makes and starts them.
#ifndef BACKPLANE_REMOTE_SERVER_CONNECTION_HPP_
#define BACKPLANE_REMOTE_SERVER_CONNECTION_HPP_

#include "remote/server/byte_buffer.hpp"
#include "remote/server/sender.hpp"
#include "remote/server/server_impl.hpp"
#include "remote/server/session.hpp"
#include "remote/wire/auth.hpp"
#include "remote/wire/frame.hpp"
#include "remote/wire/stream.hpp"

#include <backplane/log.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace backplane::remote::server {

// The reader's buffer: many small frames arrive in one read.
inline constexpr std::size_t kReadChunk = 64 * 1024;
// A Write at least this large, to a host-visible buffer while the session's
// worker is idle, is read from the socket straight into the buffer. When the
// worker is still busy with earlier requests as its header arrives, the
// payload is staged in steps of kStagingStep, and the rest goes straight into
// the buffer as soon as the worker has finished them: only the bytes that
// arrived meanwhile are copied.
inline constexpr uint64_t kDirectWriteBytes = 256 * 1024;
inline constexpr std::size_t kStagingStep = 1024 * 1024;
// Write payloads queued for the worker (beyond this the reader waits), and
// bytes waiting to be written to the client (beyond this the worker and the
// reader wait): memory per session stays bounded whatever the client does.
inline constexpr uint64_t kMaxQueuedPayloadBytes = uint64_t{256} << 20;
inline constexpr uint64_t kMaxUnsentBytes = uint64_t{64} << 20;

// A request for the worker: the verified message and a Write's payload, or
// why the connection could not take the request in (then it fails in its place).
struct Request {
  std::vector<uint8_t> message;
  ByteBuffer payload;
  bool goodbye = false;
  std::string refusal;
};

// A frame to write: the header and message, then an optional payload the
// sender still owns; `done` says whether it was written (exactly once).
struct Outgoing {
  std::vector<uint8_t> head;
  std::span<const uint8_t> payload;
  std::function<void(bool)> done;
  uint64_t bytes() const noexcept { return head.size() + payload.size(); }
};

// One client connection, from accept to the end of its session.
class Connection final : public std::enable_shared_from_this<Connection>, public Sender {
 public:
  // `socket` comes from the acceptor with a strand of its own as its
  // executor: every handler of this connection (socket, timers, posts) runs
  // on that one strand.
  // The server has counted it into the handshake limits (promote) already.
  Connection(Server::Impl& server, tcp::socket socket, asio::ip::address address);
  ~Connection() override;

  // Starts the handshake; from the acceptor.
  void start() {
    asio::post(strand_, [self = shared_from_this()] { self->begin(); });
  }
  // Tells the client why (a Fatal) and closes; from any thread.
  void shutdown(int32_t status, std::string why) {
    asio::post(strand_,
               [self = shared_from_this(), status, why = std::move(why)] { self->fatal(status, why); });
  }
  // Closes at once; from any thread.
  void kill(std::string why) {
    asio::post(strand_,
               [self = shared_from_this(), why = std::move(why)] { self->close(LogLevel::warning, why); });
  }

  // ---- Sender: the session's worker and the hosted plugin's kv calls -------
  // (connection_writer.cpp)
  void send(wire::Encoded frame) override;
  bool send_with_payload(wire::Encoded frame, std::span<const uint8_t> payload) override;
  KvResult kv(const KvCall& call, milliseconds wait) override;

 private:
  enum class Phase { tls, hello, proof, session, draining, closed };
  enum class Part { header, message, payload, discard };

  // ---- handshake (connection_handshake.cpp) --------------------------------
  void begin();
  void on_hello(const wire::Message& m);
  void on_proof(const wire::Message& m);
  void end_handshake();

  // ---- reading: frames out of a buffer that many small frames share -------
  // (connection_reader.cpp)
  void pump();
  void read_more();
  void read_payload();
  bool stage(std::size_t n);
  void no_room();
  void on_read_error(const error_code& ec);
  bool on_header();
  bool on_message();
  bool worker_waiting();
  bool read_direct(std::span<uint8_t> target);
  void on_frame_done();
  void on_kv_reply(uint64_t id, const wire::KvReply& r);
  void arm_idle();

  // ---- the worker's queue (connection_queue.cpp) ---------------------------
  void queue(Request r);
  bool queue_full_locked() const;
  void resume();
  void work();
  ByteBuffer take_spare();
  void give_spare(ByteBuffer b);
  void release_spares() override;
  void drop_large_spares();

  // ---- writing: queued frames leave in gathered writes (connection_writer.cpp)
  bool reserve_unsent(uint64_t n, uint64_t held);
  uint64_t send_now(wire::Encoded frame);
  void enqueue_out(Outgoing o);
  void flush();

  // ---- the end (connection_teardown.cpp) ----------------------------------
  void fatal(int32_t status, const std::string& why);
  void close(LogLevel level, const std::string& why);
  void stop_worker();
  void finish();
  void release_slot();

  Server::Impl& server_;
  const asio::ip::address address_;  // the peer's, for the per-address handshake limit
  asio::any_io_executor strand_;
  wire::Stream stream_;
  asio::steady_timer handshake_timer_;
  asio::steady_timer idle_timer_;
  asio::steady_timer write_timer_;
  asio::steady_timer linger_timer_;
  std::string peer_;
  std::string client_version_;
  Phase phase_ = Phase::tls;
  wire::Nonce client_nonce_{};
  wire::Nonce server_nonce_{};
  bool in_handshake_ = true;  // counted in Server::Impl::handshakes
  bool has_session_slot_ = false;
  bool finished_ = false;
  LogLevel close_level_ = LogLevel::info;
  std::string close_why_;
  bool close_after_flush_ = false;
  LogLevel fatal_level_ = LogLevel::warning;
  std::string fatal_why_;

  // Reader (strand).
  std::vector<uint8_t> inbuf_;
  std::size_t in_begin_ = 0;
  std::size_t in_end_ = 0;
  Part part_ = Part::header;
  wire::Header header_{};
  std::vector<uint8_t> message_;
  ByteBuffer payload_;
  bool paused_ = false;
  uint64_t discard_left_ = 0;      // Part::discard: payload bytes still to drop
  std::string refusal_;            // Part::discard: why the Write fails
  bool direct_read_ = false;       // a read into a hosted buffer's memory is in flight
  bool direct_candidate_ = false;  // the payload being staged may switch to a direct read

  // Writer (strand); out_[0, in_flight_) are being written.
  std::deque<Outgoing> out_;
  std::size_t in_flight_ = 0;
  bool writing_ = false;
  std::mutex send_mutex_;
  std::condition_variable send_cv_;
  uint64_t unsent_ = 0;
  uint64_t unsent_held_ = 0;  // the frames' own bytes among them, taken from the memory account
  bool dead_ = false;

  // Worker.
  std::unique_ptr<Session> session_;
  std::thread worker_;
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<Request> queue_;
  std::vector<std::vector<uint8_t>> spare_messages_;
  uint64_t queued_bytes_ = 0;
  bool worker_idle_ = false;
  bool reader_waits_ = false;
  bool memory_waits_ = false;  // the reader waits for staged payloads to be freed
  bool stop_worker_ = false;
  std::size_t freed_buffers_ = 0;
  uint64_t freed_bytes_ = 0;
  std::mutex spare_mutex_;
  std::vector<ByteBuffer> spares_;
  std::atomic<bool> large_spares_{false};  // a spare is larger than kDirectWriteBytes

  // Key-value requests to the client.
  std::mutex kv_mutex_;
  std::condition_variable kv_cv_;
  std::map<uint64_t, std::optional<KvResult>> kv_pending_;
  uint64_t next_kv_id_ = 1;
  bool kv_closed_ = false;
  std::atomic<int> kv_waiting_{0};
};

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_CONNECTION_HPP_
