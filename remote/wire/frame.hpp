// The remote protocol's framing: every message travels as a 16-byte header, a
// FlatBuffers Message (remote.fbs) and, for Write requests and Read replies,
// raw payload bytes. The header's sizes are checked against the receiver's
// limits before anything is allocated; the message is checked by FlatBuffers'
// Verifier before a field is read. Shared by the plugin (client), the server
// and the tests, so what one side writes is what the other side checks.
#ifndef BACKPLANE_REMOTE_WIRE_FRAME_HPP_
#define BACKPLANE_REMOTE_WIRE_FRAME_HPP_

#include "remote_generated.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace backplane::remote::wire {

// Header, little-endian:
//   u8[4] magic "BPRM" | u32 message bytes | u64 payload bytes
inline constexpr std::array<uint8_t, 4> kMagic{'B', 'P', 'R', 'M'};
inline constexpr std::size_t kHeaderBytes = 16;
// Bumped when a peer of the previous version could not understand this one.
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kMacBytes = 32;
// The largest message (not payload) either side accepts by default: a
// message is metadata (an Execute with 8 tensors of rank 64 is ~10 KiB; a
// device list ~ a few KiB per device).
inline constexpr uint64_t kDefaultMaxMessageBytes = 1u << 20;

struct Header {
  uint32_t message_bytes = 0;
  uint64_t payload_bytes = 0;
};

std::array<uint8_t, kHeaderBytes> encode_header(const Header& h) noexcept;

// Parses a header and checks it against the receiver's limits: the magic, a
// message of 1..max_message_bytes and a payload of at most max_payload_bytes.
// Returns the header, or nullopt with `why` saying what is wrong.
std::optional<Header> decode_header(std::span<const uint8_t, kHeaderBytes> bytes, uint64_t max_message_bytes,
                                    uint64_t max_payload_bytes, std::string& why);

// Verifies `bytes` as a Message (FlatBuffers Verifier: every offset, vector
// and string inside the buffer, nesting and table counts bounded) and that
// its body is present. Returns the message, or nullptr with `why` set.
const Message* verify_message(std::span<const uint8_t> bytes, std::string& why);

// A finished message ready to send: the header and the FlatBuffers bytes
// (which the builder owns) in one contiguous vector.
struct Encoded {
  std::vector<uint8_t> bytes;  // header + message
};

// Wraps the finished builder (root `message`) with its header announcing
// `payload_bytes` raw bytes to follow.
Encoded finish(flatbuffers::FlatBufferBuilder& builder, flatbuffers::Offset<Message> message,
               uint64_t payload_bytes = 0);

// The name of a body type ("Execute"), for messages.
const char* body_name(Body type) noexcept;

}  // namespace backplane::remote::wire

#endif  // BACKPLANE_REMOTE_WIRE_FRAME_HPP_
