// The remote backend's server: accepts connections on one address, runs the
// handshake (optional TLS, then Hello/Challenge/Proof/Welcome, proving the
// token both ways when there is one) and serves each authenticated client a
// Session of the hosted backend, within ServerLimits. What `backplane serve`
// runs; the tests run it in-process.
//
// Thread-safety: all public methods may be called from any thread. The
// server serves on its own threads from construction until stop().
#ifndef BACKPLANE_REMOTE_SERVER_SERVER_HPP_
#define BACKPLANE_REMOTE_SERVER_SERVER_HPP_

#include "remote/server/hosted.hpp"
#include "remote/server/limits.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace backplane::remote::server {

struct ServerOptions {
  // HOST:PORT; port 0 picks a free one (see Server::address()).
  std::string listen = "127.0.0.1:7070";
  // The shared secret clients prove. Empty: no authentication, which only a
  // server listening on loopback accepts.
  std::string token;
  // PEM certificate chain and private key: both or neither. With them every
  // connection starts with a TLS handshake.
  std::string tls_cert;
  std::string tls_key;
  // Sent to clients in the handshake (e.g. "0.2.0").
  std::string server_version;
  ServerLimits limits;
  // Threads serving the sockets (the backend's work runs on each session's own thread).
  int io_threads = 2;
};

// What the server holds now, over all sessions.
struct ServerStats {
  int64_t handshakes = 0;  // connections still in their handshake
  int64_t waiting = 0;     // connections waiting for a handshake slot
  int64_t sessions = 0;    // authenticated sessions, until everything they held is freed
  int64_t bytes = 0;       // bytes of hosted buffers
  int64_t held = 0;        // every byte counted against --max-total-bytes: buffers, payloads, replies
  int64_t buffers = 0;
  int64_t comms = 0;
};

class Server {
 public:
  // Listens and starts serving. Throws std::runtime_error saying what is
  // wrong: bad options, an address that does not resolve or cannot be bound,
  // a non-loopback address without a token, unusable TLS files.
  Server(std::shared_ptr<const Hosted> hosted, ServerOptions options);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // "127.0.0.1:7070": the bound address and port.
  std::string address() const;
  uint16_t port() const;
  bool loopback_only() const;
  bool tls() const;
  ServerStats stats() const;
  // Stops accepting, tells every client "the server is shutting down" (a
  // Fatal), frees everything the sessions held and stops the threads.
  // Returns when all of that is done; idempotent.
  void stop();

 private:
  friend class Connection;  // connection.hpp: one client connection
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True for 127.0.0.0/8, ::1 and ::ffff:127.x.y.z, given as text; false for
// anything else, including names (resolve them first).
bool is_loopback_address(const std::string& address);

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_SERVER_HPP_
