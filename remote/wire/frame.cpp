// Frame headers and message verification for the remote protocol.
#include "remote/wire/frame.hpp"

#include <cstring>

namespace backplane::remote::wire {

namespace {

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

std::array<uint8_t, kHeaderBytes> encode_header(const Header& h) noexcept {
  std::array<uint8_t, kHeaderBytes> out{};
  std::memcpy(out.data(), kMagic.data(), kMagic.size());
  put_u32(out.data() + 4, h.message_bytes);
  put_u64(out.data() + 8, h.payload_bytes);
  return out;
}

std::optional<Header> decode_header(std::span<const uint8_t, kHeaderBytes> bytes, uint64_t max_message_bytes,
                                    uint64_t max_payload_bytes, std::string& why) {
  if (std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    why =
        "the frame does not start with the protocol's magic bytes \"BPRM\" (not a backplane remote peer, "
        "or TLS on one side only)";
    return std::nullopt;
  }
  Header h;
  h.message_bytes = get_u32(bytes.data() + 4);
  h.payload_bytes = get_u64(bytes.data() + 8);
  if (h.message_bytes == 0) {
    why = "the frame announces an empty message";
    return std::nullopt;
  }
  if (h.message_bytes > max_message_bytes) {
    why = "the frame announces a " + std::to_string(h.message_bytes) + "-byte message, over the limit of " +
          std::to_string(max_message_bytes) + " bytes";
    return std::nullopt;
  }
  if (h.payload_bytes > max_payload_bytes) {
    why = "the frame announces " + std::to_string(h.payload_bytes) + " payload bytes, over the limit of " +
          std::to_string(max_payload_bytes) + " bytes";
    return std::nullopt;
  }
  return h;
}

const Message* verify_message(std::span<const uint8_t> bytes, std::string& why) {
  // Depth and table limits well above what the schema needs and far below
  // what would cost the verifier real time.
  flatbuffers::Verifier verifier(bytes.data(), bytes.size(), /*max_depth=*/16, /*max_tables=*/100000);
  if (!VerifyMessageBuffer(verifier)) {
    why = "the message is not a valid FlatBuffers Message (bad offsets, sizes or nesting)";
    return nullptr;
  }
  const Message* m = GetMessage(bytes.data());
  if (m->body_type() == Body::NONE || m->body() == nullptr) {
    why = "the message has no body (an unknown message type from a newer peer, or none at all)";
    return nullptr;
  }
  return m;
}

Encoded finish(flatbuffers::FlatBufferBuilder& builder, flatbuffers::Offset<Message> message,
               uint64_t payload_bytes) {
  builder.Finish(message);
  Encoded e;
  const auto size = builder.GetSize();
  e.bytes.resize(kHeaderBytes + size);
  const auto header = encode_header(Header{static_cast<uint32_t>(size), payload_bytes});
  std::memcpy(e.bytes.data(), header.data(), kHeaderBytes);
  std::memcpy(e.bytes.data() + kHeaderBytes, builder.GetBufferPointer(), size);
  return e;
}

const char* body_name(Body type) noexcept {
  const char* name = EnumNameBody(type);
  return (name != nullptr && name[0] != '\0') ? name : "unknown";
}

}  // namespace backplane::remote::wire
