// The server's acceptor: it listens, accepts, keeps new connections waiting
// (parked, without a buffer) until a handshake slot is free, starts their
// handshakes, logs about them within a rate limit, and stops. Each
// connection (connection.hpp) does the rest on a strand of its own.
#include "remote/server/server.hpp"

#include "remote/server/connection.hpp"
#include "remote/server/server_impl.hpp"

#include <backplane/log.hpp>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <sys/resource.h>

namespace backplane::remote::server {

namespace {

constexpr milliseconds kMaxAcceptBackoff{1000};

// How long stop() waits for sessions to end after telling them, before it
// closes their sockets outright.
constexpr milliseconds kStopGrace{5000};

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

}  // namespace

bool is_loopback_address(const std::string& address) {
  error_code ec;
  const asio::ip::address a = asio::ip::make_address(address, ec);
  return !ec && is_loopback(a);
}

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
      if (backoff_shown)
        log_line(LogLevel::warning, "accepting connections again");
      else
        log_limited(LogLevel::warning, "accepting connections again");
      backoff_shown = false;
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
    backoff_shown = log_limited(LogLevel::warning, "accepting a connection failed: " + ec.message() +
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
bool Server::Impl::log_limited(LogLevel level, const std::string& line) {
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
      return false;
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
  return true;
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
