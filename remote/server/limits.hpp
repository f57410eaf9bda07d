// The limits `backplane serve` enforces, with their defaults (each is a
// command-line option; docs/remote-server.md lists them). A client learns the
// ones that concern it from the Welcome's Limits table.
#ifndef BACKPLANE_REMOTE_SERVER_LIMITS_HPP_
#define BACKPLANE_REMOTE_SERVER_LIMITS_HPP_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace backplane::remote::server {

struct ServerLimits {
  // Time from accept to the end of the handshake (TLS, Hello, Proof).
  std::chrono::milliseconds handshake_timeout{5000};
  // Connections still in their handshake. Over it (or over the limit per
  // address) a new connection waits, without a buffer, until a slot frees:
  // those that have sent something (a client's Hello) start first, silent
  // ones after them. A connection waits at most handshake_timeout, and its
  // handshake then has handshake_timeout of its own; so a flood of silent
  // connections delays a client by at most one handshake_timeout and never
  // closes it. Waiting connections are bounded by half the process's
  // descriptor limit; past it the one that waited longest in silence is closed.
  int32_t max_handshakes = 128;
  // Connections in their handshake from one source address, so that one
  // address (or one NAT) never holds every handshake slot; more from it wait
  // as above.
  int32_t max_handshakes_per_address = 16;
  // Authenticated sessions; over it a new one gets a Fatal and is closed.
  int32_t max_sessions = 64;
  // Bytes of hosted buffers all sessions together may hold: past it an
  // Alloc is out_of_memory to the session that asked, and the server and
  // every other session go on. No cap here; `backplane serve` defaults it to
  // 90% of what the process may take (its memory cgroup's room and
  // MemAvailable, whichever is lower).
  uint64_t max_total_bytes = std::numeric_limits<uint64_t>::max();
  // Bytes of hosted buffers one session may hold, and how many buffers.
  uint64_t max_session_bytes = uint64_t{16} << 30;
  uint32_t max_buffers = 65536;
  // Requests queued for a session's worker; when full the server stops
  // reading that connection (TCP backpressure) until the worker catches up.
  uint32_t max_inflight = 4096;
  // Payload bytes of one frame: a Write's data, a Read's reply. Larger
  // transfers are split by the client.
  uint64_t max_frame_bytes = uint64_t{1} << 30;
  // A session that sends nothing for this long is closed (clients Ping);
  // so is one that does not read what the server writes for this long.
  std::chrono::milliseconds idle_timeout{60000};
};

// Fixed bounds (not options): a handshake message is tiny; a session needs
// few communicators; world sizes and key prefixes stay sane.
inline constexpr uint64_t kHandshakeMessageBytes = 4096;
inline constexpr uint32_t kMaxCommsPerSession = 1024;
inline constexpr int32_t kMaxWorldSize = 1 << 16;
inline constexpr std::size_t kMaxKeyPrefixBytes = 1024;
// How much longer than a key-value request's own timeout the server waits
// for the client's KvReply before it gives up on it.
inline constexpr std::chrono::milliseconds kKvReplyGrace{5000};

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_LIMITS_HPP_
