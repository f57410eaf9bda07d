// The rendezvous store's server (see store.hpp): authenticates each
// connection, then serves its requests on one thread, within the limits of
// store_wire::Limits.
#include <backplane/error.hpp>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <charconv>
#include <cstdio>
#include <cstring>

#include <unistd.h>

#include "distributed/store.hpp"

namespace backplane::store_detail {

using namespace store_wire;
using boost::system::error_code;
using std::chrono::milliseconds;

namespace {

std::string endpoint_text(const tcp::socket& socket) {
  error_code ec;
  tcp::endpoint ep = socket.remote_endpoint(ec);
  if (ec) return "an unknown peer";
  return join_address(ep.address().to_string(), ep.port());
}

// This machine's own name: Debian maps it to 127.0.1.1 locally, which says
// nothing about the address other nodes reach it by.
bool is_own_hostname(const std::string& host) {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return false;
  return strcasecmp(name, host.c_str()) == 0;
}

constexpr milliseconds kMaxAcceptBackoff{1000};
// Connections dropped before they authenticated: this many lines of their
// own per interval, then one summary line per interval (DropLog).
constexpr milliseconds kDropLogInterval{10'000};
constexpr std::size_t kDropLogBurst = 5;

// What the store's own structures cost beyond the bytes of keys and values,
// roughly, so that many small entries count too: a stored key (map node,
// Value, shared pointer), a parked request, and each key it waits on.
constexpr std::size_t kEntryBytes = 128;
constexpr std::size_t kWaiterBytes = 256;
constexpr std::size_t kWaiterKeyBytes = 64;

}  // namespace

bool is_loopback(const asio::ip::address& address) {
  if (address.is_v4()) return (address.to_v4().to_uint() >> 24) == 127;
  const asio::ip::address_v6 v6 = address.to_v6();
  if (v6.is_loopback()) return true;
  if (v6.is_v4_mapped()) return (asio::ip::make_address_v4(asio::ip::v4_mapped, v6).to_uint() >> 24) == 127;
  return false;
}

// What a rank holds in the store: the values it set that the store still
// holds (Value::charged) and its parked get/wait requests (Waiter::charged).
// One per rank, kept across its reconnections, so that reconnecting does not
// start a fresh budget; each charge also feeds the store's total account.
struct Server::Account {
  std::size_t bytes = 0;
  std::shared_ptr<Account> total;  // the store's; null for that one itself
  void charge(std::size_t n) {
    bytes += n;
    if (total) total->bytes += n;
  }
  void credit(std::size_t n) {
    bytes -= n;
    if (total) total->bytes -= n;
  }
};

Server::Value::~Value() {
  if (account) account->credit(charged);
}

struct Server::Session {
  Session(tcp::socket s, asio::io_context& io) : socket(std::move(s)), handshake_timer(io), idle_timer(io) {}
  tcp::socket socket;
  asio::steady_timer handshake_timer;
  asio::steady_timer idle_timer;  // armed while a frame is half-read
  std::string peer;               // "ip:port"
  int32_t rank = -1;
  bool authenticated = false;  // proved the secret; counts no more against the unauthenticated cap
  bool greeted = false;        // holds a rank slot
  bool closed = false;
  bool close_after_flush = false;
  bool drop_logged = false;  // its refusal went through drop_log_ already
  std::array<uint8_t, kHelloBytes> hello{};
  std::array<uint8_t, kProofBytes> proof{};
  Nonce server_nonce{};
  Header header{};
  std::vector<uint8_t> payload;
  std::deque<Outgoing> out;
  bool writing = false;
  std::set<WaiterPtr> waiters;       // parked get/wait requests
  std::shared_ptr<Account> account;  // its rank's, once greeted

  std::string who() const { return greeted ? "rank " + std::to_string(rank) + " (" + peer + ")" : peer; }
};

// A parked get or wait: registered under one missing key at a time.
struct Server::Waiter {
  explicit Waiter(asio::io_context& io) : timer(io) {}
  std::weak_ptr<Session> session;
  uint64_t id = 0;
  bool is_get = false;
  std::vector<std::string> keys;
  std::string parked_on;
  asio::steady_timer timer;
  bool finished = false;
  std::shared_ptr<Account> account;  // charged while parked; null once released
  std::size_t charged = 0;
};

Server::Server(ServerOptions options)
    : world_size_(options.world_size),
      secret_(std::move(options.secret)),
      limits_(options.limits),
      total_account_(std::make_shared<Account>()),
      drop_log_(kDropLogInterval, kDropLogBurst) {
  listen(options.host, options.port);
  where_ = "the store on " + bound_;
  log(LogLevel::debug, "rendezvous: " + where_ + " listening" +
                           (loopback_only_ ? " (loopback only)" : " (every interface)") + " for " +
                           std::to_string(world_size_) + " ranks");
  accept();
  thread_ = std::thread([this] { run(); });
}

// Whether to listen on loopback only is decided on the resolved address:
// every spelling of a loopback address ("127.1", "LOCALHOST", "::1",
// "::ffff:127.0.0.1") keeps a single-node job invisible to the network.
// This machine's own name is the exception (see is_own_hostname): it binds
// every interface, as any other address does.
void Server::listen(const std::string& host, uint16_t port) {
  error_code ec;
  tcp::resolver resolver(io_);
  const auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    throw Error(Errc::io_error, "cannot host the rendezvous store: the address '" + host +
                                    "' does not resolve (" + (ec ? ec.message() : "no address") +
                                    "); set MASTER_ADDR to this host's name or IP address");
  }
  bool all_loopback = true;
  bool any_v6 = false;
  for (const auto& r : results) {
    all_loopback = all_loopback && is_loopback(r.endpoint().address());
    any_v6 = any_v6 || r.endpoint().address().is_v6();
  }
  error_code literal_ec;
  asio::ip::make_address(host, literal_ec);
  const bool literal = !literal_ec;
  tcp::endpoint endpoint;
  if (all_loopback && (literal || !is_own_hostname(host))) {
    asio::ip::address a = results.begin()->endpoint().address();
    if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
    endpoint = tcp::endpoint(a, port);
    loopback_only_ = true;
  } else if (literal && any_v6) {
    endpoint = tcp::endpoint(tcp::v6(), port);
  } else {
    endpoint = tcp::endpoint(tcp::v4(), port);
  }
  const std::string shown = join_address(endpoint.address().to_string(), port);
  if (!loopback_only_ && secret_.empty()) {
    throw Error(Errc::invalid_argument,
                "refusing to host the rendezvous store on " + shown + " (MASTER_ADDR '" + host +
                    "' is not a loopback address, so the store would be reachable from the network) "
                    "without a job secret: every rank must prove it belongs to the job. Give all ranks "
                    "the same secret, e.g. export BACKPLANE_JOB_TOKEN=$(openssl rand -hex 32) before "
                    "starting them (with Open MPI: mpirun -x BACKPLANE_JOB_TOKEN), or put it in a file "
                    "only you can read and set BACKPLANE_JOB_TOKEN_FILE to its path");
  }
  acceptor_.open(endpoint.protocol(), ec);
  // SO_REUSEADDR lets a restarted job rebind while old connections linger
  // in TIME_WAIT; Linux still refuses a second listener on the port.
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error(Errc::io_error, "cannot host the rendezvous store on " + shown + ": " + ec.message() +
                                    (ec == asio::error::address_in_use
                                         ? "; another job (or an earlier run of this one) holds the port: "
                                           "choose another MASTER_PORT"
                                         : ""));
  }
  port_ = acceptor_.local_endpoint().port();
  bound_ = join_address(endpoint.address().to_string(), port_);
}

Server::~Server() {
  asio::post(io_, [this] { close_or_linger(); });
  if (thread_.joinable()) thread_.join();
  // Handlers still queued hold the last references to closed sessions; the
  // io_context's destructor (it is the first member) destroys them.
}

void Server::run() {
  for (;;) {
    try {
      io_.run();
      return;
    } catch (const std::exception& e) {
      // Handlers catch their own errors; this keeps the store alive if one slipped through.
      log(LogLevel::error, where_ + ": unexpected error in the server thread: " + e.what());
    }
  }
}

// The destructor's first step: shutdown now, or (linger_on_close) once the
// ranks still connected have gone or limits.failed_linger has passed.
void Server::close_or_linger() {
  if (!linger_.load(std::memory_order_relaxed) || limits_.failed_linger.count() == 0 || ranks_.empty())
    return shutdown();
  lingering_ = true;
  log(LogLevel::debug, where_ + ": this rank failed; serving " + std::to_string(ranks_.size()) +
                           " rank(s) still connected for up to " +
                           std::to_string(limits_.failed_linger.count()) +
                           " ms, so that they can read why (BACKPLANE_STORE_FAILED_LINGER_MS)");
  linger_timer_.expires_after(limits_.failed_linger);
  linger_timer_.async_wait([this](const error_code& ec) {
    if (ec || stopping_) return;
    std::string left;
    for (const int32_t r : ranks_) left += (left.empty() ? "" : ", ") + std::to_string(r);
    log(LogLevel::info, where_ + ": closing after " + std::to_string(limits_.failed_linger.count()) +
                            " ms with rank(s) " + left + " still connected");
    shutdown();
  });
}

void Server::shutdown() {
  stopping_ = true;
  error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  linger_timer_.cancel();
  drop_log_timer_.cancel();
  if (auto line = drop_log_.summary(Clock::now())) log(line->level, where_ + ": " + line->text);
  for (const auto& s : sessions_) {
    s->closed = true;
    s->handshake_timer.cancel();
    s->idle_timer.cancel();
    s->socket.close(ignored);  // clients see EOF: "did rank 0 exit?"
    for (const auto& w : s->waiters) w->timer.cancel();
    s->waiters.clear();
  }
  sessions_.clear();
  parked_.clear();
  io_.stop();
}

void Server::accept() {
  acceptor_.async_accept([this](const error_code& ec, tcp::socket socket) {
    if (stopping_) return;
    if (ec) {
      on_accept_error(ec);
      return;
    }
    if (accept_backoff_.count() != 0) {
      log(LogLevel::warning, where_ + ": accepting connections again");
      accept_backoff_ = milliseconds(0);
    }
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto s = std::make_shared<Session>(std::move(socket), io_);
    s->peer = endpoint_text(s->socket);
    sessions_.insert(s);
    ++unauthenticated_;
    start(s);
    if (unauthenticated_ >= limits_.max_unauthenticated) {
      // New connections wait in the listen backlog until one of these
      // proves the secret or is dropped at its handshake deadline.
      if (!accept_paused_) {
        log(LogLevel::warning, where_ + ": " + std::to_string(unauthenticated_) +
                                   " connections have not authenticated yet (the limit, "
                                   "BACKPLANE_STORE_MAX_UNAUTHENTICATED); accepting pauses until one "
                                   "authenticates or is dropped");
      }
      accept_paused_ = true;
      return;
    }
    accept();
  });
}

// Out of file descriptors (EMFILE, ENFILE) or another transient failure:
// retry on a timer that backs off to kMaxAcceptBackoff, never spin or stop.
void Server::on_accept_error(const error_code& ec) {
  if (accept_backoff_.count() == 0) {
    log(LogLevel::warning,
        where_ + ": accepting a connection failed: " + ec.message() +
            (ec.value() == EMFILE || ec.value() == ENFILE ? " (out of file descriptors; raise `ulimit -n`)"
                                                          : "") +
            "; retrying with backoff");
  }
  accept_backoff_ = std::min(kMaxAcceptBackoff, std::max(milliseconds(10), accept_backoff_ * 2));
  accept_retry_.expires_after(accept_backoff_);
  accept_retry_.async_wait([this](const error_code& e) {
    if (!e && !stopping_) accept();
  });
}

void Server::leave_unauthenticated(const SessionPtr& s) {
  if (s->authenticated) return;
  s->authenticated = true;  // from here on it counts no more against the cap
  --unauthenticated_;
  if (accept_paused_ && unauthenticated_ < limits_.max_unauthenticated && !stopping_) {
    accept_paused_ = false;
    accept();
  }
}

void Server::start(const SessionPtr& s) {
  s->handshake_timer.expires_after(limits_.handshake_timeout);
  s->handshake_timer.async_wait([this, s](const error_code& ec) {
    if (ec || stopping_ || s->closed || s->greeted) return;
    close(s, LogLevel::warning,
          "did not complete the authenticated handshake within " + seconds_text(limits_.handshake_timeout) +
              " (BACKPLANE_STORE_HANDSHAKE_TIMEOUT_MS); closed");
  });
  asio::async_read(
      s->socket, asio::buffer(s->hello.data(), kHelloPrefixBytes),
      [this, s](const error_code& ec, std::size_t n) {
        if (stopping_ || s->closed) return;
        if (ec) {
          close(s, n == 0 ? LogLevel::debug : LogLevel::warning,
                n == 0 ? "closed the connection before the handshake"
                       : "sent a truncated handshake (" + std::to_string(n) + " bytes)");
          return;
        }
        const uint8_t* h = s->hello.data();
        if (std::memcmp(h, kMagic.data(), 4) != 0) {
          close(s, LogLevel::warning,
                "is not a backplane store client (its first bytes are not the handshake); closed");
          return;
        }
        const uint16_t version = get_u16(h + 4);
        if (version != kProtocolVersion) {
          // Says nothing about the job: world_size 0.
          reject(s, Verdict::version_mismatch,
                 "speaks store protocol version " + std::to_string(version) + ", this store version " +
                     std::to_string(kProtocolVersion) + "; every rank must run the same backplane version",
                 0);
          return;
        }
        if (get_u16(h + 6) != 0) {
          close(s, LogLevel::warning, "sent a handshake with nonzero reserved bits; closed");
          return;
        }
        asio::async_read(s->socket, asio::buffer(s->hello.data() + kHelloPrefixBytes, kNonceBytes),
                         [this, s](const error_code& ec2, std::size_t) {
                           if (stopping_ || s->closed) return;
                           if (ec2) {
                             close(s, LogLevel::warning, "sent a truncated handshake");
                             return;
                           }
                           on_hello(s);
                         });
      });
}

// Answers the hello with the server's nonce and its proof of the secret,
// then waits for the client's proof.
void Server::on_hello(const SessionPtr& s) {
  Nonce client_nonce{};
  std::memcpy(client_nonce.data(), s->hello.data() + kHelloPrefixBytes, kNonceBytes);
  try {
    s->server_nonce = random_nonce();
    const auto challenge =
        make_challenge(s->server_nonce, server_proof(secret_, client_nonce, s->server_nonce));
    send_raw(s, challenge.data(), challenge.size());
  } catch (const Error& e) {
    close(s, LogLevel::error, std::string("could not be answered: ") + e.what());
    return;
  }
  asio::async_read(s->socket, asio::buffer(s->proof), [this, s](const error_code& ec, std::size_t n) {
    if (stopping_ || s->closed) return;
    if (ec) {
      // A client holding another secret stops here (it could not verify our proof).
      close(s, LogLevel::warning,
            n == 0 ? "closed the connection during authentication (a rank with another job secret, "
                     "or not a rank of this job)"
                   : "sent a truncated authentication proof");
      return;
    }
    on_proof(s);
  });
}

void Server::on_proof(const SessionPtr& s) {
  Nonce client_nonce{};
  std::memcpy(client_nonce.data(), s->hello.data() + kHelloPrefixBytes, kNonceBytes);
  const uint8_t* p = s->proof.data();
  const auto rank = static_cast<int32_t>(get_u32(p + kMacBytes));
  const auto world_size = static_cast<int32_t>(get_u32(p + kMacBytes + 4));
  Mac expected{};
  try {
    expected = client_proof(secret_, client_nonce, s->server_nonce, rank, world_size);
  } catch (const Error& e) {
    close(s, LogLevel::error, std::string("could not be authenticated: ") + e.what());
    return;
  }
  if (!same_mac(expected, p)) {
    // Nothing is sent back: a client without the secret learns nothing.
    close(s, LogLevel::warning, "failed to prove the job secret (BACKPLANE_JOB_TOKEN); closed");
    return;
  }
  leave_unauthenticated(s);
  if (world_size != world_size_) {
    reject(s, Verdict::world_size_mismatch,
           "rank " + std::to_string(rank) + " says world_size " + std::to_string(world_size) +
               " but this store was started with world_size " + std::to_string(world_size_),
           world_size_);
    return;
  }
  if (rank < 0 || rank >= world_size_) {
    reject(s, Verdict::rank_out_of_range,
           "rank " + std::to_string(rank) + " is out of range for world_size " + std::to_string(world_size_),
           world_size_);
    return;
  }
  if (ranks_.count(rank) != 0) {
    reject(s, Verdict::duplicate_rank, "rank " + std::to_string(rank) + " is already connected", world_size_);
    return;
  }
  s->handshake_timer.cancel();
  s->greeted = true;
  s->rank = rank;
  ranks_.insert(rank);
  std::shared_ptr<Account>& account = accounts_[rank];
  if (!account) {
    account = std::make_shared<Account>();
    account->total = total_account_;
  }
  s->account = account;
  log(LogLevel::debug, where_ + ": " + s->who() + " authenticated and connected");
  const auto verdict = make_verdict(Verdict::accepted, world_size_);
  send_raw(s, verdict.data(), verdict.size());
  read_frame(s);
}

// Answers the handshake with the verdict, then closes once it is written.
void Server::reject(const SessionPtr& s, Verdict verdict, std::string why, int32_t world_size) {
  std::string line = "refused the connection from " + s->peer + ": " + why;
  if (s->authenticated) {
    log(LogLevel::warning, where_ + ": " + line);
  } else {
    s->drop_logged = true;
    log_drop(LogLevel::warning, std::move(line));
  }
  const auto v = make_verdict(verdict, world_size);
  s->close_after_flush = true;
  send_raw(s, v.data(), v.size());
}

// Waits for the first byte of a frame without a deadline (a rank may be
// quiet for hours), then reads the rest of it under the idle deadline.
void Server::read_frame(const SessionPtr& s) {
  asio::async_read(s->socket, asio::buffer(s->header.data(), 1),
                   [this, s](const error_code& ec, std::size_t) {
                     if (stopping_ || s->closed) return;
                     if (ec) {
                       if (ec == asio::error::eof || ec == asio::error::connection_reset) {
                         close(s, LogLevel::debug, "disconnected");
                       } else {
                         close(s, LogLevel::debug, "connection failed: " + ec.message());
                       }
                       return;
                     }
                     read_header_rest(s);
                   });
}

void Server::arm_idle(const SessionPtr& s, const char* what) {
  s->idle_timer.expires_after(limits_.frame_idle_timeout);
  s->idle_timer.async_wait([this, s, what](const error_code& ec) {
    if (ec || stopping_ || s->closed) return;
    close(s, LogLevel::warning,
          std::string("sent part of a ") + what + " and then nothing for " +
              seconds_text(limits_.frame_idle_timeout) + " (BACKPLANE_STORE_FRAME_IDLE_TIMEOUT_MS); closed");
  });
}

void Server::read_header_rest(const SessionPtr& s) {
  arm_idle(s, "frame header");
  asio::async_read(s->socket, asio::buffer(s->header.data() + 1, kHeaderBytes - 1),
                   [this, s](const error_code& ec, std::size_t n) {
                     if (stopping_ || s->closed) return;
                     if (ec) {
                       bad_frame(s, "a truncated frame header (" + std::to_string(n + 1) + " of " +
                                        std::to_string(kHeaderBytes) + " bytes)");
                       return;
                     }
                     on_header(s);
                   });
}

void Server::on_header(const SessionPtr& s) {
  const DecodedHeader d = decode_request_header(s->header.data(), limits_);
  if (!d.header) {
    bad_frame(s, d.error);
    return;
  }
  const Op op = *to_op(d.header->kind);
  const std::size_t bytes = d.header->payload_bytes;
  // A set's payload is what the store will hold: checked before a byte of it
  // is allocated. Other requests are bounded by their frame limits and
  // checked once decoded (a parked get or wait is charged in park()).
  if (op == Op::set) {
    if (auto why = over_limit(*s, bytes, "a set of " + std::to_string(bytes) + " bytes")) {
      close(s, LogLevel::error, *why + "; closed");
      return;
    }
  }
  s->payload.clear();
  read_payload(s, op, d.header->id, bytes);
}

void Server::read_payload(const SessionPtr& s, Op op, uint64_t id, std::size_t total) {
  async_read_growing(
      s->socket, s->payload, total, [this, s] { arm_idle(s, "frame"); },
      [this, s, op, id, total](const error_code& ec) {
        if (stopping_ || s->closed) return;
        s->idle_timer.cancel();
        if (ec) {
          bad_frame(s, std::string("a truncated ") + op_name(op) + " frame (announced " +
                           std::to_string(total) + " bytes; " + ec.message() + ")");
          return;
        }
        on_request(s, op, id);
      });
}

void Server::on_request(const SessionPtr& s, Op op, uint64_t id) {
  try {
    dispatch(s, op, id);
  } catch (const std::bad_alloc&) {
    close(s, LogLevel::error,
          std::string("out of memory serving a ") + op_name(op) + " of " + std::to_string(s->payload.size()) +
              " bytes; closed its connection");
    return;
  }
  s->payload = {};
  if (!s->closed) read_frame(s);
}

void Server::dispatch(const SessionPtr& s, Op op, uint64_t id) {
  DecodedRequest decoded = decode_request(op, s->payload);
  if (!decoded.request) {
    bad_frame(s, std::string("a malformed ") + op_name(op) + " request: " + decoded.error);
    return;
  }
  Request& r = *decoded.request;
  switch (op) {
    case Op::set: {
      auto value = std::make_shared<Value>();
      value->offset = r.value_offset;
      value->bytes = std::move(s->payload);
      value->account = s->account;
      value->charged = value->bytes.size() + r.keys.front().size() + kEntryBytes;
      s->account->charge(value->charged);
      data_[r.keys.front()] = std::move(value);
      reply(s, Reply::ok, id);
      on_key_set(r.keys.front());
      return;
    }
    case Op::get:
    case Op::wait: {
      if (!first_missing(r.keys)) {
        if (op == Op::get) {
          reply(s, Reply::ok, id, {}, data_.at(r.keys.front()));
        } else {
          reply(s, Reply::ok, id);
        }
        return;
      }
      park(s, id, op == Op::get, std::move(r.keys), r.timeout_ms);
      return;
    }
    case Op::add: {
      const std::string& key = r.keys.front();
      int64_t current = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        const Value& v = *it->second;
        const char* first = reinterpret_cast<const char*>(v.data());
        auto [end, ec] = std::from_chars(first, first + v.size(), current);
        if (v.size() == 0 || ec != std::errc() || end != first + v.size()) {
          std::string text = "the value at " + quote(key) + " is not a decimal integer (" +
                             std::to_string(v.size()) + " bytes); add() needs a key that only add() wrote";
          reply(s, Reply::refused, id, std::vector<uint8_t>(text.begin(), text.end()));
          return;
        }
      }
      int64_t next = 0;
      if (__builtin_add_overflow(current, r.delta, &next)) {
        std::string text = "adding " + std::to_string(r.delta) + " to " + std::to_string(current) + " at " +
                           quote(key) + " overflows a 64-bit integer";
        reply(s, Reply::refused, id, std::vector<uint8_t>(text.begin(), text.end()));
        return;
      }
      const std::string text = std::to_string(next);
      const std::size_t charge = text.size() + key.size() + kEntryBytes;
      if (auto why = over_limit(*s, charge, "an add to " + quote(key))) {
        refuse(s, id, *why);
        return;
      }
      auto value = std::make_shared<Value>();
      value->bytes.assign(text.begin(), text.end());
      value->account = s->account;
      value->charged = charge;
      s->account->charge(charge);
      data_[key] = std::move(value);
      PayloadWriter out(8);
      out.u64(static_cast<uint64_t>(next));
      reply(s, Reply::ok, id, out.take());
      on_key_set(key);
      return;
    }
    case Op::check:
      reply(s, Reply::ok, id, {static_cast<uint8_t>(first_missing(r.keys) ? 0 : 1)});
      return;
    case Op::remove:
      reply(s, Reply::ok, id, {static_cast<uint8_t>(data_.erase(r.keys.front()) != 0 ? 1 : 0)});
      return;
  }
}

// Why `more` bytes for `what` would take s's rank or the whole store past
// its limit, with the remedy; nothing when they fit.
std::optional<std::string> Server::over_limit(const Session& s, std::size_t more,
                                              const std::string& what) const {
  if (s.account->bytes + more > limits_.max_client_bytes) {
    return "would hold " + std::to_string(s.account->bytes + more) + " bytes in the store with " + what +
           " (it holds " + std::to_string(s.account->bytes) +
           ": the values it set and its parked get/wait requests, across its connections); the limit "
           "per rank is " +
           std::to_string(limits_.max_client_bytes) +
           " bytes: remove keys no longer needed, wait on fewer keys at once, or raise "
           "BACKPLANE_STORE_MAX_CLIENT_BYTES where the store is hosted (rank 0)";
  }
  if (total_account_->bytes + more > limits_.max_total_bytes) {
    return "would take the store to " + std::to_string(total_account_->bytes + more) + " bytes with " + what +
           " (it holds " + std::to_string(total_account_->bytes) +
           " for all ranks); the limit of the store is " + std::to_string(limits_.max_total_bytes) +
           " bytes: remove keys no longer needed, or raise BACKPLANE_STORE_MAX_TOTAL_BYTES where the "
           "store is hosted (rank 0)";
  }
  return std::nullopt;
}

// Answers request `id` with a refusal (the client throws invalid_argument
// with `why`); the connection stays open.
void Server::refuse(const SessionPtr& s, uint64_t id, const std::string& why) {
  log(LogLevel::warning, where_ + ": refused a request of " + s->who() + ": it " + why);
  std::string text = "the store refused: this rank " + why;
  if (text.size() > kMaxReplyTextBytes) text.resize(kMaxReplyTextBytes);
  reply(s, Reply::refused, id, std::vector<uint8_t>(text.begin(), text.end()));
}

void Server::bad_frame(const SessionPtr& s, const std::string& why) {
  close(s, LogLevel::warning, "sent " + why + "; closed the connection");
}

void Server::close(const SessionPtr& s, LogLevel level, const std::string& why) {
  if (s->closed) return;
  s->closed = true;
  if (s->authenticated || s->drop_logged) {
    log(level, where_ + ": " + s->who() + " " + why);
  } else {
    log_drop(level, s->who() + " " + why);
  }
  error_code ignored;
  s->handshake_timer.cancel();
  s->idle_timer.cancel();
  s->socket.close(ignored);
  for (const auto& w : std::set<WaiterPtr>(s->waiters)) {
    w->finished = true;
    w->timer.cancel();
    unpark(w);
  }
  // s->out stays: a write in flight still points into it until its handler runs.
  if (s->greeted) ranks_.erase(s->rank);
  leave_unauthenticated(s);
  sessions_.erase(s);
  if (lingering_ && ranks_.empty())  // the last rank that could need the store has gone
    asio::post(io_, [this] {
      if (!stopping_) shutdown();
    });
}

// A connection dropped before it proved the secret: logged through
// drop_log_, so that a flood of them is a line per interval, not per
// connection. The timer is armed by the first drop that is only counted.
void Server::log_drop(LogLevel level, std::string line) {
  if (auto own = drop_log_.drop(Clock::now(), level, std::move(line))) {
    log(own->level, where_ + ": " + own->text);
    return;
  }
  arm_drop_log();
}

void Server::arm_drop_log() {
  if (drop_log_armed_ || stopping_ || !drop_log_.pending()) return;
  drop_log_armed_ = true;
  drop_log_timer_.expires_at(drop_log_.due());
  drop_log_timer_.async_wait([this](const error_code& ec) {
    drop_log_armed_ = false;
    if (ec || stopping_) return;
    if (auto line = drop_log_.summary(Clock::now())) log(line->level, where_ + ": " + line->text);
  });
}

void Server::reply(const SessionPtr& s, Reply kind, uint64_t id, std::vector<uint8_t> body, ValuePtr value) {
  Outgoing o;
  const std::size_t bytes = body.size() + (value ? value->size() : 0);
  o.header = make_header(bytes, static_cast<uint8_t>(kind), id);
  o.body = std::move(body);
  o.value = std::move(value);
  send(s, std::move(o));
}

void Server::send_raw(const SessionPtr& s, const uint8_t* data, std::size_t n) {
  Outgoing o;
  o.framed = false;
  o.body.assign(data, data + n);
  send(s, std::move(o));
}

void Server::send(const SessionPtr& s, Outgoing o) {
  if (s->closed) return;
  s->out.push_back(std::move(o));
  if (!s->writing) flush(s);
}

void Server::flush(const SessionPtr& s) {
  s->writing = true;
  Outgoing& o = s->out.front();  // deque: stays put while later replies are queued
  const std::array<asio::const_buffer, 3> buffers{
      o.framed ? asio::buffer(o.header) : asio::const_buffer(),
      asio::buffer(o.body),
      o.value ? asio::buffer(o.value->data(), o.value->size()) : asio::const_buffer(),
  };
  asio::async_write(s->socket, buffers, [this, s](const error_code& ec, std::size_t) {
    if (stopping_ || s->closed) return;
    s->writing = false;
    if (ec) {
      close(s, LogLevel::debug, "could not be written to: " + ec.message());
      return;
    }
    s->out.pop_front();
    if (!s->out.empty()) {
      flush(s);
    } else if (s->close_after_flush) {
      close(s, LogLevel::debug, "was sent its handshake verdict");
    }
  });
}

std::optional<std::string> Server::first_missing(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (data_.count(k) == 0) return k;
  return std::nullopt;
}

void Server::park(const SessionPtr& s, uint64_t id, bool is_get, std::vector<std::string> keys,
                  uint64_t timeout_ms) {
  std::size_t charge = kWaiterBytes;
  for (const auto& k : keys) charge += k.size() + kWaiterKeyBytes;
  if (auto why = over_limit(*s, charge,
                            std::string("a parked ") + (is_get ? "get" : "wait") + " on " +
                                std::to_string(keys.size()) + (keys.size() == 1 ? " key" : " keys"))) {
    refuse(s, id, *why);
    return;
  }
  auto w = std::make_shared<Waiter>(io_);
  w->account = s->account;
  w->charged = charge;
  s->account->charge(charge);
  w->session = s;
  w->id = id;
  w->is_get = is_get;
  w->keys = std::move(keys);
  w->parked_on = *first_missing(w->keys);
  parked_[w->parked_on].push_back(w);
  s->waiters.insert(w);
  // Compared unsigned: a wire value past int64's range must not turn into a
  // negative duration (nor overflow when asio converts it to nanoseconds).
  if (timeout_ms < static_cast<uint64_t>(kForever.count())) {
    w->timer.expires_after(milliseconds(timeout_ms));
    w->timer.async_wait([this, w](const error_code& ec) {
      if (ec || stopping_ || w->finished) return;
      expire(w);
    });
  }
}

void Server::unpark(const WaiterPtr& w) {
  auto it = parked_.find(w->parked_on);
  if (it != parked_.end()) {
    it->second.remove(w);
    if (it->second.empty()) parked_.erase(it);
  }
  if (auto s = w->session.lock()) s->waiters.erase(w);
  release(w);
}

// Gives back what a parked request was charged; once, however it ends.
void Server::release(const WaiterPtr& w) {
  if (!w->account) return;
  w->account->credit(w->charged);
  w->account.reset();
}

// Wakes the waiters parked on `key`; those still missing another key park on it.
void Server::on_key_set(const std::string& key) {
  auto it = parked_.find(key);
  if (it == parked_.end()) return;
  std::list<WaiterPtr> woken = std::move(it->second);
  parked_.erase(it);
  for (const auto& w : woken) {
    if (w->finished) continue;
    if (auto missing = first_missing(w->keys)) {
      w->parked_on = *missing;
      parked_[*missing].push_back(w);
    } else {
      complete(w);
    }
  }
}

void Server::complete(const WaiterPtr& w) {
  w->finished = true;
  w->timer.cancel();
  release(w);
  auto s = w->session.lock();
  if (!s) return;
  s->waiters.erase(w);
  if (w->is_get) {
    reply(s, Reply::ok, w->id, {}, data_.at(w->keys.front()));
  } else {
    reply(s, Reply::ok, w->id);
  }
}

void Server::expire(const WaiterPtr& w) {
  w->finished = true;
  unpark(w);
  auto s = w->session.lock();
  if (!s) return;
  // The missing keys, for the client's message; bounded so the reply stays small.
  std::string text;
  std::size_t shown = 0, missing = 0;
  for (const auto& k : w->keys) {
    if (data_.count(k) != 0) continue;
    ++missing;
    if (shown < 8 && text.size() < kMaxReplyTextBytes / 2) {
      text += (shown ? ", " : "") + quote(k);
      ++shown;
    }
  }
  if (missing > shown) text += " and " + std::to_string(missing - shown) + " more";
  reply(s, Reply::timed_out, w->id, std::vector<uint8_t>(text.begin(), text.end()));
}

}  // namespace backplane::store_detail
