// The frames the server sends (remote.fbs): replies, Fatal, the handshake's
// Challenge and Welcome, and key-value requests. Each returns a whole frame
// (header + message) ready to write; a payload, where one follows, is
// written after it by the caller.
#ifndef BACKPLANE_REMOTE_SERVER_MESSAGES_HPP_
#define BACKPLANE_REMOTE_SERVER_MESSAGES_HPP_

#include "remote/server/hosted.hpp"
#include "remote/server/limits.hpp"
#include "remote/wire/frame.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::remote::server {

// Messages are cut to this many bytes so that a reply always fits the
// client's message limit, whatever a backend says.
inline constexpr std::size_t kMaxReplyTextBytes = 16 * 1024;

wire::Encoded encode_reply(uint64_t id, int32_t status, std::string_view message);
// Announces `size` payload bytes when status is OK (the caller writes them), none otherwise.
wire::Encoded encode_read_reply(uint64_t id, int32_t status, std::string_view message, uint64_t size);
wire::Encoded encode_memory_reply(uint64_t id, int32_t status, std::string_view message, uint64_t free_bytes,
                                  uint64_t total_bytes);
wire::Encoded encode_fatal(int32_t status, std::string_view message);
wire::Encoded encode_challenge(std::string_view server_version, bool auth_required,
                               std::span<const uint8_t> nonce, std::span<const uint8_t> server_proof);
wire::Encoded encode_welcome(uint64_t session, const Hosted& hosted, const ServerLimits& limits);
wire::Encoded encode_kv_request(uint64_t id, wire::KvKind kind, const std::vector<std::string>& keys,
                                std::span<const uint8_t> value, int64_t timeout_ms);

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_MESSAGES_HPP_
