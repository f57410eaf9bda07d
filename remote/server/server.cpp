// The server's network side: the acceptor, and per connection the handshake,
// a buffered frame reader, a gathering writer and the session's worker
// thread. Every connection's socket work runs on its own strand; the hosted
// backend is called only from the worker (and comm_abort from the strand).
#include "remote/server/server.hpp"

#include "remote/server/messages.hpp"
#include "remote/server/session.hpp"
#include "remote/wire/auth.hpp"
#include "remote/wire/stream.hpp"

#include <backplane/log.hpp>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <sys/resource.h>

namespace backplane::remote::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using std::chrono::milliseconds;

namespace {

using Strand = asio::strand<asio::io_context::executor_type>;

// The reader's buffer: many small frames arrive in one read.
constexpr std::size_t kReadChunk = 64 * 1024;
// A payload that is not in the reader's buffer yet is read straight into its
// own buffer, which grows as bytes arrive (64 KiB, then doubling): a frame
// that announces a gigabyte and sends a byte costs 64 KiB.
constexpr std::size_t kFirstPayloadChunk = 64 * 1024;
// A Write at least this large, to a host-visible buffer while the session's
// worker is idle, is read from the socket straight into the buffer. When the
// worker is still busy with earlier requests as its header arrives, the
// payload is staged in steps of kStagingStep, and the rest goes straight into
// the buffer as soon as the worker has finished them: only the bytes that
// arrived meanwhile are copied.
constexpr uint64_t kDirectWriteBytes = 256 * 1024;
constexpr std::size_t kStagingStep = 1024 * 1024;
// Write payloads queued for the worker (beyond this the reader waits), and
// bytes waiting to be written to the client (beyond this the worker and the
// reader wait): memory per session stays bounded whatever the client does.
constexpr uint64_t kMaxQueuedPayloadBytes = uint64_t{256} << 20;
constexpr uint64_t kMaxUnsentBytes = uint64_t{64} << 20;
// Payload buffers kept for reuse (first-touching fresh pages is slow).
constexpr std::size_t kSpareBuffers = 2;
constexpr uint64_t kMaxSpareBytes = uint64_t{256} << 20;
// Message buffers the worker hands back for the reader to fill again: each
// request's message would otherwise be allocated on the reader's thread and
// freed on the worker's, which glibc serves slowly (no per-thread cache).
constexpr std::size_t kSpareMessages = 64;
constexpr std::size_t kMaxSpareMessageBytes = 64 * 1024;
// How long a Fatal may take to reach the client before the socket closes anyway.
constexpr milliseconds kFatalLinger{2000};
constexpr milliseconds kMaxAcceptBackoff{1000};
using wire::whole_transfer;

// How long stop() waits for sessions to end after telling them, before it
// closes their sockets outright.
constexpr milliseconds kStopGrace{5000};

void log_line(LogLevel level, const std::string& message) { backplane::log(level, "serve: " + message); }

// What a client says about itself, fit for one log line: at most 64
// characters, anything not printable ASCII shown as '?'.
std::string printable(std::string_view text) {
  std::string out(text.substr(0, 64));
  for (char& c : out)
    if (c < 0x20 || c > 0x7e) c = '?';
  return out;
}

std::string ms_text(milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

std::string join_host_port(const std::string& host, uint16_t port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// The lines about connections waiting for a handshake slot (built only when
// one is closed or accepting pauses).
[[gnu::cold]] std::string waited_too_long_text(const asio::ip::address& address, milliseconds timeout,
                                               int64_t handshakes, const ServerLimits& limits) {
  return address.to_string() + " waited " + ms_text(timeout) +
         " (--handshake-timeout-ms) for a handshake slot and was closed: " + std::to_string(handshakes) +
         " connections are in their handshake (--max-handshakes " + std::to_string(limits.max_handshakes) +
         ", --max-handshakes-per-address " + std::to_string(limits.max_handshakes_per_address) + ")";
}

[[gnu::cold]] std::string evicted_text(const asio::ip::address& address, std::size_t max_waiting) {
  return "closed a connection from " + address.to_string() +
         " that waited longest for a handshake slot without sending anything: " +
         std::to_string(max_waiting) +
         " connections wait, the most this server keeps (half of `ulimit -n`; raise it to keep more)";
}

[[gnu::cold]] std::string paused_text(std::size_t waiting, int64_t handshakes) {
  return "paused accepting: " + std::to_string(waiting) +
         " connections wait for a handshake slot, the most this server keeps (half of `ulimit -n`), and " +
         std::to_string(handshakes) +
         " are in their handshake (--max-handshakes, --max-handshakes-per-address); new ones wait until one "
         "starts or times out";
}

bool is_loopback(const asio::ip::address& a) {
  if (a.is_v4()) return (a.to_v4().to_uint() >> 24) == 127;
  const asio::ip::address_v6 v6 = a.to_v6();
  if (v6.is_loopback()) return true;
  if (v6.is_v4_mapped()) return (asio::ip::make_address_v4(asio::ip::v4_mapped, v6).to_uint() >> 24) == 127;
  return false;
}

// A payload's bytes: allocated without zero-filling, grown keeping its
// contents; its capacity is taken from the server's memory account while it
// lives. From kMappedBytes on the memory is mapped on its own: it grows
// without a copy (mremap) and goes back to the system when freed, where
// the heap would keep it (glibc's heaps, one per thread, grow their
// threshold for mapping with every large block freed).
class ByteBuffer {
 public:
  ByteBuffer() = default;
  ByteBuffer(ByteBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        capacity_(std::exchange(o.capacity_, 0)),
        account_(o.account_) {}
  ByteBuffer& operator=(ByteBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      capacity_ = std::exchange(o.capacity_, 0);
      account_ = o.account_;
    }
    return *this;
  }
  ~ByteBuffer() { release(); }

  uint8_t* data() noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return capacity_; }
  void set_size(std::size_t n) noexcept { size_ = n; }
  // Grows to `n` bytes, taken from `account` (the old and the new block
  // both, while the contents are copied); false (nothing changed) when the
  // account would then hold more than `cap`. Throws std::bad_alloc.
  bool reserve(std::size_t n, MemoryAccount& account, uint64_t cap) {
    if (n <= capacity_) return true;
    if (!account.take(n, cap)) return false;
    uint8_t* bigger = nullptr;
    if (n >= kMappedBytes && capacity_ >= kMappedBytes) {
      void* p = ::mremap(data_, capacity_, n, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) {
        account.give(n);
        throw std::bad_alloc();
      }
      account.give(capacity_);
      data_ = static_cast<uint8_t*>(p);
      capacity_ = n;
      account_ = &account;
      return true;
    }
    if (n >= kMappedBytes) {
      void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      bigger = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
    } else {
      bigger = new (std::nothrow) uint8_t[n];
    }
    if (bigger == nullptr) {
      account.give(n);
      throw std::bad_alloc();
    }
    const std::size_t size = size_;
    if (size != 0) std::memcpy(bigger, data_, size);
    release();
    data_ = bigger;
    size_ = size;
    capacity_ = n;
    account_ = &account;
    return true;
  }

 private:
  static constexpr std::size_t kMappedBytes = std::size_t{1} << 20;

  void release() noexcept {
    if (data_ != nullptr) {
      if (capacity_ >= kMappedBytes) {
        ::munmap(data_, capacity_);
      } else {
        delete[] data_;
      }
    }
    if (account_ != nullptr && capacity_ != 0) account_->give(capacity_);
    data_ = nullptr;
    size_ = capacity_ = 0;
  }

  uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  MemoryAccount* account_ = nullptr;  // where capacity_ was taken from
};

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

}  // namespace

bool is_loopback_address(const std::string& address) {
  error_code ec;
  const asio::ip::address a = asio::ip::make_address(address, ec);
  return !ec && is_loopback(a);
}

class Connection;

struct Server::Impl {
  Impl(std::shared_ptr<const Hosted> h, ServerOptions o);
  ~Impl();
  void listen();
  void accept();
  void on_accept_error(const error_code& ec);
  void remove(const std::shared_ptr<Connection>& c);
  void stop();
  void log_limited(LogLevel level, const std::string& line);
  // A new connection waits (parked) until it may start its handshake; on accept_strand.
  void park(tcp::socket socket, asio::ip::address address);
  // Starts the handshakes of waiting connections while slots are free (those
  // that sent something first, then the oldest), and resumes a paused
  // accept once there is room to wait again; on accept_strand.
  void promote();
  // Closes the connection that waited longest without sending a byte, to
  // make room for a new one; false when every waiting one has sent something.
  bool evict_silent();
  // A connection from `address` left its handshake: a waiting one may start.
  void handshake_ended(const asio::ip::address& address);

  std::shared_ptr<const Hosted> hosted;
  ServerOptions options;
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  Strand accept_strand;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  milliseconds accept_backoff{0};
  // With max_waiting connections waiting, each of which has sent something,
  // the acceptor waits: set and cleared on accept_strand.
  std::atomic<bool> accept_paused{false};
  std::unique_ptr<asio::ssl::context> tls;
  std::vector<std::thread> threads;

  Counters counters;
  std::atomic<int64_t> handshakes{0};
  std::mutex handshake_mutex;  // guards handshakes_by_address
  std::map<asio::ip::address, int32_t> handshakes_by_address;
  // Connections accepted but not in their handshake yet (over
  // --max-handshakes or --max-handshakes-per-address), oldest first. They
  // cost a descriptor each and no buffer; at most max_waiting of them.
  struct Waiting;
  std::list<std::shared_ptr<Waiting>> waiting;  // accept_strand
  std::atomic<int64_t> waiting_count{0};
  std::size_t max_waiting = 0;
  std::atomic<uint64_t> next_session{1};
  std::string bound;
  uint16_t port = 0;
  bool loopback_only = false;

  std::mutex log_mutex;  // the rate limit of log_limited
  std::chrono::steady_clock::time_point log_window{};
  int logged_in_window = 0;
  uint64_t log_suppressed = 0;

  std::mutex stop_mutex;  // one stop() at a time
  std::mutex mutex;       // guards connections and stopping
  std::condition_variable drained;
  std::set<std::shared_ptr<Connection>> connections;
  bool stopping = false;
  bool stopped = false;
};

// One client connection, from accept to the end of its session.
class Connection final : public std::enable_shared_from_this<Connection>, public Sender {
 public:
  // `socket` comes from the acceptor with a strand of its own as its
  // executor: every handler of this connection (socket, timers, posts) runs
  // on that one strand.
  // The server has counted it into the handshake limits (promote) already.
  Connection(Server::Impl& server, tcp::socket socket, asio::ip::address address)
      : server_(server),
        address_(std::move(address)),
        strand_(socket.get_executor()),
        stream_(std::move(socket), server.tls.get()),
        handshake_timer_(strand_),
        idle_timer_(strand_),
        write_timer_(strand_),
        linger_timer_(strand_) {
    error_code ec;
    const tcp::endpoint ep = stream_.socket().remote_endpoint(ec);
    peer_ = ec ? std::string("an unknown peer") : join_host_port(ep.address().to_string(), ep.port());
    inbuf_.resize(kReadChunk);
  }

  ~Connection() override {
    if (in_handshake_) server_.handshake_ended(address_);
    server_.counters.memory.give(unsent_held_);  // frames that were never written
    if (worker_.joinable()) {
      if (worker_.get_id() == std::this_thread::get_id()) {
        worker_.detach();
      } else {
        worker_.join();
      }
    }
  }

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
  void send(wire::Encoded frame) override {
    const uint64_t n = frame.bytes.size();
    if (!reserve_unsent(n, n)) return;
    auto o = std::make_shared<Outgoing>(Outgoing{std::move(frame.bytes), {}, {}});
    asio::post(strand_, [self = shared_from_this(), o] { self->enqueue_out(std::move(*o)); });
  }

  bool send_with_payload(wire::Encoded frame, std::span<const uint8_t> payload) override {
    // The payload is a buffer's memory or the session's staging, both counted already.
    const uint64_t n = frame.bytes.size() + payload.size();
    if (!reserve_unsent(n, frame.bytes.size())) return false;
    auto written = std::make_shared<std::promise<bool>>();
    std::future<bool> result = written->get_future();
    auto o = std::make_shared<Outgoing>(
        Outgoing{std::move(frame.bytes), payload, [written](bool ok) { written->set_value(ok); }});
    asio::post(strand_, [self = shared_from_this(), o] { self->enqueue_out(std::move(*o)); });
    return result.get();  // the payload is the caller's: wait until it is written
  }

  KvResult kv(const KvCall& call, milliseconds wait) override {
    uint64_t id = 0;
    {
      std::lock_guard lock(kv_mutex_);
      if (kv_closed_) return KvResult{BP_STATUS_UNAVAILABLE, "the client's session has ended", {}};
      id = next_kv_id_++;
      kv_pending_[id];
    }
    ++kv_waiting_;
    send(encode_kv_request(id, call.kind, call.keys, call.value, call.timeout_ms));
    // The reader may be waiting for room in the queue; the reply must get through.
    asio::post(strand_, [self = shared_from_this()] { self->resume(); });
    std::unique_lock lock(kv_mutex_);
    kv_cv_.wait_for(lock, wait, [&] { return kv_closed_ || kv_pending_[id].has_value(); });
    std::optional<KvResult> result = std::move(kv_pending_[id]);
    kv_pending_.erase(id);
    const bool closed = kv_closed_;
    lock.unlock();
    --kv_waiting_;
    if (result) return std::move(*result);
    if (closed) return KvResult{BP_STATUS_UNAVAILABLE, "the client's session ended during the request", {}};
    return KvResult{BP_STATUS_TIMEOUT,
                    "the client did not answer the server's key-value request within " + ms_text(wait),
                    {}};
  }

 private:
  enum class Phase { tls, hello, proof, session, draining, closed };
  enum class Part { header, message, payload, discard };

  // ---- handshake ----------------------------------------------------------
  void begin() {
    handshake_timer_.expires_after(server_.options.limits.handshake_timeout);
    handshake_timer_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (ec || self->phase_ == Phase::closed || self->phase_ >= Phase::session) return;
      self->close(LogLevel::warning, "did not finish its handshake within " +
                                         ms_text(self->server_.options.limits.handshake_timeout) +
                                         " (--handshake-timeout-ms); closed");
    });
    if (!stream_.tls()) {
      phase_ = Phase::hello;
      pump();
      return;
    }
    phase_ = Phase::tls;
    stream_.async_handshake(
        asio::ssl::stream_base::server, [self = shared_from_this()](const error_code& ec) {
          if (self->phase_ == Phase::closed) return;
          if (ec) {
            self->close(LogLevel::warning, "failed the TLS handshake (" + ec.message() +
                                               "; a client without TLS, or one that does "
                                               "not trust this server's certificate); closed");
            return;
          }
          self->phase_ = Phase::hello;
          self->pump();
        });
  }

  void on_hello(const wire::Message& m) {
    const wire::Hello* hello = m.body_as_Hello();
    if (hello == nullptr) {
      fatal(BP_STATUS_INVALID_ARGUMENT,
            std::string("protocol error: the first message must be a Hello, not a ") +
                wire::body_name(m.body_type()));
      return;
    }
    if (hello->protocol() != wire::kProtocolVersion) {
      fatal(BP_STATUS_UNAVAILABLE,
            "this server speaks remote protocol version " + std::to_string(wire::kProtocolVersion) +
                " and the client version " + std::to_string(hello->protocol()) + " (server backplane " +
                server_.options.server_version + "); run the same backplane version on both sides");
      return;
    }
    if (hello->nonce() == nullptr || hello->nonce()->size() != wire::kNonceBytes) {
      fatal(BP_STATUS_INVALID_ARGUMENT,
            "protocol error: the Hello's nonce must be " + std::to_string(wire::kNonceBytes) + " bytes");
      return;
    }
    std::copy(hello->nonce()->begin(), hello->nonce()->end(), client_nonce_.begin());
    if (hello->client_version() != nullptr)
      client_version_ = printable(hello->client_version()->string_view());
    server_nonce_ = wire::random_nonce();
    const bool auth = !server_.options.token.empty();
    wire::Mac proof{};
    if (auth) proof = wire::server_proof(server_.options.token, client_nonce_, server_nonce_);
    send_now(encode_challenge(server_.options.server_version, auth, server_nonce_,
                              auth ? std::span<const uint8_t>(proof) : std::span<const uint8_t>()));
    phase_ = Phase::proof;
  }

  void on_proof(const wire::Message& m) {
    const wire::Proof* proof = m.body_as_Proof();
    if (proof == nullptr) {
      fatal(BP_STATUS_INVALID_ARGUMENT,
            std::string("protocol error: expected a Proof after the Challenge, not a ") +
                wire::body_name(m.body_type()));
      return;
    }
    if (!server_.options.token.empty()) {
      const auto* p = proof->client_proof();
      const wire::Mac expected = wire::client_proof(server_.options.token, client_nonce_, server_nonce_);
      if (p == nullptr || !wire::same_mac(expected, std::span<const uint8_t>(p->data(), p->size()))) {
        fatal(
            BP_STATUS_INVALID_ARGUMENT,
            "authentication failed: the client did not prove this server's token (give the client the token "
            "the server was started with)");
        return;
      }
    }
    // A session slot, if one is free.
    const int32_t max = server_.options.limits.max_sessions;
    int64_t n = server_.counters.sessions.load();
    do {
      if (n >= max) {
        fatal(BP_STATUS_UNAVAILABLE,
              "the server has " + std::to_string(n) + " sessions, its limit (--max-sessions); try later");
        return;
      }
    } while (!server_.counters.sessions.compare_exchange_weak(n, n + 1));
    has_session_slot_ = true;
    end_handshake();
    const uint64_t id = server_.next_session++;
    session_ = std::make_unique<Session>(id, server_.hosted, server_.options.limits, server_.counters, *this);
    send_now(encode_welcome(id, *server_.hosted, server_.options.limits));
    phase_ = Phase::session;
    log_line(LogLevel::info,
             "session " + std::to_string(id) + " from " + peer_ + " began" +
                 (client_version_.empty() ? "" : " (client backplane " + client_version_ + ")") +
                 (stream_.tls() ? ", over TLS" : ""));
    worker_ = std::thread([self = shared_from_this()] { self->work(); });
  }

  void end_handshake() {
    if (in_handshake_) {
      in_handshake_ = false;
      server_.handshake_ended(address_);
    }
    handshake_timer_.cancel();
  }

  // ---- reading: frames out of a buffer that many small frames share -------
  // Runs every complete frame in inbuf_, then reads more (unless paused).
  void pump() {
    try {
      while (phase_ != Phase::closed && phase_ != Phase::draining && phase_ != Phase::tls) {
        if (paused_) return;
        const std::size_t avail = in_end_ - in_begin_;
        if (part_ == Part::header) {
          if (avail < wire::kHeaderBytes) break;
          if (!on_header()) return;
          continue;
        }
        if (part_ == Part::message) {
          if (avail < header_.message_bytes) break;
          message_.assign(inbuf_.begin() + static_cast<std::ptrdiff_t>(in_begin_),
                          inbuf_.begin() + static_cast<std::ptrdiff_t>(in_begin_ + header_.message_bytes));
          in_begin_ += header_.message_bytes;
          if (!on_message()) return;
          continue;
        }
        if (part_ == Part::discard) {  // a Write refused for want of memory: its bytes are dropped
          const std::size_t drop = static_cast<std::size_t>(std::min<uint64_t>(avail, discard_left_));
          in_begin_ += drop;
          discard_left_ -= drop;
          if (discard_left_ != 0) break;
          part_ = Part::header;
          queue(Request{std::move(message_), {}, false, std::move(refusal_)});
          refusal_.clear();
          continue;
        }
        // Part::payload: what is buffered already, then straight into the payload buffer.
        const std::size_t take = std::min<std::size_t>(avail, header_.payload_bytes - payload_.size());
        if (take != 0) {  // an empty payload buffer has no storage yet
          if (!stage(payload_.size() + take)) {
            no_room();
            return;
          }
          std::memcpy(payload_.data() + payload_.size(), inbuf_.data() + in_begin_, take);
          payload_.set_size(payload_.size() + take);
        }
        in_begin_ += take;
        if (payload_.size() < header_.payload_bytes) {
          read_payload();
          return;
        }
        on_frame_done();
      }
      if (phase_ == Phase::closed || phase_ == Phase::draining || phase_ == Phase::tls || paused_) return;
      read_more();
    } catch (const std::bad_alloc&) {
      fatal(BP_STATUS_OUT_OF_MEMORY, "the server ran out of memory reading a frame");
    } catch (const std::exception& e) {
      fatal(BP_STATUS_INTERNAL, std::string("unexpected error in the server: ") + e.what());
    }
  }

  void read_more() {
    // Room for the next read, and for the whole message when its header is in.
    const std::size_t need =
        part_ == Part::message ? std::max<std::size_t>(header_.message_bytes, kReadChunk) : kReadChunk;
    if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
    if (inbuf_.size() - in_begin_ < need) {
      std::memmove(inbuf_.data(), inbuf_.data() + in_begin_, in_end_ - in_begin_);
      in_end_ -= in_begin_;
      in_begin_ = 0;
      if (inbuf_.size() < need) inbuf_.resize(need);
    }
    arm_idle();
    auto handler = [self = shared_from_this()](const error_code& ec, std::size_t n) {
      if (self->phase_ == Phase::closed) return;
      if (ec) {
        self->on_read_error(ec);
        return;
      }
      self->in_end_ += n;
      self->pump();
    };
    const auto room = asio::buffer(inbuf_.data() + in_end_, inbuf_.size() - in_end_);
    if (stream_.tls()) {
      stream_.ssl().async_read_some(room, std::move(handler));
    } else {
      stream_.socket().async_read_some(room, std::move(handler));
    }
  }

  void read_payload() {
    const uint64_t total = header_.payload_bytes;
    const std::size_t got = payload_.size();
    if (direct_candidate_ && worker_waiting()) {
      // Every earlier request has run: the rest of the payload may go straight
      // into the buffer (or never will, if the Write cannot be done directly).
      direct_candidate_ = false;
      const wire::Message* m = wire::GetMessage(message_.data());  // verified in on_message
      if (const auto target = session_->direct_write(*m->body_as_Write())) {
        if (got != 0) std::memcpy(target->data(), payload_.data(), got);
        give_spare(std::move(payload_));
        payload_ = ByteBuffer();
        if (read_direct(target->subspan(got))) pump();
        return;
      }
    }
    std::size_t target = payload_.capacity() >= total
                             ? total
                             : std::min<uint64_t>(total, std::max(kFirstPayloadChunk, got * 2));
    if (!stage(target)) {
      no_room();
      return;
    }
    // A step at a time while the worker may still free up for a direct read.
    if (direct_candidate_) target = std::min<uint64_t>(target, got + kStagingStep);
    arm_idle();
    auto handler = [self = shared_from_this(), target](const error_code& ec, std::size_t) {
      if (self->phase_ == Phase::closed) return;
      if (ec) {
        self->on_read_error(ec);
        return;
      }
      self->payload_.set_size(target);
      if (target < self->header_.payload_bytes) {
        self->read_payload();
        return;
      }
      self->on_frame_done();
      self->pump();
    };
    const auto room = asio::buffer(payload_.data() + got, target - got);
    if (stream_.tls()) {
      asio::async_read(stream_.ssl(), room, whole_transfer, std::move(handler));
    } else {
      asio::async_read(stream_.socket(), room, whole_transfer, std::move(handler));
    }
  }

  // Room in the server's memory account for `n` bytes of the payload being
  // staged, after what this connection keeps for reuse if need be.
  bool stage(std::size_t n) {
    MemoryAccount& account = server_.counters.memory;
    const uint64_t cap = server_.options.limits.max_total_bytes;
    if (payload_.reserve(n, account, cap)) return true;
    release_spares();
    return payload_.reserve(n, account, cap);
  }

  // No room to stage more of this Write's payload. While earlier requests
  // hold staged payloads, reading waits for the worker to run them; once
  // nothing else is held the payload goes straight into the buffer if it
  // can, else (or while the worker waits on the client's store) its bytes
  // are dropped and the Write fails with out_of_memory in its place: the
  // session and the server go on.
  void no_room() {
    bool idle = false;
    {
      std::lock_guard lock(queue_mutex_);
      idle = worker_idle_ && queue_.empty();
      // While the backend waits on the client's store, the client's answer,
      // behind this payload, must get through: then the Write fails instead.
      if (!idle && kv_waiting_ == 0) {
        memory_waits_ = true;
        paused_ = true;
        idle_timer_.cancel();  // the client is waiting for us, not idle
        return;
      }
    }
    direct_candidate_ = false;
    const std::size_t got = payload_.size();
    const wire::Message* m = wire::GetMessage(message_.data());  // verified in on_message
    if (idle) {
      if (const auto target = session_->direct_write(*m->body_as_Write())) {
        if (got != 0) std::memcpy(target->data(), payload_.data(), got);
        payload_ = ByteBuffer();
        if (read_direct(target->subspan(got))) pump();
        return;
      }
    }
    refusal_ = no_room_text(server_.counters, header_.payload_bytes, server_.options.limits.max_total_bytes,
                            "staging a write of");
    discard_left_ = header_.payload_bytes - got;
    payload_ = ByteBuffer();
    part_ = Part::discard;
    pump();
  }

  void on_read_error(const error_code& ec) {
    const bool mid_frame = part_ != Part::header || in_end_ != in_begin_;
    if (session_ == nullptr) {
      close(LogLevel::warning, "closed the connection during the handshake (" + ec.message() + ")");
    } else if (ec == asio::error::eof && !mid_frame) {
      close(LogLevel::info, "disconnected");
    } else {
      close(LogLevel::warning, std::string(mid_frame ? "sent a truncated frame" : "lost its connection") +
                                   " (" + ec.message() + ")");
    }
  }

  // Checks the header against the phase's limits; false when the connection is done.
  bool on_header() {
    const bool handshake = phase_ != Phase::session;
    const uint64_t max_message = handshake ? kHandshakeMessageBytes : wire::kDefaultMaxMessageBytes;
    const uint64_t max_payload = handshake ? 0 : server_.options.limits.max_frame_bytes;
    std::string why;
    const std::span<const uint8_t, wire::kHeaderBytes> bytes(inbuf_.data() + in_begin_, wire::kHeaderBytes);
    const std::optional<wire::Header> h = wire::decode_header(bytes, max_message, max_payload, why);
    if (!h) {
      fatal(BP_STATUS_INVALID_ARGUMENT,
            "protocol error: " + why + (handshake && max_payload == 0 ? " (during the handshake)" : ""));
      return false;
    }
    in_begin_ += wire::kHeaderBytes;
    header_ = *h;
    part_ = Part::message;
    return true;
  }

  // A whole message is in message_; false when reading must stop here.
  bool on_message() {
    std::string why;
    const wire::Message* m = wire::verify_message(message_, why);
    if (m == nullptr) {
      fatal(BP_STATUS_INVALID_ARGUMENT, "protocol error: " + why);
      return false;
    }
    if (phase_ == Phase::hello || phase_ == Phase::proof) {
      part_ = Part::header;
      if (phase_ == Phase::hello) {
        on_hello(*m);
      } else {
        on_proof(*m);
      }
      return phase_ == Phase::proof || phase_ == Phase::session;
    }
    const std::optional<Route> r = route(*m, header_.payload_bytes, why);
    if (!r) {
      fatal(BP_STATUS_INVALID_ARGUMENT, "protocol error: the client " + why);
      return false;
    }
    switch (*r) {
      case Route::worker:
        if (header_.payload_bytes == 0) {
          part_ = Part::header;
          queue(Request{std::move(message_), {}, false, {}});
          return !paused_;
        }
        direct_candidate_ = false;
        if (header_.payload_bytes >= kDirectWriteBytes) {
          if (!worker_waiting()) {
            direct_candidate_ = true;  // read_payload() asks again between steps
          } else if (const auto target = session_->direct_write(*m->body_as_Write())) {
            return read_direct(*target);
          }
        }
        payload_ = take_spare();
        payload_.set_size(0);
        part_ = Part::payload;
        return true;
      case Route::abort:
        part_ = Part::header;
        session_->abort(m->body_as_CommAbort()->comm());
        return true;
      case Route::ping:
        part_ = Part::header;
        // A client that pings without reading the replies stops being read.
        if (send_now(encode_reply(m->id(), BP_STATUS_OK, "")) >= kMaxUnsentBytes) {
          paused_ = true;
          idle_timer_.cancel();
          return false;
        }
        return true;
      case Route::kv_reply:
        part_ = Part::header;
        on_kv_reply(m->id(), *m->body_as_KvReply());
        return true;
      case Route::goodbye:
        part_ = Part::header;
        phase_ = Phase::draining;  // nothing more is read; the worker finishes what is queued
        queue(Request{{}, {}, true, {}});
        return false;
    }
    return true;
  }

  // True while the worker waits for work and none is queued: then nothing
  // touches the session's buffers but this strand.
  bool worker_waiting() {
    std::lock_guard lock(queue_mutex_);
    return worker_idle_ && queue_.empty();
  }

  // A Write's payload straight into the buffer's memory: the part already
  // buffered, then the rest from the socket. The write is done when the bytes
  // are in. The worker may not free the session's buffers until the read's
  // handler has run (close() leaves that to the handler).
  bool read_direct(std::span<uint8_t> target) {
    part_ = Part::header;
    const std::size_t take = std::min<std::size_t>(in_end_ - in_begin_, target.size());
    if (take != 0) std::memcpy(target.data(), inbuf_.data() + in_begin_, take);
    in_begin_ += take;
    if (take == target.size()) return true;
    direct_read_ = true;
    arm_idle();
    auto handler = [self = shared_from_this()](const error_code& ec, std::size_t) {
      self->direct_read_ = false;
      if (self->phase_ == Phase::closed) {
        self->stop_worker();
        return;
      }
      if (ec) {
        self->on_read_error(ec);
        return;
      }
      self->pump();
    };
    const auto room = asio::buffer(target.data() + take, target.size() - take);
    if (stream_.tls()) {
      asio::async_read(stream_.ssl(), room, whole_transfer, std::move(handler));
    } else {
      asio::async_read(stream_.socket(), room, whole_transfer, std::move(handler));
    }
    return false;
  }

  void on_frame_done() {
    part_ = Part::header;
    direct_candidate_ = false;
    queue(Request{std::move(message_), std::move(payload_), false, {}});
  }

  void on_kv_reply(uint64_t id, const wire::KvReply& r) {
    KvResult result;
    result.status = r.status();
    if (r.message() != nullptr) result.message = r.message()->str();
    if (r.value() != nullptr) result.value.assign(r.value()->begin(), r.value()->end());
    if (result.status != BP_STATUS_OK && result.message.empty()) result.message = "failed (no message)";
    {
      std::lock_guard lock(kv_mutex_);
      const auto it = kv_pending_.find(id);
      if (it == kv_pending_.end() || it->second.has_value()) return;  // late: the request timed out
      it->second = std::move(result);
    }
    kv_cv_.notify_all();
  }

  void arm_idle() {
    if (phase_ != Phase::session) return;  // the handshake timer bounds the handshake
    const milliseconds timeout = server_.options.limits.idle_timeout;
    idle_timer_.expires_after(timeout);
    idle_timer_.async_wait([self = shared_from_this(), timeout](const error_code& ec) {
      if (ec || self->phase_ != Phase::session || self->paused_) return;
      self->fatal(BP_STATUS_TIMEOUT, "the session sent nothing for " + ms_text(timeout) +
                                         " (the server's idle timeout, --idle-timeout-ms); closed");
    });
  }

  // ---- the worker's queue ------------------------------------------------
  void queue(Request r) {
    bool wake = false;
    {
      std::lock_guard lock(queue_mutex_);
      queued_bytes_ += r.payload.size() + r.message.size();
      queue_.push_back(std::move(r));
      if (message_.capacity() == 0 && !spare_messages_.empty()) {  // the next message's buffer
        message_ = std::move(spare_messages_.back());
        spare_messages_.pop_back();
      }
      wake = worker_idle_;
      if (queue_full_locked()) {
        paused_ = true;
        reader_waits_ = true;
        idle_timer_.cancel();  // the client is waiting for us, not idle
      }
    }
    if (wake) queue_cv_.notify_one();
  }

  bool queue_full_locked() const {
    const uint64_t max = server_.options.limits.max_inflight;
    const uint64_t n = queue_.size();
    // While the backend waits on the client's store, the client's answer must
    // get through: up to twice the limit then.
    return (n >= max && kv_waiting_ == 0) || n >= 2 * max || queued_bytes_ >= kMaxQueuedPayloadBytes;
  }

  // Reading again once the queue and the unsent bytes have room (on the strand).
  void resume() {
    if (!paused_ || phase_ != Phase::session) return;
    {
      std::lock_guard lock(queue_mutex_);
      if (queue_full_locked()) return;
      reader_waits_ = false;
    }
    {
      std::lock_guard lock(send_mutex_);
      if (unsent_ >= kMaxUnsentBytes) return;
    }
    paused_ = false;
    pump();
  }

  void work() {
    std::string goodbye;
    std::vector<uint8_t> handled;  // the last request's message, for the reader to reuse
    for (;;) {
      Request r;
      {
        std::unique_lock lock(queue_mutex_);
        if (handled.capacity() != 0 && handled.capacity() <= kMaxSpareMessageBytes &&
            spare_messages_.size() < kSpareMessages)
          spare_messages_.push_back(std::move(handled));
        if (memory_waits_) {  // the last request's payload is freed: the reader may find room now
          memory_waits_ = false;
          asio::post(strand_, [self = shared_from_this()] { self->resume(); });
        }
        worker_idle_ = true;
        if (queue_.empty() && large_spares_.load()) {
          // Nothing to do: large spare buffers go back (the next large write
          // is read straight into its buffer while the worker is idle).
          lock.unlock();
          drop_large_spares();
          lock.lock();
        }
        queue_cv_.wait(lock, [&] { return stop_worker_ || !queue_.empty(); });
        worker_idle_ = false;
        if (stop_worker_) break;
        r = std::move(queue_.front());
        queue_.pop_front();
        queued_bytes_ -= r.payload.size() + r.message.size();
        if (reader_waits_ && !queue_full_locked()) {
          reader_waits_ = false;
          asio::post(strand_, [self = shared_from_this()] { self->resume(); });
        }
      }
      if (r.goodbye) {
        goodbye = "said goodbye";
        break;
      }
      try {
        const wire::Message* m = wire::GetMessage(r.message.data());  // verified by the reader
        if (!r.refusal.empty()) {
          session_->fail(*m, BP_STATUS_OUT_OF_MEMORY, r.refusal);
        } else {
          session_->handle(*m, std::span<const uint8_t>(r.payload.data(), r.payload.size()));
        }
      } catch (const std::exception& e) {
        log_line(LogLevel::error,
                 "session " + std::to_string(session_->id()) + ": unexpected error: " + e.what());
      }
      give_spare(std::move(r.payload));
      handled = std::move(r.message);
    }
    {
      std::lock_guard lock(queue_mutex_);
      queue_.clear();
    }
    freed_buffers_ = session_->buffers();
    freed_bytes_ = session_->bytes();
    session_->release();
    asio::post(strand_, [self = shared_from_this(), goodbye] {
      self->release_slot();  // before the socket closes: a client that sees EOF sees a freed session
      if (!goodbye.empty()) self->close(LogLevel::info, goodbye);
      self->finish();
    });
  }

  ByteBuffer take_spare() {
    std::lock_guard lock(spare_mutex_);
    if (spares_.empty()) return {};
    ByteBuffer b = std::move(spares_.back());
    spares_.pop_back();
    return b;
  }

  void give_spare(ByteBuffer b) {
    if (b.capacity() == 0 || b.capacity() > kMaxSpareBytes) return;
    std::lock_guard lock(spare_mutex_);
    if (spares_.size() >= kSpareBuffers) return;
    if (b.capacity() > kDirectWriteBytes) large_spares_ = true;
    spares_.push_back(std::move(b));
  }

  // Sender: frees the spare payload buffers (the session's allocation found no room).
  void release_spares() override {
    std::vector<ByteBuffer> dropped;
    std::lock_guard lock(spare_mutex_);
    dropped.swap(spares_);
    large_spares_ = false;
  }

  void drop_large_spares() {
    std::vector<ByteBuffer> dropped;
    std::lock_guard lock(spare_mutex_);
    for (ByteBuffer& b : spares_)
      if (b.capacity() > kDirectWriteBytes) dropped.push_back(std::move(b));
    std::erase_if(spares_, [](const ByteBuffer& b) { return b.capacity() == 0; });
    large_spares_ = false;
  }

  // ---- writing: queued frames leave in gathered writes -------------------
  // Waits while too many bytes are unsent, or while the server's memory
  // account has no room for the `held` bytes this frame makes the server hold
  // and earlier frames are still unsent (with nothing unsent, one frame goes
  // past the cap: replies must get out). False once the connection is gone.
  bool reserve_unsent(uint64_t n, uint64_t held) {
    MemoryAccount& account = server_.counters.memory;
    const uint64_t cap = server_.options.limits.max_total_bytes;
    std::unique_lock lock(send_mutex_);
    bool taken = false;
    send_cv_.wait(lock, [&] {
      if (dead_) return true;
      if (unsent_ >= kMaxUnsentBytes) return false;
      taken = account.take(held, cap);
      return taken || unsent_ == 0;
    });
    if (dead_) {
      if (taken) account.give(held);
      return false;
    }
    if (!taken) account.force(held);
    unsent_ += n;
    unsent_held_ += held;
    return true;
  }

  // A frame the strand makes itself (the handshake, a ping's reply, a Fatal):
  // counted, never waited for. Returns the bytes unsent now.
  uint64_t send_now(wire::Encoded frame) {
    uint64_t unsent = 0;
    {
      std::lock_guard lock(send_mutex_);
      unsent_ += frame.bytes.size();
      unsent_held_ += frame.bytes.size();
      unsent = unsent_;
    }
    server_.counters.memory.force(frame.bytes.size());  // small, and bounded by kMaxUnsentBytes
    enqueue_out(Outgoing{std::move(frame.bytes), {}, {}});
    return unsent;
  }

  void enqueue_out(Outgoing o) {
    if (phase_ == Phase::closed) {
      if (o.done) o.done(false);
      return;
    }
    out_.push_back(std::move(o));
    if (!writing_) flush();
  }

  void flush() {
    writing_ = true;
    in_flight_ = std::min<std::size_t>(out_.size(), 64);
    std::vector<asio::const_buffer> buffers;
    buffers.reserve(2 * in_flight_);
    for (std::size_t i = 0; i < in_flight_; ++i) {
      buffers.push_back(asio::buffer(out_[i].head));
      if (!out_[i].payload.empty())
        buffers.push_back(asio::buffer(out_[i].payload.data(), out_[i].payload.size()));
    }
    const milliseconds timeout = server_.options.limits.idle_timeout;
    write_timer_.expires_after(timeout);
    write_timer_.async_wait([self = shared_from_this(), timeout](const error_code& ec) {
      if (ec || self->phase_ == Phase::closed) return;
      self->close(LogLevel::warning, "did not read what the server sent for " + ms_text(timeout) +
                                         " (--idle-timeout-ms); closed");
    });
    auto handler = [self = shared_from_this()](const error_code& ec, std::size_t) {
      self->write_timer_.cancel();
      self->writing_ = false;
      uint64_t written = 0;
      uint64_t heads = 0;
      for (std::size_t i = 0; i < self->in_flight_; ++i) {
        written += self->out_.front().bytes();
        heads += self->out_.front().head.size();
        if (self->out_.front().done) self->out_.front().done(!ec);
        self->out_.pop_front();
      }
      self->in_flight_ = 0;
      {
        std::lock_guard lock(self->send_mutex_);
        self->unsent_ -= std::min(self->unsent_, written);
        heads = std::min(self->unsent_held_, heads);
        self->unsent_held_ -= heads;
      }
      self->server_.counters.memory.give(heads);
      self->send_cv_.notify_all();
      if (ec) {
        self->close(LogLevel::info, "could not be written to (" + ec.message() + ")");
        return;
      }
      if (self->phase_ == Phase::closed) return;
      if (!self->out_.empty()) {
        self->flush();
      } else if (self->close_after_flush_) {
        self->close(self->fatal_level_, self->fatal_why_);
        return;
      }
      self->resume();
    };
    if (stream_.tls()) {
      asio::async_write(stream_.ssl(), buffers, whole_transfer, std::move(handler));
    } else {
      asio::async_write(stream_.socket(), buffers, whole_transfer, std::move(handler));
    }
  }

  // ---- the end -----------------------------------------------------------
  // Sends a Fatal saying why, then closes (after it is written, or after kFatalLinger).
  void fatal(int32_t status, const std::string& why) {
    if (phase_ == Phase::closed || close_after_flush_) return;
    close_after_flush_ = true;
    fatal_level_ =
        status == BP_STATUS_UNAVAILABLE || status == BP_STATUS_TIMEOUT ? LogLevel::info : LogLevel::warning;
    fatal_why_ = "was told: " + why;
    if (phase_ == Phase::tls) {  // no frame can go out before TLS is up
      close(fatal_level_, fatal_why_);
      return;
    }
    phase_ = Phase::draining;  // nothing more is read
    send_now(encode_fatal(status, why));
    linger_timer_.expires_after(kFatalLinger);
    linger_timer_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (!ec) self->close(self->fatal_level_, self->fatal_why_);
    });
  }

  void close(LogLevel level, const std::string& why) {
    if (phase_ == Phase::closed) return;
    const bool had_session = session_ != nullptr;
    phase_ = Phase::closed;
    close_level_ = level;
    close_why_ = why;
    end_handshake();
    idle_timer_.cancel();
    linger_timer_.cancel();
    stream_.close();  // pending reads and the write in flight complete with operation_aborted
    // Frames not yet handed to the socket will never be written.
    while (out_.size() > in_flight_) {
      if (out_.back().done) out_.back().done(false);
      out_.pop_back();
    }
    {
      std::lock_guard lock(send_mutex_);
      dead_ = true;
    }
    send_cv_.notify_all();
    {
      std::lock_guard lock(kv_mutex_);
      kv_closed_ = true;
    }
    kv_cv_.notify_all();
    if (!had_session) {
      finish();
      return;
    }
    session_->abort_all();  // a collective blocked on a peer returns
    // The worker frees what the session held and then calls finish(); while a
    // read goes straight into a buffer, its handler tells the worker instead.
    if (!direct_read_) stop_worker();
  }

  void stop_worker() {
    {
      std::lock_guard lock(queue_mutex_);
      stop_worker_ = true;
    }
    queue_cv_.notify_all();
  }

  // The last step, on the strand: everything is freed; one line says so.
  void finish() {
    if (finished_) return;
    finished_ = true;
    if (worker_.joinable()) worker_.join();
    if (session_) {
      log_line(close_level_, "session " + std::to_string(session_->id()) + " from " + peer_ +
                                 " ended: " + close_why_ + "; freed " + std::to_string(freed_buffers_) +
                                 " buffer(s), " + std::to_string(freed_bytes_) + " bytes");
      session_.reset();
    } else {
      server_.log_limited(close_level_ == LogLevel::info ? LogLevel::debug : close_level_,
                          peer_ + " " + close_why_);
    }
    release_slot();
    server_.remove(shared_from_this());
  }

  void release_slot() {
    if (has_session_slot_) {
      has_session_slot_ = false;
      --server_.counters.sessions;
    }
  }

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

// ---- Server ---------------------------------------------------------------

Server::Impl::Impl(std::shared_ptr<const Hosted> h, ServerOptions o)
    : hosted(std::move(h)),
      options(std::move(o)),
      work(asio::make_work_guard(io)),
      accept_strand(asio::make_strand(io)),
      acceptor(accept_strand),
      accept_retry(accept_strand) {
  const ServerLimits& l = options.limits;
  if (!hosted) throw std::runtime_error("no backend to serve");
  if (options.tls_cert.empty() != options.tls_key.empty())
    throw std::runtime_error("TLS needs both a certificate (--tls-cert) and its private key (--tls-key)");
  if (l.handshake_timeout.count() <= 0 || l.idle_timeout.count() <= 0 || l.max_handshakes < 1 ||
      l.max_handshakes_per_address < 1 || l.max_sessions < 1 || l.max_buffers < 1 || l.max_inflight < 1 ||
      l.max_frame_bytes < 1)
    throw std::runtime_error("every server limit must be positive");
  if (options.io_threads < 1) options.io_threads = 1;
  if (!options.tls_cert.empty()) tls = wire::server_tls_context(options.tls_cert, options.tls_key);
  // Waiting connections may take half the descriptors this process may open.
  rlimit files{};
  const uint64_t descriptors = ::getrlimit(RLIMIT_NOFILE, &files) != 0 ? 1024
                               : files.rlim_cur == RLIM_INFINITY       ? uint64_t{1} << 20
                                                                       : files.rlim_cur;
  max_waiting = static_cast<std::size_t>(std::clamp<uint64_t>(descriptors / 2, 16, uint64_t{1} << 16));
  listen();
  accept();
  for (int i = 0; i < options.io_threads; ++i) {
    threads.emplace_back([this] {
      for (;;) {
        try {
          io.run();
          return;
        } catch (const std::exception& e) {
          log_line(LogLevel::error, std::string("unexpected error in a server thread: ") + e.what());
        }
      }
    });
  }
}

Server::Impl::~Impl() { stop(); }

// Loopback or not is decided on the resolved addresses: every spelling of
// loopback ("localhost", "127.1", "::1") stays invisible to the network.
void Server::Impl::listen() {
  const std::string& spec = options.listen;
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw std::runtime_error("--listen \"" + spec +
                             "\" is not HOST:PORT (e.g. 127.0.0.1:7070; port 0 picks one)");
  std::string host = spec.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_text = spec.substr(colon + 1);
  unsigned long port_value = 0;
  try {
    std::size_t used = 0;
    port_value = std::stoul(port_text, &used);
    if (used != port_text.size() || port_value > 65535) throw std::invalid_argument(port_text);
  } catch (const std::exception&) {
    throw std::runtime_error("--listen \"" + spec + "\" has no valid port (0..65535) after the last ':'");
  }
  const auto port_wanted = static_cast<uint16_t>(port_value);

  error_code ec;
  tcp::resolver resolver(io);
  const auto results =
      resolver.resolve(host, std::to_string(port_wanted), tcp::resolver::numeric_service, ec);
  if (ec || results.empty())
    throw std::runtime_error("cannot listen on \"" + spec + "\": the host does not resolve (" +
                             (ec ? ec.message() : std::string("no address")) + ")");
  bool all_loopback = true;
  for (const auto& r : results) all_loopback = all_loopback && is_loopback(r.endpoint().address());
  asio::ip::address address = results.begin()->endpoint().address();
  if (address.is_v6() && address.to_v6().is_v4_mapped())
    address = asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6());
  const std::string shown = join_host_port(address.to_string(), port_wanted);
  loopback_only = all_loopback;
  if (!loopback_only && options.token.empty())
    throw std::runtime_error(
        "refusing to listen on " + shown + " (\"" + host +
        "\" is not a loopback address, so any host that reaches it could use the backend) without a token: "
        "give "
        "one with --token-file FILE (a file only you can read, e.g. openssl rand -hex 32 > FILE; chmod 600 "
        "FILE) "
        "or the BACKPLANE_REMOTE_TOKEN environment variable, and the same token to the clients");
  const tcp::endpoint endpoint(address, port_wanted);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw std::runtime_error(
        "cannot listen on " + shown + ": " + ec.message() +
        (ec == asio::error::address_in_use ? " (another process holds the port; choose another)" : ""));
  port = acceptor.local_endpoint().port();
  bound = join_host_port(address.to_string(), port);
}

void Server::Impl::accept() {
  acceptor.async_accept(asio::make_strand(io), [this](const error_code& ec, tcp::socket socket) {
    {
      std::lock_guard lock(mutex);
      if (stopping) return;
    }
    if (ec) {
      on_accept_error(ec);
      return;
    }
    if (accept_backoff.count() != 0) {
      log_limited(LogLevel::warning, "accepting connections again");
      accept_backoff = milliseconds(0);
    }
    error_code ignored;
    const tcp::endpoint peer = socket.remote_endpoint(ignored);
    asio::ip::address address = peer.address();
    if (address.is_v6() && address.to_v6().is_v4_mapped())
      address = asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6());
    // Every new connection waits its turn: at once when a slot is free, else
    // until one frees (nothing is closed for being over a limit).
    park(std::move(socket), address);
    promote();
    if (waiting.size() >= max_waiting && !evict_silent()) {
      // Every waiting connection has sent its first bytes: new ones wait in
      // the kernel's listen queue until one starts its handshake or times out.
      accept_paused = true;
      log_limited(LogLevel::warning, paused_text(waiting.size(), handshakes.load()));
      return;
    }
    accept();
  });
}

struct Server::Impl::Waiting {
  Waiting(tcp::socket s, asio::ip::address a, const Strand& strand)
      : socket(std::move(s)), address(std::move(a)), timer(strand) {}
  tcp::socket socket;
  asio::ip::address address;
  asio::steady_timer timer;  // how long it may wait: --handshake-timeout-ms
  std::list<std::shared_ptr<Waiting>>::iterator place;
  bool readable = false;  // it sent something (a Hello, a TLS ClientHello) or closed
  bool done = false;      // started or closed: late handlers do nothing
};

void Server::Impl::park(tcp::socket socket, asio::ip::address address) {
  auto w = std::make_shared<Waiting>(std::move(socket), std::move(address), accept_strand);
  waiting.push_back(w);
  w->place = std::prev(waiting.end());
  ++waiting_count;
  const milliseconds timeout = options.limits.handshake_timeout;
  w->timer.expires_after(timeout);
  w->timer.async_wait([this, w, timeout](const error_code& ec) {
    if (ec || w->done) return;
    w->done = true;
    error_code ignored;
    w->socket.close(ignored);
    waiting.erase(w->place);
    --waiting_count;
    log_limited(LogLevel::warning,
                waited_too_long_text(w->address, timeout, handshakes.load(), options.limits));
    promote();
  });
  // A connection that sends first goes first: a client sends its Hello at
  // once, a flood of silent connections never does. Bytes there already
  // count at once (the notice of readiness may come after the next accept).
  error_code ignored;
  if (w->socket.available(ignored) > 0) {
    w->readable = true;
    return;
  }
  w->socket.async_wait(tcp::socket::wait_read, [this, w](const error_code& ec) {
    if (ec) return;
    asio::post(accept_strand, [this, w] {
      if (w->done) return;
      w->readable = true;
      promote();
    });
  });
}

void Server::Impl::promote() {
  {
    std::lock_guard lock(mutex);
    if (stopping) return;
  }
  const int32_t per_address = options.limits.max_handshakes_per_address;
  while (!waiting.empty()) {
    auto pick = waiting.end();
    {
      std::lock_guard lock(handshake_mutex);
      if (handshakes.load() >= options.limits.max_handshakes) break;
      auto first_silent = waiting.end();
      for (auto it = waiting.begin(); it != waiting.end(); ++it) {
        const auto n = handshakes_by_address.find((*it)->address);
        if (n != handshakes_by_address.end() && n->second >= per_address) continue;
        if ((*it)->readable) {
          pick = it;
          break;
        }
        if (first_silent == waiting.end()) first_silent = it;
      }
      if (pick == waiting.end()) pick = first_silent;
      if (pick == waiting.end()) break;
      ++handshakes_by_address[(*pick)->address];
      ++handshakes;
    }
    const std::shared_ptr<Waiting> w = *pick;
    waiting.erase(pick);
    --waiting_count;
    w->done = true;
    w->timer.cancel();
    error_code ignored;
    w->socket.cancel(ignored);
    w->socket.set_option(tcp::no_delay(true), ignored);
    w->socket.set_option(asio::socket_base::keep_alive(true), ignored);
    auto c = std::make_shared<Connection>(*this, std::move(w->socket), w->address);
    {
      std::lock_guard lock(mutex);
      connections.insert(c);
    }
    c->start();
  }
  if (accept_paused.load() && waiting.size() < max_waiting) {
    accept_paused = false;
    log_limited(LogLevel::info, "accepting connections again (there is room to wait for a handshake slot)");
    accept();
  }
}

bool Server::Impl::evict_silent() {
  const auto it = std::find_if(waiting.begin(), waiting.end(),
                               [](const std::shared_ptr<Waiting>& w) { return !w->readable; });
  if (it == waiting.end()) return false;
  const std::shared_ptr<Waiting> w = *it;
  waiting.erase(it);
  --waiting_count;
  w->done = true;
  w->timer.cancel();
  error_code ignored;
  w->socket.close(ignored);
  log_limited(LogLevel::warning, evicted_text(w->address, max_waiting));
  return true;
}

void Server::Impl::handshake_ended(const asio::ip::address& address) {
  {
    std::lock_guard lock(handshake_mutex);
    const auto it = handshakes_by_address.find(address);
    if (it != handshakes_by_address.end() && --it->second <= 0) handshakes_by_address.erase(it);
    --handshakes;
  }
  // The acceptor parks a connection before it promotes: one parked after
  // this check sees the free slot then.
  if (waiting_count.load() == 0 && !accept_paused.load()) return;
  asio::post(accept_strand, [this] { promote(); });
}

// Out of file descriptors (EMFILE, ENFILE) or another transient failure:
// retry on a timer that backs off to kMaxAcceptBackoff; never spin or stop.
void Server::Impl::on_accept_error(const error_code& ec) {
  if (ec == asio::error::operation_aborted) return;
  if (accept_backoff.count() == 0)
    log_limited(LogLevel::warning, "accepting a connection failed: " + ec.message() +
                                       (ec.value() == EMFILE || ec.value() == ENFILE
                                            ? " (out of file descriptors; raise `ulimit -n`)"
                                            : "") +
                                       "; retrying with backoff");
  accept_backoff = std::min(kMaxAcceptBackoff, std::max(milliseconds(10), accept_backoff * 2));
  accept_retry.expires_after(accept_backoff);
  accept_retry.async_wait([this](const error_code& e) {
    if (e) return;
    {
      std::lock_guard lock(mutex);
      if (stopping) return;
    }
    accept();
  });
}

// Connections that never authenticate can come by the thousand: at most
// kMaxLinesPerSecond lines a second about them (and about accepting,
// pausing and resuming), then one line saying how many were not shown.
void Server::Impl::log_limited(LogLevel level, const std::string& line) {
  constexpr int kMaxLinesPerSecond = 10;
  uint64_t suppressed = 0;
  {
    std::lock_guard lock(log_mutex);
    const auto now = std::chrono::steady_clock::now();
    if (now - log_window >= std::chrono::seconds(1)) {
      log_window = now;
      logged_in_window = 0;
      suppressed = log_suppressed;
      log_suppressed = 0;
    }
    if (logged_in_window >= kMaxLinesPerSecond) {
      ++log_suppressed;
      return;
    }
    ++logged_in_window;
  }
  if (suppressed != 0)
    log_line(
        LogLevel::warning,
        std::to_string(suppressed) +
            " more line(s) about connections that did not authenticate, or about accepting them, were not "
            "shown");
  log_line(level, line);
}

void Server::Impl::remove(const std::shared_ptr<Connection>& c) {
  std::lock_guard lock(mutex);
  connections.erase(c);
  drained.notify_all();
}

void Server::Impl::stop() {
  std::lock_guard once(stop_mutex);
  std::set<std::shared_ptr<Connection>> live;
  {
    std::lock_guard lock(mutex);
    if (stopped) return;
    stopping = true;
    live = connections;
  }
  asio::post(accept_strand, [this] {
    error_code ignored;
    acceptor.close(ignored);
    accept_retry.cancel();
    for (const std::shared_ptr<Waiting>& w : waiting) {
      w->done = true;
      w->timer.cancel();
      w->socket.close(ignored);
    }
    waiting.clear();
    waiting_count = 0;
  });
  for (const auto& c : live) c->shutdown(BP_STATUS_UNAVAILABLE, "the server is shutting down");
  live.clear();
  {
    std::unique_lock lock(mutex);
    if (!drained.wait_for(lock, kStopGrace, [&] { return connections.empty(); })) {
      for (const auto& c : connections) c->kill("was closed: the server is shutting down");
    }
    // Sessions end once the backend's calls return (comm_abort unblocks collectives).
    drained.wait(lock, [&] { return connections.empty(); });
    stopped = true;
  }
  work.reset();
  io.stop();
  for (std::thread& t : threads)
    if (t.joinable()) t.join();
  threads.clear();
}

Server::Server(std::shared_ptr<const Hosted> hosted, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(hosted), std::move(options))) {}

Server::~Server() = default;

std::string Server::address() const { return impl_->bound; }
uint16_t Server::port() const { return impl_->port; }
bool Server::loopback_only() const { return impl_->loopback_only; }
bool Server::tls() const { return impl_->tls != nullptr; }
void Server::stop() { impl_->stop(); }

ServerStats Server::stats() const {
  ServerStats s;
  s.handshakes = impl_->handshakes.load();
  s.waiting = impl_->waiting_count.load();
  s.sessions = impl_->counters.sessions.load();
  s.bytes = impl_->counters.bytes.load();
  s.held = static_cast<int64_t>(impl_->counters.memory.held());
  s.buffers = impl_->counters.buffers.load();
  s.comms = impl_->counters.comms.load();
  return s;
}

}  // namespace backplane::remote::server
