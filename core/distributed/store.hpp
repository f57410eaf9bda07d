// The TCP rendezvous store's two halves: the server that the hosting rank
// runs on its own thread (store_server.cpp) and the client that every rank,
// the host too, talks to it through (store_client.cpp). The wire format is
// store_wire.hpp; the public face is make_tcp_store (store.cpp).
#ifndef BACKPLANE_CORE_DISTRIBUTED_STORE_HPP_
#define BACKPLANE_CORE_DISTRIBUTED_STORE_HPP_

// ThreadSanitizer does not model the fences Asio puts around handlers (GCC
// rejects them under -fsanitize=thread). Asio's scheduler mutex already
// orders what they would, so that build alone goes without them.
#if defined(__SANITIZE_THREAD__)
#define BOOST_ASIO_DISABLE_FENCED_BLOCK
#endif
// Asio marks its declarations visibility("default"); without this switch its
// templates and statics are exported from libbackplane and could bind to
// another Asio in the host process.
#define BOOST_ASIO_DISABLE_VISIBILITY
// Boost 1.74's Asio headers use std::exchange without including <utility>.
#include <utility>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <backplane/log.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "distributed/drop_log.hpp"
#include "distributed/store_wire.hpp"

namespace backplane::store_detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// 127.0.0.0/8, ::1, and IPv4-mapped 127.x (::ffff:127.0.0.1).
bool is_loopback(const asio::ip::address& address);

struct ServerOptions {
  std::string host;   // what to listen on (resolved; see Server::listen)
  uint16_t port = 0;  // 0: any free port
  int32_t world_size = 1;
  std::string secret;  // the job secret; empty: none (loopback only)
  store_wire::Limits limits;
};

// Serves one job's keys. Every connection must prove the job secret within
// limits.handshake_timeout before it is told anything; at most
// limits.max_unauthenticated connections wait for that at once (accepting
// pauses until one leaves). Thread-safe to construct and destroy; all else
// runs on its own thread.
class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Called when this process's rank failed a collective: when the server
  // is destroyed, ranks still connected may need what it holds (the failure
  // board naming why), so it keeps serving them until they disconnect, at
  // most limits.failed_linger. Otherwise it closes at once.
  void linger_on_close() noexcept { linger_.store(true, std::memory_order_relaxed); }

  uint16_t port() const { return port_; }
  // "127.0.0.1:29500", "0.0.0.0:29500": what the server listens on.
  const std::string& bound() const { return bound_; }
  bool loopback_only() const { return loopback_only_; }

 private:
  struct Waiter;
  struct Session;
  struct Account;
  using SessionPtr = std::shared_ptr<Session>;
  using WaiterPtr = std::shared_ptr<Waiter>;

  // A stored value: bytes[offset..] of the set request's payload, kept as it
  // arrived, so that neither storing nor serving it copies the bytes. It
  // counts against the setter's account while it lives.
  struct Value {
    std::vector<uint8_t> bytes;
    std::size_t offset = 0;
    std::shared_ptr<Account> account;
    std::size_t charged = 0;  // what it counts: the payload, its key and the entry
    ~Value();
    const uint8_t* data() const { return bytes.data() + offset; }
    std::size_t size() const { return bytes.size() - offset; }
  };
  using ValuePtr = std::shared_ptr<const Value>;

  struct Outgoing {
    bool framed = true;  // false for the handshake messages, which have no frame header
    store_wire::Header header{};
    std::vector<uint8_t> body;
    ValuePtr value;  // a stored value, sent from the store without a copy
  };

  void listen(const std::string& host, uint16_t port);
  void run();
  void accept();
  void on_accept_error(const boost::system::error_code& ec);
  void leave_unauthenticated(const SessionPtr& s);
  void start(const SessionPtr& s);
  void on_hello(const SessionPtr& s);
  void on_proof(const SessionPtr& s);
  void reject(const SessionPtr& s, store_wire::Verdict verdict, std::string why, int32_t world_size);
  void read_frame(const SessionPtr& s);
  void read_header_rest(const SessionPtr& s);
  void on_header(const SessionPtr& s);
  void read_payload(const SessionPtr& s, store_wire::Op op, uint64_t id, std::size_t total);
  void arm_idle(const SessionPtr& s, const char* what);
  void on_request(const SessionPtr& s, store_wire::Op op, uint64_t id);
  void dispatch(const SessionPtr& s, store_wire::Op op, uint64_t id);
  void bad_frame(const SessionPtr& s, const std::string& why);
  std::optional<std::string> over_limit(const Session& s, std::size_t more, const std::string& what) const;
  void refuse(const SessionPtr& s, uint64_t id, const std::string& why);
  void log_drop(LogLevel level, std::string line);
  void arm_drop_log();
  void close(const SessionPtr& s, LogLevel level, const std::string& why);
  void send(const SessionPtr& s, Outgoing o);
  void send_raw(const SessionPtr& s, const uint8_t* data, std::size_t n);
  void reply(const SessionPtr& s, store_wire::Reply kind, uint64_t id, std::vector<uint8_t> body = {},
             ValuePtr value = {});
  void flush(const SessionPtr& s);
  std::optional<std::string> first_missing(const std::vector<std::string>& keys) const;
  void park(const SessionPtr& s, uint64_t id, bool is_get, std::vector<std::string> keys,
            uint64_t timeout_ms);
  void unpark(const WaiterPtr& w);
  void release(const WaiterPtr& w);
  void on_key_set(const std::string& key);
  void complete(const WaiterPtr& w);
  void expire(const WaiterPtr& w);
  void shutdown();
  void close_or_linger();

  int32_t world_size_;
  std::string secret_;
  store_wire::Limits limits_;
  std::string where_;    // "the store on 127.0.0.1:29500", for logs
  asio::io_context io_;  // declared before everything that holds its objects
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_retry_{io_};
  uint16_t port_ = 0;
  std::string bound_;
  bool loopback_only_ = false;
  std::thread thread_;

  // Touched only on thread_ (after the constructor).
  std::map<std::string, ValuePtr> data_;
  std::unordered_map<std::string, std::list<WaiterPtr>> parked_;
  std::set<SessionPtr> sessions_;
  std::set<int32_t> ranks_;
  // Per rank, kept across its reconnections (Limits::max_client_bytes), and
  // the store's total (Limits::max_total_bytes), which each of them feeds.
  std::map<int32_t, std::shared_ptr<Account>> accounts_;
  std::shared_ptr<Account> total_account_;
  std::size_t unauthenticated_ = 0;
  DropLog drop_log_;                        // connections dropped before they authenticated
  asio::steady_timer drop_log_timer_{io_};  // armed while drop_log_ has a summary pending
  bool drop_log_armed_ = false;
  bool accept_paused_ = false;                   // at the unauthenticated cap
  std::chrono::milliseconds accept_backoff_{0};  // after EMFILE/ENFILE; 0 when accepting works
  bool stopping_ = false;
  bool lingering_ = false;                // destroyed, serving connected ranks (linger_on_close)
  asio::steady_timer linger_timer_{io_};  // ends the linger at limits.failed_linger
  std::atomic<bool> linger_{false};       // set by linger_on_close, from any thread
};

// One connection per client, multiplexed: each request carries an id and
// its caller sleeps on its own condition variable until the reply with
// that id arrives. A get parked on the server therefore never holds up
// another thread's set on the same client, and no extra connections (which
// the one-connection-per-rank handshake would have to tell apart) are needed.
class Client {
 public:
  struct Response {
    store_wire::Reply kind;
    std::vector<uint8_t> payload;
  };

  // Connects (retrying until `timeout`) and proves the job secret.
  Client(const std::string& host, uint16_t port, int32_t rank, int32_t world_size,
         std::chrono::milliseconds timeout, const std::string& secret);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends one request and waits for its reply until `deadline` (none: wait
  // until the reply or a lost connection). `what` names the call in errors.
  Response call(store_wire::Op op, std::vector<uint8_t> payload, std::optional<Clock::time_point> deadline,
                const std::string& what);
  const std::string& address() const { return address_; }

 private:
  struct Pending {
    std::condition_variable cv;
    bool done = false;
    std::optional<std::string> error;
    Response response{store_wire::Reply::ok, {}};
  };
  struct Frame {
    store_wire::Header header;
    std::vector<uint8_t> payload;
  };

  void connect(const std::string& host, uint16_t port, Clock::time_point deadline);
  void handshake(int32_t rank, int32_t world_size, std::chrono::milliseconds timeout,
                 const std::string& secret);
  bool run_until(const bool& done, Clock::time_point deadline);
  void read_header();
  void on_header();
  void write_next();
  void fail(std::string message);

  std::string address_;
  asio::io_context io_;  // first member: outlives the socket and every queued handler's target
  tcp::socket socket_{io_};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::thread thread_;

  // Touched only on thread_ once it runs.
  store_wire::Header header_{};
  std::vector<uint8_t> payload_;
  std::deque<std::shared_ptr<Frame>> out_;
  bool writing_ = false;

  std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;  // guarded by mutex_
  uint64_t next_id_ = 1;                                  // guarded by mutex_
  std::optional<std::string> broken_;                     // guarded by mutex_: why the connection is gone
};

// Reads `total` bytes into `buffer` (which holds what was read so far),
// growing it with what arrives (64 KiB first, then doubling, at most 4 MiB
// a step): a peer announcing 1 GiB and sending 1 byte costs 64 KiB. Calls
// progress() after each step and done(ec) at the end. The caller keeps
// socket and buffer alive until done runs.
template <class Progress, class Done>
void async_read_growing(tcp::socket& socket, std::vector<uint8_t>& buffer, std::size_t total,
                        Progress progress, Done done);

}  // namespace backplane::store_detail

#include <boost/asio/read.hpp>

namespace backplane::store_detail {

template <class Progress, class Done>
void async_read_growing(tcp::socket& socket, std::vector<uint8_t>& buffer, std::size_t total,
                        Progress progress, Done done) {
  constexpr std::size_t kFirstStep = std::size_t{64} << 10;
  constexpr std::size_t kMaxStep = std::size_t{4} << 20;
  const std::size_t have = buffer.size();
  if (have >= total) {
    done(boost::system::error_code{});
    return;
  }
  const std::size_t step = std::min(kMaxStep, std::max(kFirstStep, have));
  const std::size_t next = std::min(total, have + step);
  if (next > buffer.capacity()) buffer.reserve(std::min(total, std::max(next, 2 * buffer.capacity())));
  buffer.resize(next);
  asio::async_read(socket, asio::buffer(buffer.data() + have, next - have),
                   [&socket, &buffer, total, progress = std::move(progress), done = std::move(done)](
                       const boost::system::error_code& ec, std::size_t) mutable {
                     if (ec) {
                       done(ec);
                       return;
                     }
                     progress();
                     async_read_growing(socket, buffer, total, std::move(progress), std::move(done));
                   });
}

}  // namespace backplane::store_detail

#endif  // BACKPLANE_CORE_DISTRIBUTED_STORE_HPP_
