// What the server's network side shares between its acceptor (server.cpp)
// and its connections (connection.hpp): Server::Impl, which owns the
// io_context, the listening socket, the connections waiting for a handshake
// slot and the limits' counters, and the few helpers both write log lines
// with. Internal to remote/server.
#ifndef BACKPLANE_REMOTE_SERVER_SERVER_IMPL_HPP_
#define BACKPLANE_REMOTE_SERVER_SERVER_IMPL_HPP_

#include "remote/server/server.hpp"
#include "remote/server/session.hpp"
#include "remote/wire/stream.hpp"

#include <backplane/log.hpp>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace backplane::remote::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using std::chrono::milliseconds;

using Strand = asio::strand<asio::io_context::executor_type>;

inline void log_line(LogLevel level, const std::string& message) {
  backplane::log(level, "serve: " + message);
}

inline std::string ms_text(milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

inline std::string join_host_port(const std::string& host, uint16_t port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
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
  // Logs `line` unless this second's lines are used up; true when it was shown.
  bool log_limited(LogLevel level, const std::string& line);
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
  // The line that began the current backoff was shown: the line that ends it
  // is then shown too, past the rate limit (one per shown start), so that a
  // reader who saw "out of file descriptors" also sees that it is over.
  bool backoff_shown = false;
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

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_SERVER_IMPL_HPP_
