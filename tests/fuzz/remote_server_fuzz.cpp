// libFuzzer target over the remote server's message handling: the input is a
// byte stream a client could send after its handshake. Frames are parsed as
// the server parses them (header limits, the FlatBuffers Verifier, route())
// and run through a Session hosting the fake backend, until the stream ends
// or the server would close the connection. Checked on every input: no crash
// or sanitizer report, every frame the session sends is well-formed, and a
// released session leaves no buffer or communicator behind.
#include "fake_backend.hpp"
#include "remote/server/session.hpp"
#include "remote/wire/frame.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

namespace rs = backplane::remote::server;
namespace wire = backplane::remote::wire;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "remote_server_fuzz: invariant broken: %s\n", what);
  std::abort();
}

// Checks what the session sends; the client's store never answers.
class CheckingSender final : public rs::Sender {
 public:
  void send(wire::Encoded frame) override { check(frame, 0); }
  bool send_with_payload(wire::Encoded frame, std::span<const uint8_t> payload) override {
    check(frame, payload.size());
    volatile uint8_t sink = 0;
    if (!payload.empty()) sink = static_cast<uint8_t>(payload.front() + payload.back());
    (void)sink;
    return true;
  }
  rs::KvResult kv(const rs::KvCall& call, std::chrono::milliseconds) override {
    if (call.keys.empty()) broken("a key-value request without a key");
    return {BP_STATUS_UNAVAILABLE, "no client store in the fuzzer", {}};
  }

 private:
  static void check(const wire::Encoded& frame, uint64_t payload) {
    if (frame.bytes.size() < wire::kHeaderBytes) broken("a frame shorter than its header");
    std::string why;
    const auto h = wire::decode_header(
        std::span<const uint8_t, wire::kHeaderBytes>(frame.bytes.data(), wire::kHeaderBytes),
        wire::kDefaultMaxMessageBytes, uint64_t{1} << 40, why);
    if (!h || h->message_bytes != frame.bytes.size() - wire::kHeaderBytes || h->payload_bytes != payload)
      broken("a frame whose header does not match it");
    if (wire::verify_message(std::span<const uint8_t>(frame.bytes).subspan(wire::kHeaderBytes), why) ==
        nullptr)
      broken("a frame the verifier refuses");
  }
};

const std::shared_ptr<const rs::Hosted>& hosted() {
  static const auto h =
      std::make_shared<const rs::Hosted>(fuzzfake::api(), fuzzfake::instance(), "fake", "0");
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rs::ServerLimits limits;
  limits.max_frame_bytes = 1 << 20;
  limits.max_session_bytes = 4 << 20;
  limits.max_buffers = 256;
  rs::Counters counters;
  CheckingSender sender;
  {
    rs::Session session(1, hosted(), limits, counters, sender);
    std::span<const uint8_t> in(data, size);
    while (in.size() >= wire::kHeaderBytes) {
      std::string why;
      const auto h = wire::decode_header(in.first<wire::kHeaderBytes>(), wire::kDefaultMaxMessageBytes,
                                         limits.max_frame_bytes, why);
      if (!h) break;  // the server sends a Fatal and closes
      in = in.subspan(wire::kHeaderBytes);
      if (in.size() < h->message_bytes) break;
      // In a buffer of its own, as the server keeps it: FlatBuffers reads
      // scalars in place and needs the message's start aligned.
      const std::vector<uint8_t> message(in.begin(), in.begin() + h->message_bytes);
      in = in.subspan(h->message_bytes);
      if (in.size() < h->payload_bytes) break;
      const auto payload = in.first(h->payload_bytes);
      in = in.subspan(h->payload_bytes);
      const wire::Message* m = wire::verify_message(message, why);
      if (m == nullptr) break;
      const std::optional<rs::Route> r = rs::route(*m, payload.size(), why);
      if (!r || *r == rs::Route::goodbye) break;
      if (*r == rs::Route::worker) session.handle(*m, payload);
      if (*r == rs::Route::abort) session.abort(m->body_as_CommAbort()->comm());
    }
    session.release();
    if (counters.bytes != 0 || counters.buffers != 0 || counters.comms != 0)
      broken("a released session left buffers or communicators counted");
    if (fuzzfake::live_buffers() != 0 || fuzzfake::live_comms() != 0)
      broken("a released session left buffers or communicators in the backend");
  }
  return 0;
}
