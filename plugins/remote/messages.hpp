// The remote plugin's side of the schema (remote/wire/remote.fbs): tensor
// descriptors as the client encodes them, the Welcome as it decodes and checks
// it, and the wording of failures. Pure functions, unit-tested without a
// network.
#ifndef BACKPLANE_PLUGINS_REMOTE_CLIENT_MESSAGES_HPP_
#define BACKPLANE_PLUGINS_REMOTE_CLIENT_MESSAGES_HPP_

#include <backplane/abi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "remote/wire/frame.hpp"

namespace backplane::remote::client {

// The most dimensions a tensor may have on the wire (the server refuses more).
inline constexpr int32_t kMaxWireRank = 64;
// The most devices one server may describe; the ABI allows 4096 in all.
inline constexpr std::size_t kMaxServerDevices = 4096;

// One device a server hosts, as its Welcome describes it.
struct ServerDevice {
  std::string name;
  uint64_t capabilities = 0;
  std::vector<std::pair<std::string, std::string>> attributes;
  int32_t op_count = 0;
  int32_t dtype_count = 0;
  std::vector<uint8_t> support;  // bit (op * dtype_count + dtype), least significant bit first

  // The server's supports_op answer; false outside the bitmap.
  bool supports(int32_t op, int32_t dtype) const noexcept;
};

// What the handshake told the client about the server.
struct ServerInfo {
  uint32_t protocol = 0;
  std::string server_version;
  uint64_t session = 0;
  std::string backend;
  std::string backend_version;
  std::vector<ServerDevice> devices;
  uint64_t max_frame_bytes = 0;  // 0: the server names no limit
  uint64_t max_session_bytes = 0;
  uint32_t max_buffers = 0;
  uint32_t max_inflight = 0;
  int64_t idle_timeout_ms = 0;
};

// Decodes a verified Welcome into `out` (protocol and server_version come
// from the Challenge and are left alone). Checks what the client relies on:
// at most kMaxServerDevices devices, each with a name, a support bitmap that
// covers op_count x dtype_count bits, counts in 0..4096. Returns "" or what is
// wrong.
std::string decode_welcome(const wire::Welcome& welcome, ServerInfo& out);

// A TensorDesc for `tensor`, whose buffer the server knows as `buffer_id`.
// Throws plugin::Failure (BP_STATUS_INVALID_ARGUMENT) for a rank over
// kMaxWireRank or missing shape/strides, naming `field` ("inputs[1]").
flatbuffers::Offset<wire::TensorDesc> encode_tensor(flatbuffers::FlatBufferBuilder& fbb,
                                                    const bp_tensor& tensor, uint64_t buffer_id,
                                                    const char* field);

// A failure status code the server sent, as a bp_status_code: an unknown
// value (or 0 on a failure) becomes BP_STATUS_INTERNAL.
int32_t server_status_code(int32_t code) noexcept;

// "server HOST:PORT: <message>" (the message names the request and op).
std::string server_failure(const std::string& endpoint, int32_t code, const std::string& message);

// What every call on a dead connection says.
std::string unreachable(const std::string& endpoint, const std::string& reason);

}  // namespace backplane::remote::client

#endif  // BACKPLANE_PLUGINS_REMOTE_CLIENT_MESSAGES_HPP_
