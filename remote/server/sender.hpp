// How a Session talks back to its client: replies, payloads that follow them,
// and the key-value requests a communicator's store makes. The server's
// connection implements it over the network; tests and the fuzzer implement
// it in memory. A Session calls it from its worker thread, and the kv entry
// from whatever thread the hosted plugin calls its store on.
#ifndef BACKPLANE_REMOTE_SERVER_SENDER_HPP_
#define BACKPLANE_REMOTE_SERVER_SENDER_HPP_

#include "remote/wire/frame.hpp"

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace backplane::remote::server {

// One key-value request for the client's rendezvous store (remote.fbs, KvRequest).
struct KvCall {
  wire::KvKind kind = wire::KvKind::Set;
  std::vector<std::string> keys;
  std::vector<uint8_t> value;  // Set
  int64_t timeout_ms = 0;
};

// The client's answer; status is a bp_status_code the ABI names.
struct KvResult {
  int32_t status = 0;
  std::string message;
  std::vector<uint8_t> value;  // Get
};

class Sender {
 public:
  virtual ~Sender() = default;
  // Queues a frame that carries no payload. May block while the client is
  // not reading what was already sent (backpressure).
  virtual void send(wire::Encoded frame) = 0;
  // Writes `frame` and then `payload` (borrowed) and returns once both are
  // written: the caller may then reuse the memory. False when the
  // connection is gone and nothing more can be sent.
  virtual bool send_with_payload(wire::Encoded frame, std::span<const uint8_t> payload) = 0;
  // Sends the request to the client and waits for its KvReply, at most
  // `wait`; a timeout or a closed session is a failed result (status
  // BP_STATUS_TIMEOUT or BP_STATUS_UNAVAILABLE), never an exception.
  virtual KvResult kv(const KvCall& call, std::chrono::milliseconds wait) = 0;
  // Frees what the connection keeps for reuse (payload buffers), so that
  // an allocation the server's memory account refuses can try once more.
  virtual void release_spares() {}
};

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_SENDER_HPP_
