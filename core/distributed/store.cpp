// The TCP rendezvous store behind make_tcp_store: a server that the hosting
// rank runs on its own thread, and the client that every rank (the host too)
// talks to it through. The wire protocol is described below.
#include <backplane/error.hpp>
#include <backplane/log.hpp>
#include <backplane/rendezvous.hpp>

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

#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

namespace backplane {

Store::~Store() = default;

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- Wire protocol ---------------------------------------------------------
// Integers are big-endian. A connection opens with one fixed-size exchange:
//   hello   (client, 16 bytes): "BPST" | u16 version | u16 0 | i32 rank | i32 world_size
//   welcome (server, 16 bytes): "BPST" | u16 version | u16 verdict | i32 world_size | u32 0
// and then carries frames both ways, a 16-byte header and a payload:
//   u32 payload bytes | u8 kind | u8[3] 0 | u64 request id
// Requests (kind = Op) and their payloads:
//   set     u32 klen, key, value (the rest of the payload)
//   get     u64 timeout_ms, u32 klen, key
//   wait    u64 timeout_ms, u32 count, count x (u32 klen, key)
//   add     i64 delta, u32 klen, key
//   check   u32 count, count x (u32 klen, key)
//   remove  u32 klen, key
// Replies (kind = Reply) carry their request's id: get and wait park on the
// server without blocking the connection, so replies may come out of order.
//   ok        set, wait: empty; get: the value; add: i64; check, remove: u8 0|1
//   timed_out the missing keys, as text
//   refused   why, as text (add on a value that is not an integer)
// A timeout_ms of kNoTimeout waits forever. Anything else that does not fit
// this grammar or the limits below closes the connection.
constexpr std::array<uint8_t, 4> kMagic{'B', 'P', 'S', 'T'};
constexpr uint16_t kProtocolVersion = 1;
constexpr std::size_t kHelloBytes = 16;
constexpr std::size_t kHeaderBytes = 16;
constexpr std::size_t kMaxKeyBytes = 4096;
constexpr std::size_t kMaxValueBytes = std::size_t{1} << 30;
constexpr std::size_t kMaxKeysPerCall = 65536;
constexpr std::size_t kMaxKeyListBytes = std::size_t{16} << 20;
constexpr std::size_t kMaxReplyTextBytes = std::size_t{64} << 10;
// Payloads up to kEagerReadBytes are read into one allocation of their
// announced size. Larger ones grow with what actually arrives, so that a
// peer announcing 1 GiB and sending little makes us allocate little.
constexpr std::size_t kEagerReadBytes = std::size_t{64} << 20;
constexpr std::size_t kReadChunkBytes = std::size_t{4} << 20;
constexpr uint64_t kNoTimeout = UINT64_MAX;
// Longer timeouts mean "forever"; also keeps deadline arithmetic in range.
constexpr milliseconds kForever{milliseconds::rep{10} * 365 * 24 * 3600 * 1000};
// How much longer than a get/wait's own timeout a client waits for the
// server's timed_out reply before it gives up on the server.
constexpr milliseconds kReplyGrace{2000};

enum class Op : uint8_t { set = 1, get = 2, wait = 3, add = 4, check = 5, remove = 6 };
enum class Reply : uint8_t { ok = 0x80, timed_out = 0x81, refused = 0x82 };
enum class Verdict : uint16_t {
  accepted = 0,
  version_mismatch = 1,
  world_size_mismatch = 2,
  rank_out_of_range = 3,
  duplicate_rank = 4,
};

const char* op_name(Op op) {
  switch (op) {
    case Op::set:
      return "set";
    case Op::get:
      return "get";
    case Op::wait:
      return "wait";
    case Op::add:
      return "add";
    case Op::check:
      return "check";
    case Op::remove:
      return "remove";
  }
  return "?";
}

std::optional<Op> to_op(uint8_t kind) {
  if (kind >= static_cast<uint8_t>(Op::set) && kind <= static_cast<uint8_t>(Op::remove)) return Op{kind};
  return std::nullopt;
}

std::optional<Reply> to_reply(uint8_t kind) {
  if (kind >= static_cast<uint8_t>(Reply::ok) && kind <= static_cast<uint8_t>(Reply::refused))
    return Reply{kind};
  return std::nullopt;
}

std::size_t max_payload(Op op) {
  switch (op) {
    case Op::set:
      return 4 + kMaxKeyBytes + kMaxValueBytes;
    case Op::get:
    case Op::add:
      return 12 + kMaxKeyBytes;
    case Op::remove:
      return 4 + kMaxKeyBytes;
    case Op::wait:
      return 12 + kMaxKeyListBytes;
    case Op::check:
      return 4 + kMaxKeyListBytes;
  }
  return 0;
}

void put_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (56 - 8 * i));
}
uint16_t get_u16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

using Hello = std::array<uint8_t, kHelloBytes>;
using Header = std::array<uint8_t, kHeaderBytes>;

Hello make_hello(uint16_t version, uint16_t word, int32_t a, int32_t b) {
  Hello h{};
  std::memcpy(h.data(), kMagic.data(), 4);
  put_u16(h.data() + 4, version);
  put_u16(h.data() + 6, word);
  put_u32(h.data() + 8, static_cast<uint32_t>(a));
  put_u32(h.data() + 12, static_cast<uint32_t>(b));
  return h;
}

Header make_header(std::size_t payload_bytes, uint8_t kind, uint64_t id) {
  Header h{};
  put_u32(h.data(), static_cast<uint32_t>(payload_bytes));
  h[4] = kind;
  put_u64(h.data() + 8, id);
  return h;
}

// Appends big-endian fields to a payload.
class PayloadWriter {
 public:
  explicit PayloadWriter(std::size_t reserve = 0) { bytes_.reserve(reserve); }
  void u8(uint8_t v) { bytes_.push_back(v); }
  void u32(uint32_t v) {
    uint8_t b[4];
    put_u32(b, v);
    bytes_.insert(bytes_.end(), b, b + 4);
  }
  void u64(uint64_t v) {
    uint8_t b[8];
    put_u64(b, v);
    bytes_.insert(bytes_.end(), b, b + 8);
  }
  void key(std::string_view k) {
    u32(static_cast<uint32_t>(k.size()));
    raw(k.data(), k.size());
  }
  void raw(const void* data, std::size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + n);
  }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads big-endian fields from a payload; any read past the end, or a key
// outside 1..kMaxKeyBytes, marks it failed with the reason.
class PayloadReader {
 public:
  explicit PayloadReader(const std::vector<uint8_t>& bytes) : p_(bytes.data()), n_(bytes.size()) {}
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::size_t remaining() const { return n_ - pos_; }

  uint32_t u32() { return need(4, "a 4-byte field") ? advance_u32() : 0; }
  uint64_t u64() { return need(8, "an 8-byte field") ? advance_u64() : 0; }
  std::string key() {
    uint32_t len = u32();
    if (!ok()) return {};
    if (len == 0 || len > kMaxKeyBytes) {
      fail("a key of " + std::to_string(len) + " bytes (keys are 1.." + std::to_string(kMaxKeyBytes) +
           " bytes)");
      return {};
    }
    if (!need(len, "a key")) return {};
    std::string k(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return k;
  }
  std::vector<std::string> key_list() {
    uint32_t count = u32();
    if (!ok()) return {};
    if (count > kMaxKeysPerCall) {
      fail("a list of " + std::to_string(count) + " keys (at most " + std::to_string(kMaxKeysPerCall) + ")");
      return {};
    }
    std::vector<std::string> keys;
    keys.reserve(std::min<std::size_t>(count, remaining() / 5 + 1));
    for (uint32_t i = 0; i < count && ok(); ++i) keys.push_back(key());
    return keys;
  }
  void expect_end() {
    if (ok() && pos_ != n_) fail(std::to_string(n_ - pos_) + " unexpected trailing bytes");
  }

 private:
  bool need(std::size_t bytes, const char* what) {
    if (!ok()) return false;
    if (n_ - pos_ < bytes) {
      fail(std::string("truncated payload: ") + what + " needs " + std::to_string(bytes) + " bytes, " +
           std::to_string(n_ - pos_) + " left");
      return false;
    }
    return true;
  }
  uint32_t advance_u32() {
    uint32_t v = get_u32(p_ + pos_);
    pos_ += 4;
    return v;
  }
  uint64_t advance_u64() {
    uint64_t v = get_u64(p_ + pos_);
    pos_ += 8;
    return v;
  }
  void fail(std::string why) {
    if (ok()) error_ = std::move(why);
  }

  const uint8_t* p_;
  std::size_t n_;
  std::size_t pos_ = 0;
  std::string error_;
};

// Reads `total` bytes into `buffer` (which holds what was read so far). The caller keeps socket and buffer
// alive until `done` runs (its handlers own the session, or the client outlives its io_context thread).
template <class Done>
void async_read_chunked(tcp::socket& socket, std::vector<uint8_t>& buffer, std::size_t total, Done done) {
  const std::size_t have = buffer.size();
  if (have >= total) {
    done(error_code{});
    return;
  }
  std::size_t next = std::min(total, have + kReadChunkBytes);
  if (total <= kEagerReadBytes) next = total;
  // Grow capacity ourselves: never past `total`, doubling otherwise.
  if (next > buffer.capacity()) buffer.reserve(std::min(total, std::max(next, 2 * buffer.capacity())));
  buffer.resize(next);
  asio::async_read(
      socket, asio::buffer(buffer.data() + have, next - have),
      [&socket, &buffer, total, done = std::move(done)](const error_code& ec, std::size_t) mutable {
        if (ec) {
          done(ec);
          return;
        }
        async_read_chunked(socket, buffer, total, std::move(done));
      });
}

// "0.2 s", "1.25 s", "300 s"
std::string seconds_text(milliseconds ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ms.count()) / 1000.0);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s + " s";
}

// A key for messages: quoted, non-printable bytes escaped, long keys cut.
std::string quote(std::string_view key) {
  constexpr std::size_t kShown = 120;
  std::string out = "'";
  for (std::size_t i = 0; i < key.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
  }
  if (key.size() > kShown) out += "...(" + std::to_string(key.size()) + " bytes)";
  return out + "'";
}

std::string join_address(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string endpoint_text(const tcp::socket& socket) {
  error_code ec;
  tcp::endpoint ep = socket.remote_endpoint(ec);
  if (ec) return "an unknown peer";
  return join_address(ep.address().to_string(), ep.port());
}

// Timeouts on the wire: milliseconds, or kNoTimeout for "forever".
uint64_t wire_timeout(milliseconds timeout) {
  return timeout >= kForever ? kNoTimeout : static_cast<uint64_t>(timeout.count());
}

// ---- Server ----------------------------------------------------------------

// A stored value: bytes[offset..] of the set request's payload, kept as it
// arrived, so that neither storing nor serving it copies the bytes.
struct Value {
  std::vector<uint8_t> bytes;
  std::size_t offset = 0;
  const uint8_t* data() const { return bytes.data() + offset; }
  std::size_t size() const { return bytes.size() - offset; }
};
using ValuePtr = std::shared_ptr<const Value>;

class Server {
 public:
  explicit Server(const TcpStoreOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const { return port_; }

 private:
  struct Waiter;

  struct Outgoing {
    bool framed = true;  // false only for the handshake verdict, which has no frame header
    Header header{};
    std::vector<uint8_t> body;
    ValuePtr value;  // a stored value, sent from the store without a copy
  };

  struct Session {
    Session(tcp::socket s, asio::io_context& io) : socket(std::move(s)), hello_timer(io) {}
    tcp::socket socket;
    asio::steady_timer hello_timer;
    std::string peer;  // "ip:port"
    int32_t rank = -1;
    bool greeted = false;
    bool closed = false;
    bool close_after_flush = false;
    Hello hello{};
    Header header{};
    std::vector<uint8_t> payload;
    std::deque<Outgoing> out;
    bool writing = false;
    std::set<std::shared_ptr<Waiter>> waiters;  // parked get/wait requests

    std::string who() const { return greeted ? "rank " + std::to_string(rank) + " (" + peer + ")" : peer; }
  };
  using SessionPtr = std::shared_ptr<Session>;

  // A parked get or wait: registered under one missing key at a time.
  struct Waiter {
    explicit Waiter(asio::io_context& io) : timer(io) {}
    std::weak_ptr<Session> session;
    uint64_t id = 0;
    bool is_get = false;
    std::vector<std::string> keys;
    std::string parked_on;
    asio::steady_timer timer;
    bool finished = false;
  };
  using WaiterPtr = std::shared_ptr<Waiter>;

  void listen(const std::string& host, uint16_t port);
  void run();
  void accept();
  void start(const SessionPtr& s);
  void on_hello(const SessionPtr& s);
  void reject(const SessionPtr& s, Verdict verdict, std::string why);
  void read_header(const SessionPtr& s);
  void on_header(const SessionPtr& s);
  void on_request(const SessionPtr& s, Op op, uint64_t id);
  void dispatch(const SessionPtr& s, Op op, uint64_t id);
  void bad_frame(const SessionPtr& s, const std::string& why);
  void close(const SessionPtr& s, LogLevel level, const std::string& why);
  void send(const SessionPtr& s, Outgoing o);
  void reply(const SessionPtr& s, Reply kind, uint64_t id, std::vector<uint8_t> body = {},
             ValuePtr value = {});
  void flush(const SessionPtr& s);
  std::optional<std::string> first_missing(const std::vector<std::string>& keys) const;
  void park(const SessionPtr& s, uint64_t id, bool is_get, std::vector<std::string> keys,
            uint64_t timeout_ms);
  void unpark(const WaiterPtr& w);
  void on_key_set(const std::string& key);
  void complete(const WaiterPtr& w);
  void expire(const WaiterPtr& w);
  void shutdown();

  int32_t world_size_;
  milliseconds hello_timeout_;
  std::string where_;    // "the store on port N", for logs
  asio::io_context io_;  // declared before everything that holds its objects
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_retry_{io_};
  uint16_t port_ = 0;
  std::thread thread_;

  // Touched only on thread_ (after the constructor).
  std::map<std::string, ValuePtr> data_;
  std::unordered_map<std::string, std::list<WaiterPtr>> parked_;
  std::set<SessionPtr> sessions_;
  std::set<int32_t> ranks_;
  bool stopping_ = false;
};

Server::Server(const TcpStoreOptions& options)
    : world_size_(options.world_size), hello_timeout_(std::min(options.timeout, milliseconds(60'000))) {
  listen(options.host, options.port);
  where_ = "the store on port " + std::to_string(port_);
  accept();
  thread_ = std::thread([this] { run(); });
}

// Binds the loopback address when `host` is "localhost" or a loopback IP
// (a single-node job stays invisible to the network), else every interface.
// A host name is never narrowed to loopback by what it resolves to here:
// Debian maps the machine's own name to 127.0.1.1, which other nodes
// cannot reach.
void Server::listen(const std::string& host, uint16_t port) {
  error_code ec;
  tcp::resolver resolver(io_);
  resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
  if (ec) {
    throw Error(Errc::io_error, "cannot host the rendezvous store: the address '" + host +
                                    "' does not resolve (" + ec.message() +
                                    "); set MASTER_ADDR to this host's name or IP address");
  }
  const asio::ip::address literal = asio::ip::make_address(host, ec);
  tcp::endpoint endpoint;
  if (!ec && literal.is_loopback()) {
    endpoint = tcp::endpoint(literal, port);
  } else if (ec && host == "localhost") {
    endpoint = tcp::endpoint(asio::ip::address_v4::loopback(), port);
  } else if (!ec && literal.is_v6()) {
    endpoint = tcp::endpoint(tcp::v6(), port);
  } else {
    endpoint = tcp::endpoint(tcp::v4(), port);
  }
  const std::string shown = join_address(endpoint.address().to_string(), port);
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
}

Server::~Server() {
  asio::post(io_, [this] { shutdown(); });
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

void Server::shutdown() {
  stopping_ = true;
  error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  for (const auto& s : sessions_) {
    s->closed = true;
    s->hello_timer.cancel();
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
      // E.g. out of file descriptors: retry later instead of spinning.
      log(LogLevel::warning, where_ + ": accepting a connection failed: " + ec.message() + "; retrying");
      accept_retry_.expires_after(milliseconds(100));
      accept_retry_.async_wait([this](const error_code& e) {
        if (!e && !stopping_) accept();
      });
      return;
    }
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto s = std::make_shared<Session>(std::move(socket), io_);
    s->peer = endpoint_text(s->socket);
    sessions_.insert(s);
    start(s);
    accept();
  });
}

void Server::start(const SessionPtr& s) {
  s->hello_timer.expires_after(hello_timeout_);
  s->hello_timer.async_wait([this, s](const error_code& ec) {
    if (ec || stopping_ || s->closed || s->greeted) return;
    close(s, LogLevel::warning, "sent no handshake within " + seconds_text(hello_timeout_));
  });
  asio::async_read(s->socket, asio::buffer(s->hello), [this, s](const error_code& ec, std::size_t n) {
    if (stopping_ || s->closed) return;
    if (ec) {
      if (n == 0) {
        close(s, LogLevel::debug, "closed the connection before the handshake");
      } else {
        close(s, LogLevel::warning,
              "sent a truncated handshake (" + std::to_string(n) + " of " + std::to_string(kHelloBytes) +
                  " bytes)");
      }
      return;
    }
    on_hello(s);
  });
}

void Server::on_hello(const SessionPtr& s) {
  s->hello_timer.cancel();
  const uint8_t* h = s->hello.data();
  if (std::memcmp(h, kMagic.data(), 4) != 0) {
    close(s, LogLevel::warning,
          "is not a backplane store client (its first bytes are not the handshake); closed");
    return;
  }
  const uint16_t version = get_u16(h + 4);
  const uint16_t flags = get_u16(h + 6);
  const auto rank = static_cast<int32_t>(get_u32(h + 8));
  const auto world_size = static_cast<int32_t>(get_u32(h + 12));
  if (version != kProtocolVersion) {
    reject(s, Verdict::version_mismatch,
           "speaks store protocol version " + std::to_string(version) + ", this store version " +
               std::to_string(kProtocolVersion) + "; every rank must run the same backplane version");
    return;
  }
  if (flags != 0) {
    close(s, LogLevel::warning, "sent a handshake with nonzero reserved bits; closed");
    return;
  }
  if (world_size != world_size_) {
    reject(s, Verdict::world_size_mismatch,
           "rank " + std::to_string(rank) + " says world_size " + std::to_string(world_size) +
               " but this store was started with world_size " + std::to_string(world_size_));
    return;
  }
  if (rank < 0 || rank >= world_size_) {
    reject(s, Verdict::rank_out_of_range,
           "rank " + std::to_string(rank) + " is out of range for world_size " + std::to_string(world_size_));
    return;
  }
  if (ranks_.count(rank) != 0) {
    reject(s, Verdict::duplicate_rank, "rank " + std::to_string(rank) + " is already connected");
    return;
  }
  s->greeted = true;
  s->rank = rank;
  ranks_.insert(rank);
  log(LogLevel::debug, where_ + ": " + s->who() + " connected");
  Hello welcome = make_hello(kProtocolVersion, static_cast<uint16_t>(Verdict::accepted), world_size_, 0);
  Outgoing o;
  o.framed = false;
  o.body.assign(welcome.begin(), welcome.end());
  send(s, std::move(o));
  read_header(s);
}

// Answers the handshake with the verdict, then closes once it is written.
void Server::reject(const SessionPtr& s, Verdict verdict, std::string why) {
  log(LogLevel::warning, where_ + ": refused the connection from " + s->peer + ": " + why);
  Hello welcome = make_hello(kProtocolVersion, static_cast<uint16_t>(verdict), world_size_, 0);
  Outgoing o;
  o.framed = false;
  o.body.assign(welcome.begin(), welcome.end());
  s->close_after_flush = true;
  send(s, std::move(o));
}

void Server::read_header(const SessionPtr& s) {
  asio::async_read(s->socket, asio::buffer(s->header), [this, s](const error_code& ec, std::size_t n) {
    if (stopping_ || s->closed) return;
    if (ec) {
      if (n == 0 && (ec == asio::error::eof || ec == asio::error::connection_reset)) {
        close(s, LogLevel::debug, "disconnected");
      } else if (n == 0) {
        close(s, LogLevel::debug, "connection failed: " + ec.message());
      } else {
        bad_frame(s, "a truncated frame header (" + std::to_string(n) + " of " +
                         std::to_string(kHeaderBytes) + " bytes)");
      }
      return;
    }
    on_header(s);
  });
}

void Server::on_header(const SessionPtr& s) {
  const uint8_t* h = s->header.data();
  const uint32_t bytes = get_u32(h);
  const std::optional<Op> op = to_op(h[4]);
  const uint64_t id = get_u64(h + 8);
  if (!op) {
    char kind[8];
    std::snprintf(kind, sizeof kind, "0x%02x", h[4]);
    bad_frame(s, std::string("an unknown opcode ") + kind);
    return;
  }
  if (h[5] != 0 || h[6] != 0 || h[7] != 0) {
    bad_frame(s, "a frame header with nonzero reserved bytes");
    return;
  }
  if (bytes > max_payload(*op)) {
    bad_frame(s, std::string("a ") + op_name(*op) + " frame of " + std::to_string(bytes) +
                     " bytes (the limit is " + std::to_string(max_payload(*op)) + ")");
    return;
  }
  s->payload.clear();
  async_read_chunked(s->socket, s->payload, bytes, [this, s, op, id, bytes](const error_code& ec) {
    if (stopping_ || s->closed) return;
    if (ec) {
      bad_frame(s, std::string("a truncated ") + op_name(*op) + " frame (announced " + std::to_string(bytes) +
                       " bytes; " + ec.message() + ")");
      return;
    }
    on_request(s, *op, id);
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
  if (!s->closed) read_header(s);
}

void Server::dispatch(const SessionPtr& s, Op op, uint64_t id) {
  PayloadReader in(s->payload);
  switch (op) {
    case Op::set: {
      std::string key = in.key();
      if (!in.ok()) break;
      auto value = std::make_shared<Value>();
      value->offset = s->payload.size() - in.remaining();
      value->bytes = std::move(s->payload);
      data_[key] = std::move(value);
      reply(s, Reply::ok, id);
      on_key_set(key);
      return;
    }
    case Op::get:
    case Op::wait: {
      const uint64_t timeout_ms = in.u64();
      std::vector<std::string> keys;
      if (op == Op::get) {
        std::string key = in.key();
        if (in.ok()) keys.push_back(std::move(key));
      } else {
        keys = in.key_list();
      }
      in.expect_end();
      if (!in.ok()) break;
      if (!first_missing(keys)) {
        if (op == Op::get) {
          reply(s, Reply::ok, id, {}, data_.at(keys.front()));
        } else {
          reply(s, Reply::ok, id);
        }
        return;
      }
      park(s, id, op == Op::get, std::move(keys), timeout_ms);
      return;
    }
    case Op::add: {
      const auto delta = static_cast<int64_t>(in.u64());
      std::string key = in.key();
      in.expect_end();
      if (!in.ok()) break;
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
      if (__builtin_add_overflow(current, delta, &next)) {
        std::string text = "adding " + std::to_string(delta) + " to " + std::to_string(current) + " at " +
                           quote(key) + " overflows a 64-bit integer";
        reply(s, Reply::refused, id, std::vector<uint8_t>(text.begin(), text.end()));
        return;
      }
      const std::string text = std::to_string(next);
      auto value = std::make_shared<Value>();
      value->bytes.assign(text.begin(), text.end());
      data_[key] = std::move(value);
      PayloadWriter out(8);
      out.u64(static_cast<uint64_t>(next));
      reply(s, Reply::ok, id, out.take());
      on_key_set(key);
      return;
    }
    case Op::check: {
      std::vector<std::string> keys = in.key_list();
      in.expect_end();
      if (!in.ok()) break;
      reply(s, Reply::ok, id, {static_cast<uint8_t>(first_missing(keys) ? 0 : 1)});
      return;
    }
    case Op::remove: {
      std::string key = in.key();
      in.expect_end();
      if (!in.ok()) break;
      reply(s, Reply::ok, id, {static_cast<uint8_t>(data_.erase(key) != 0 ? 1 : 0)});
      return;
    }
  }
  bad_frame(s, std::string("a malformed ") + op_name(op) + " request: " + in.error());
}

void Server::bad_frame(const SessionPtr& s, const std::string& why) {
  close(s, LogLevel::warning, "sent " + why + "; closed the connection");
}

void Server::close(const SessionPtr& s, LogLevel level, const std::string& why) {
  if (s->closed) return;
  s->closed = true;
  log(level, where_ + ": " + s->who() + " " + why);
  error_code ignored;
  s->hello_timer.cancel();
  s->socket.close(ignored);
  for (const auto& w : std::set<WaiterPtr>(s->waiters)) {
    w->finished = true;
    w->timer.cancel();
    unpark(w);
  }
  // s->out stays: a write in flight still points into it until its handler runs.
  if (s->greeted) ranks_.erase(s->rank);
  sessions_.erase(s);
}

void Server::reply(const SessionPtr& s, Reply kind, uint64_t id, std::vector<uint8_t> body, ValuePtr value) {
  Outgoing o;
  const std::size_t bytes = body.size() + (value ? value->size() : 0);
  o.header = make_header(bytes, static_cast<uint8_t>(kind), id);
  o.body = std::move(body);
  o.value = std::move(value);
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
  auto w = std::make_shared<Waiter>(io_);
  w->session = s;
  w->id = id;
  w->is_get = is_get;
  w->keys = std::move(keys);
  w->parked_on = *first_missing(w->keys);
  parked_[w->parked_on].push_back(w);
  s->waiters.insert(w);
  if (timeout_ms != kNoTimeout && milliseconds(timeout_ms) < kForever) {
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

// ---- Client ----------------------------------------------------------------

// One connection per client, multiplexed: each request carries an id and
// its caller sleeps on its own condition variable until the reply with
// that id arrives. A get parked on the server therefore never holds up
// another thread's set on the same client, and no extra connections (which
// the one-connection-per-rank handshake would have to tell apart) are needed.
class Client {
 public:
  struct Response {
    Reply kind;
    std::vector<uint8_t> payload;
  };

  Client(const std::string& host, uint16_t port, int32_t rank, int32_t world_size, milliseconds timeout);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends one request and waits for its reply until `deadline` (none: wait
  // until the reply or a lost connection). `what` names the call in errors.
  Response call(Op op, std::vector<uint8_t> payload, std::optional<Clock::time_point> deadline,
                const std::string& what);
  const std::string& address() const { return address_; }

 private:
  struct Pending {
    std::condition_variable cv;
    bool done = false;
    std::optional<std::string> error;
    Response response{Reply::ok, {}};
  };
  struct Frame {
    Header header;
    std::vector<uint8_t> payload;
  };

  void connect(const std::string& host, uint16_t port, Clock::time_point deadline);
  void handshake(int32_t rank, int32_t world_size, milliseconds timeout);
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
  Header header_{};
  std::vector<uint8_t> payload_;
  std::deque<std::shared_ptr<Frame>> out_;
  bool writing_ = false;

  std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;  // guarded by mutex_
  uint64_t next_id_ = 1;                                  // guarded by mutex_
  std::optional<std::string> broken_;                     // guarded by mutex_: why the connection is gone
};

Client::Client(const std::string& host, uint16_t port, int32_t rank, int32_t world_size, milliseconds timeout)
    : address_(join_address(host, port)) {
  const Clock::time_point deadline = Clock::now() + std::min(timeout, kForever);
  connect(host, port, deadline);
  handshake(rank, world_size, timeout);
  // The handshake left io_ out of work, which stops it: restart before running for good.
  io_.restart();
  work_.emplace(io_.get_executor());
  read_header();
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        fail("lost the connection to the store at " + address_ + " (" + e.what() + ")");
      }
    }
  });
}

Client::~Client() {
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

// Runs io_ on this thread until `done` or `deadline`; false on the deadline.
bool Client::run_until(const bool& done, Clock::time_point deadline) {
  io_.restart();
  while (!done) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    io_.run_one_for(deadline - now);
  }
  return true;
}

// Retries until the deadline: ranks start in any order, so the store may
// not be listening yet.
void Client::connect(const std::string& host, uint16_t port, Clock::time_point deadline) {
  const Clock::time_point started = Clock::now();
  tcp::resolver resolver(io_);
  milliseconds backoff(10);
  std::string last_error;
  for (;;) {
    error_code ec;
    auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
    if (!ec) {
      bool done = false;
      socket_ = tcp::socket(io_);
      asio::async_connect(socket_, endpoints, [&](const error_code& e, const tcp::endpoint&) {
        ec = e;
        done = true;
      });
      if (!run_until(done, deadline)) {
        error_code ignored;
        socket_.close(ignored);  // completes the connect with operation_aborted
        io_.restart();
        while (!done) io_.run_one();
        // An attempt cut short by the deadline says less than the one before it.
        if (last_error.empty()) last_error = "no answer to the connection attempt";
        break;
      }
      if (!ec) {
        error_code ignored;
        socket_.set_option(tcp::no_delay(true), ignored);
        return;
      }
      last_error = ec.message();
    } else {
      last_error = "cannot resolve '" + host + "': " + ec.message();
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
  const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
  throw Error(Errc::timeout,
              "could not connect to the rendezvous store at " + address_ + " within " + seconds_text(waited) +
                  " (last error: " + last_error +
                  "); check that rank 0 is running and that MASTER_ADDR/MASTER_PORT point at it "
                  "(and BACKPLANE_TIMEOUT if ranks start far apart)");
}

void Client::handshake(int32_t rank, int32_t world_size, milliseconds timeout) {
  // The server answers at once; allow a few seconds even when the connect
  // used up most of the timeout.
  const milliseconds allowed = std::min(std::max(timeout, milliseconds(1000)), milliseconds(30'000));
  const Clock::time_point deadline = Clock::now() + allowed;
  const Hello hello = make_hello(kProtocolVersion, 0, rank, world_size);
  Hello welcome{};
  bool done = false;
  error_code ec;
  asio::async_write(socket_, asio::buffer(hello), [&](const error_code& e, std::size_t) {
    if (e) {
      ec = e;
      done = true;
      return;
    }
    asio::async_read(socket_, asio::buffer(welcome), [&](const error_code& e2, std::size_t) {
      ec = e2;
      done = true;
    });
  });
  if (!run_until(done, deadline)) {
    error_code ignored;
    socket_.close(ignored);
    io_.restart();
    while (!done) io_.run_one();
    throw Error(Errc::timeout,
                "connected to " + address_ + " but it did not answer the store handshake within " +
                    seconds_text(allowed) +
                    "; is MASTER_PORT the port of another service rather than backplane's store?");
  }
  if (ec) {
    throw Error(Errc::io_error, "the rendezvous store at " + address_ +
                                    " closed the connection during the handshake (" + ec.message() +
                                    "); check MASTER_ADDR/MASTER_PORT and the store's log");
  }
  const uint8_t* w = welcome.data();
  if (std::memcmp(w, kMagic.data(), 4) != 0) {
    throw Error(Errc::io_error,
                "the service at " + address_ +
                    " is not a backplane rendezvous store (bad handshake reply); check MASTER_PORT");
  }
  const uint16_t version = get_u16(w + 4);
  const auto verdict = static_cast<Verdict>(get_u16(w + 6));
  const auto server_world = static_cast<int32_t>(get_u32(w + 8));
  const std::string r = std::to_string(rank), ws = std::to_string(world_size),
                    sws = std::to_string(server_world);
  switch (verdict) {
    case Verdict::accepted:
      if (version != kProtocolVersion || server_world != world_size) break;
      return;
    case Verdict::version_mismatch:
      throw Error(Errc::invalid_argument,
                  "the rendezvous store at " + address_ + " speaks protocol version " +
                      std::to_string(version) + " but this process speaks version " +
                      std::to_string(kProtocolVersion) + "; every rank must run the same backplane version");
    case Verdict::world_size_mismatch:
      throw Error(Errc::invalid_argument, "rank " + r + " says world_size " + ws + " but the store at " +
                                              address_ + " was started with world_size " + sws +
                                              "; every rank must be given the same world size");
    case Verdict::rank_out_of_range:
      throw Error(Errc::invalid_argument, "rank " + r + " is out of range for the store at " + address_ +
                                              ", which was started with world_size " + sws);
    case Verdict::duplicate_rank:
      throw Error(Errc::invalid_argument,
                  "rank " + r + " is already connected to the store at " + address_ + " (world_size " + sws +
                      "): two processes were given the same rank; check RANK (or OMPI_COMM_WORLD_RANK, "
                      "SLURM_PROCID) of each process");
  }
  throw Error(Errc::io_error, "the rendezvous store at " + address_ +
                                  " sent an invalid handshake reply (version " + std::to_string(version) +
                                  ", verdict " + std::to_string(static_cast<unsigned>(verdict)) +
                                  ", world_size " + sws + ")");
}

Client::Response Client::call(Op op, std::vector<uint8_t> payload, std::optional<Clock::time_point> deadline,
                              const std::string& what) {
  auto frame = std::make_shared<Frame>();
  frame->payload = std::move(payload);
  auto pending = std::make_shared<Pending>();
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_) throw Error(Errc::io_error, what + ": " + *broken_);
    id = next_id_++;
    pending_.emplace(id, pending);
  }
  frame->header = make_header(frame->payload.size(), static_cast<uint8_t>(op), id);
  asio::post(io_, [this, frame] {
    out_.push_back(frame);
    if (!writing_) write_next();
  });
  std::unique_lock<std::mutex> lock(mutex_);
  const auto ready = [&] { return pending->done; };
  if (deadline) {
    if (!pending->cv.wait_until(lock, *deadline, ready)) {
      pending_.erase(id);  // a late reply finds no one and is dropped
      throw Error(Errc::timeout, what + ": no reply from the rendezvous store at " + address_ +
                                     " in time; the host rank (rank 0) may be stalled or overloaded");
    }
  } else {
    pending->cv.wait(lock, ready);
  }
  if (pending->error) throw Error(Errc::io_error, what + ": " + *pending->error);
  return std::move(pending->response);
}

void Client::write_next() {
  writing_ = true;
  std::shared_ptr<Frame> f = out_.front();
  const std::array<asio::const_buffer, 2> buffers{asio::buffer(f->header), asio::buffer(f->payload)};
  // The handler holds the frame: fail() may drop the queue while the write is in flight.
  asio::async_write(socket_, buffers, [this, f](const error_code& ec, std::size_t) {
    writing_ = false;
    if (ec) {
      fail("lost the connection to the rendezvous store at " + address_ + " (" + ec.message() +
           "); did rank 0 exit?");
      out_.clear();
      return;
    }
    out_.pop_front();
    if (!out_.empty()) write_next();
  });
}

void Client::read_header() {
  asio::async_read(socket_, asio::buffer(header_), [this](const error_code& ec, std::size_t) {
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      if (ec == asio::error::eof) {
        fail("the rendezvous store at " + address_ + " closed the connection; did rank 0 exit?");
      } else {
        fail("lost the connection to the rendezvous store at " + address_ + " (" + ec.message() +
             "); did rank 0 exit?");
      }
      return;
    }
    on_header();
  });
}

void Client::on_header() {
  const uint8_t* h = header_.data();
  const uint32_t bytes = get_u32(h);
  const std::optional<Reply> kind = to_reply(h[4]);
  const uint64_t id = get_u64(h + 8);
  const std::size_t limit = kind == Reply::ok ? kMaxValueBytes : kMaxReplyTextBytes;
  if (!kind || h[5] != 0 || h[6] != 0 || h[7] != 0 || bytes > limit) {
    fail("the rendezvous store at " + address_ + " sent a malformed reply frame; closed the connection");
    return;
  }
  payload_.clear();
  async_read_chunked(socket_, payload_, bytes, [this, kind, id](const error_code& ec) {
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      fail("the rendezvous store at " + address_ + " closed the connection in the middle of a reply (" +
           ec.message() + "); did rank 0 exit?");
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pending_.find(id);
      if (it != pending_.end()) {
        it->second->response = Response{*kind, std::move(payload_)};
        it->second->done = true;
        it->second->cv.notify_one();
        pending_.erase(it);
      }
    }
    payload_ = {};
    read_header();
  });
}

// Fails every pending and future call with `message`.
void Client::fail(std::string message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_) return;
    broken_ = message;
    for (auto& [id, p] : pending_) {
      p->error = message;
      p->done = true;
      p->cv.notify_one();
    }
    pending_.clear();
  }
  error_code ignored;
  socket_.close(ignored);
}

// ---- TcpStore --------------------------------------------------------------

class TcpStore final : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& o) : timeout_(o.timeout) {
    if (o.is_server) {
      server_ = std::make_unique<Server>(o);
      address_ = join_address(o.host, server_->port());
    } else {
      address_ = join_address(o.host, o.port);
    }
    client_ =
        std::make_unique<Client>(o.host, server_ ? server_->port() : o.port, o.rank, o.world_size, o.timeout);
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    const std::string what = "store set(" + quote(key) + ")";
    check_key(key, what);
    if (value.size() > kMaxValueBytes) {
      throw Error(Errc::invalid_argument, what + ": the value has " + std::to_string(value.size()) +
                                              " bytes; the store carries at most " +
                                              std::to_string(kMaxValueBytes) + " bytes (1 GiB) per value");
    }
    PayloadWriter out(4 + key.size() + value.size());
    out.key(key);
    out.raw(value.data(), value.size());
    expect(call(Op::set, out.take(), default_deadline(), what), what, 0, 0);
  }

  std::vector<uint8_t> get(const std::string& key, milliseconds timeout) override {
    const std::string what = "store get(" + quote(key) + ")";
    check_key(key, what);
    check_timeout(timeout, what);
    PayloadWriter out(12 + key.size());
    out.u64(wire_timeout(timeout));
    out.key(key);
    Client::Response r = call(Op::get, out.take(), parked_deadline(timeout), what);
    if (r.kind == Reply::timed_out) {
      throw Error(Errc::timeout, what + " timed out after " + seconds_text(timeout) + ": no rank set " +
                                     quote(key) + " in the store at " + address_ +
                                     " (another rank may have failed before setting it)");
    }
    return expect(std::move(r), what, 0, kMaxValueBytes);
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    const std::string what = keys.size() == 1 ? "store wait(" + quote(keys.front()) + ")"
                                              : "store wait(" + std::to_string(keys.size()) + " keys)";
    check_timeout(timeout, what);
    std::vector<uint8_t> payload = key_list(keys, what, /*prefix=*/wire_timeout(timeout));
    Client::Response r = call(Op::wait, std::move(payload), parked_deadline(timeout), what);
    if (r.kind == Reply::timed_out) {
      const std::string missing(r.payload.begin(), r.payload.end());
      throw Error(Errc::timeout, what + " timed out after " + seconds_text(timeout) +
                                     "; still missing: " + missing + " (store at " + address_ +
                                     "; another rank may have failed before setting them)");
    }
    expect(std::move(r), what, 0, 0);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    const std::string what = "store add(" + quote(key) + ", " + std::to_string(delta) + ")";
    check_key(key, what);
    PayloadWriter out(12 + key.size());
    out.u64(static_cast<uint64_t>(delta));
    out.key(key);
    std::vector<uint8_t> v = expect(call(Op::add, out.take(), default_deadline(), what), what, 8, 8);
    return static_cast<int64_t>(get_u64(v.data()));
  }

  bool check(const std::vector<std::string>& keys) override {
    const std::string what = "store check(" + std::to_string(keys.size()) + " keys)";
    std::vector<uint8_t> v =
        expect(call(Op::check, key_list(keys, what, std::nullopt), default_deadline(), what), what, 1, 1);
    return v[0] != 0;
  }

  bool remove(const std::string& key) override {
    const std::string what = "store remove(" + quote(key) + ")";
    check_key(key, what);
    PayloadWriter out(4 + key.size());
    out.key(key);
    std::vector<uint8_t> v = expect(call(Op::remove, out.take(), default_deadline(), what), what, 1, 1);
    return v[0] != 0;
  }

  milliseconds timeout() const override { return timeout_; }
  std::string address() const override { return address_; }

 private:
  static void check_key(const std::string& key, const std::string& what) {
    if (key.empty() || key.size() > kMaxKeyBytes) {
      throw Error(Errc::invalid_argument, what + ": a key must have 1 to " + std::to_string(kMaxKeyBytes) +
                                              " bytes, this one has " + std::to_string(key.size()));
    }
  }
  static void check_timeout(milliseconds timeout, const std::string& what) {
    if (timeout.count() < 0) {
      throw Error(Errc::invalid_argument, what + ": the timeout is negative (" +
                                              std::to_string(timeout.count()) + " ms); pass 0 or more");
    }
  }
  static std::vector<uint8_t> key_list(const std::vector<std::string>& keys, const std::string& what,
                                       std::optional<uint64_t> timeout_prefix) {
    if (keys.size() > kMaxKeysPerCall) {
      throw Error(Errc::invalid_argument, what + ": at most " + std::to_string(kMaxKeysPerCall) +
                                              " keys per call, got " + std::to_string(keys.size()));
    }
    std::size_t bytes = 4;
    for (const auto& k : keys) {
      check_key(k, what + " key " + quote(k));
      bytes += 4 + k.size();
    }
    if (bytes > kMaxKeyListBytes) {
      throw Error(Errc::invalid_argument, what + ": the keys take " + std::to_string(bytes) +
                                              " bytes; at most " + std::to_string(kMaxKeyListBytes) +
                                              " per call; split the call");
    }
    PayloadWriter out(bytes + 8);
    if (timeout_prefix) out.u64(*timeout_prefix);
    out.u32(static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) out.key(k);
    return out.take();
  }

  std::optional<Clock::time_point> default_deadline() const {
    if (timeout_ >= kForever) return std::nullopt;
    return Clock::now() + timeout_;
  }
  // get/wait: the server answers timed_out at `timeout`; the grace covers
  // the trip back before the client concludes the server is stuck.
  static std::optional<Clock::time_point> parked_deadline(milliseconds timeout) {
    if (timeout >= kForever) return std::nullopt;
    return Clock::now() + timeout + kReplyGrace;
  }

  Client::Response call(Op op, std::vector<uint8_t> payload, std::optional<Clock::time_point> deadline,
                        const std::string& what) {
    return client_->call(op, std::move(payload), deadline, what);
  }

  // Checks an ok reply's payload size; turns refused into invalid_argument.
  std::vector<uint8_t> expect(Client::Response r, const std::string& what, std::size_t min_bytes,
                              std::size_t max_bytes) const {
    if (r.kind == Reply::refused) {
      throw Error(Errc::invalid_argument, what + ": " + std::string(r.payload.begin(), r.payload.end()));
    }
    if (r.kind != Reply::ok || r.payload.size() < min_bytes || r.payload.size() > max_bytes) {
      throw Error(Errc::io_error,
                  what + ": the rendezvous store at " + address_ +
                      " sent a reply that does not fit the request; are all ranks running the "
                      "same backplane version?");
    }
    return std::move(r.payload);
  }

  milliseconds timeout_;
  std::string address_;
  // Declared before client_, so the client disconnects before the server stops.
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

}  // namespace

std::shared_ptr<Store> make_tcp_store(const TcpStoreOptions& options) {
  const std::string where = "make_tcp_store(" + join_address(options.host, options.port) + ")";
  if (options.host.empty()) {
    throw Error(Errc::invalid_argument,
                where + ": the host is empty; give the hosting rank's address (MASTER_ADDR)");
  }
  if (options.world_size < 1) {
    throw Error(Errc::invalid_argument,
                where + ": world_size " + std::to_string(options.world_size) + " is not positive");
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    throw Error(Errc::invalid_argument, where + ": rank " + std::to_string(options.rank) +
                                            " is out of range for world_size " +
                                            std::to_string(options.world_size) + " (ranks are 0.." +
                                            std::to_string(options.world_size - 1) + ")");
  }
  if (options.port == 0 && !options.is_server) {
    throw Error(Errc::invalid_argument,
                where +
                    ": port 0 means \"any free port\" and is only valid on the server; "
                    "clients need the port the server reports in address()");
  }
  if (options.timeout.count() <= 0) {
    throw Error(Errc::invalid_argument, where + ": the timeout must be positive, got " +
                                            std::to_string(options.timeout.count()) + " ms");
  }
  return std::make_shared<TcpStore>(options);
}

}  // namespace backplane
