// Encoders of the frames the server sends.
#include "remote/server/messages.hpp"

namespace backplane::remote::server {

namespace {

std::string_view clip(std::string_view text) { return text.substr(0, kMaxReplyTextBytes); }

template <class T>
wire::Encoded finish_body(flatbuffers::FlatBufferBuilder& b, uint64_t id, flatbuffers::Offset<T> body,
                          uint64_t payload_bytes = 0) {
  const auto message = wire::CreateMessage(b, id, wire::BodyTraits<T>::enum_value, body.Union());
  return wire::finish(b, message, payload_bytes);
}

}  // namespace

wire::Encoded encode_reply(uint64_t id, int32_t status, std::string_view message) {
  flatbuffers::FlatBufferBuilder b(128 + message.size());
  const auto text = b.CreateString(clip(message));
  return finish_body(b, id, wire::CreateReply(b, status, text));
}

wire::Encoded encode_read_reply(uint64_t id, int32_t status, std::string_view message, uint64_t size) {
  flatbuffers::FlatBufferBuilder b(128 + message.size());
  const auto text = b.CreateString(clip(message));
  const uint64_t payload = status == BP_STATUS_OK ? size : 0;
  return finish_body(b, id, wire::CreateReadReply(b, status, text, payload), payload);
}

wire::Encoded encode_memory_reply(uint64_t id, int32_t status, std::string_view message, uint64_t free_bytes,
                                  uint64_t total_bytes) {
  flatbuffers::FlatBufferBuilder b(128 + message.size());
  const auto text = b.CreateString(clip(message));
  return finish_body(b, id, wire::CreateMemoryReply(b, status, text, free_bytes, total_bytes));
}

wire::Encoded encode_fatal(int32_t status, std::string_view message) {
  flatbuffers::FlatBufferBuilder b(128 + message.size());
  const auto text = b.CreateString(clip(message));
  return finish_body(b, 0, wire::CreateFatal(b, status, text));
}

wire::Encoded encode_challenge(std::string_view server_version, bool auth_required,
                               std::span<const uint8_t> nonce, std::span<const uint8_t> server_proof) {
  flatbuffers::FlatBufferBuilder b(256);
  const auto version = b.CreateString(server_version);
  const auto n = b.CreateVector(nonce.data(), nonce.size());
  const auto proof = b.CreateVector(server_proof.data(), server_proof.size());
  return finish_body(b, 0,
                     wire::CreateChallenge(b, wire::kProtocolVersion, version, auth_required, n, proof));
}

wire::Encoded encode_welcome(uint64_t session, const Hosted& hosted, const ServerLimits& limits) {
  flatbuffers::FlatBufferBuilder b(1024);
  std::vector<flatbuffers::Offset<wire::DeviceDesc>> devices;
  for (const HostedDevice& d : hosted.devices()) {
    std::vector<flatbuffers::Offset<wire::Attribute>> attributes;
    for (const auto& [name, value] : d.attributes)
      attributes.push_back(wire::CreateAttribute(b, b.CreateString(name), b.CreateString(value)));
    devices.push_back(wire::CreateDeviceDesc(b, b.CreateString(d.name), d.capabilities,
                                             b.CreateVector(attributes), kSupportOps, kSupportDtypes,
                                             b.CreateVector(d.support)));
  }
  const auto lim = wire::CreateLimits(b, limits.max_frame_bytes, limits.max_session_bytes, limits.max_buffers,
                                      limits.max_inflight, limits.idle_timeout.count());
  const auto body =
      wire::CreateWelcome(b, session, b.CreateString(hosted.backend_name()),
                          b.CreateString(hosted.backend_version()), b.CreateVector(devices), lim);
  return finish_body(b, 0, body);
}

wire::Encoded encode_kv_request(uint64_t id, wire::KvKind kind, const std::vector<std::string>& keys,
                                std::span<const uint8_t> value, int64_t timeout_ms) {
  flatbuffers::FlatBufferBuilder b(256 + value.size());
  const auto k = b.CreateVectorOfStrings(keys);
  const auto v = b.CreateVector(value.data(), value.size());
  return finish_body(b, id, wire::CreateKvRequest(b, kind, k, v, timeout_ms));
}

}  // namespace backplane::remote::server
