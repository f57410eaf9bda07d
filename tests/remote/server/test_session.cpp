// The session without sockets: where each message goes, what a released
// session leaves behind, and how its replies and key-value calls reach the
// Sender. Driven directly, as the fuzzer drives it.
#include "remote/server/session.hpp"
#include "server_support.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace rstest;
namespace rs = backplane::remote::server;

namespace {

// Keeps every frame the session sends; the client's store always fails.
class Recorder final : public rs::Sender {
 public:
  struct Sent {
    std::vector<uint8_t> frame;
    std::vector<uint8_t> payload;
    const wire::Message* msg() const { return wire::GetMessage(frame.data() + wire::kHeaderBytes); }
  };
  std::vector<Sent> sent;
  std::vector<rs::KvCall> kv_calls;

  void send(wire::Encoded f) override { sent.push_back({std::move(f.bytes), {}}); }
  bool send_with_payload(wire::Encoded f, std::span<const uint8_t> p) override {
    sent.push_back({std::move(f.bytes), std::vector<uint8_t>(p.begin(), p.end())});
    return true;
  }
  rs::KvResult kv(const rs::KvCall& call, std::chrono::milliseconds) override {
    kv_calls.push_back(call);
    return {BP_STATUS_UNAVAILABLE, "no store in this test", {}};
  }
  Answer last() const {
    Frame f;
    f.message.assign(sent.back().frame.begin() + wire::kHeaderBytes, sent.back().frame.end());
    return answer_of(f);
  }
};

// Runs one client frame (header + message, as msg:: makes them) through the session.
void run(rs::Session& s, const std::vector<uint8_t>& frame, std::span<const uint8_t> payload = {}) {
  const wire::Message* m = wire::GetMessage(frame.data() + wire::kHeaderBytes);
  std::string why;
  const auto r = rs::route(*m, payload.size(), why);
  REQUIRE_MESSAGE(r == rs::Route::worker, why);
  s.handle(*m, payload);
}

std::optional<rs::Route> route_of(const std::vector<uint8_t>& frame, uint64_t payload, std::string& why) {
  return rs::route(*wire::GetMessage(frame.data() + wire::kHeaderBytes), payload, why);
}

}  // namespace

TEST_CASE("remote session: route sends device work to the worker and control at once and refuses the rest") {
  std::string why;
  CHECK(route_of(msg::alloc(1, 1, 0, 8), 0, why) == rs::Route::worker);
  CHECK(route_of(msg::write(1, 1, 0, 8), 8, why) == rs::Route::worker);
  CHECK(route_of(msg::synchronize(1), 0, why) == rs::Route::worker);
  CHECK(route_of(msg::ping(1), 0, why) == rs::Route::ping);
  CHECK(route_of(msg::goodbye(1), 0, why) == rs::Route::goodbye);
  flatbuffers::FlatBufferBuilder b;
  CHECK(route_of(frame_of(b, 1, wire::CreateCommAbort(b, 3)), 0, why) == rs::Route::abort);
  b.Clear();
  CHECK(route_of(frame_of(b, 1, wire::CreateKvReply(b, 0)), 0, why) == rs::Route::kv_reply);

  CHECK_FALSE(route_of(msg::write(1, 1, 0, 8), 7, why));
  CHECK(why == "sent a Write whose frame carries 7 payload bytes but whose size field says 8");
  CHECK_FALSE(route_of(msg::synchronize(1), 3, why));
  CHECK(why == "sent a Synchronize whose frame carries 3 payload bytes (only a Write carries a payload)");
  CHECK_FALSE(route_of(msg::proof({}), 0, why));
  CHECK(why == "sent a Proof after its handshake had finished");
  b.Clear();
  CHECK_FALSE(route_of(frame_of(b, 1, wire::CreateFatal(b, 1)), 0, why));
  CHECK(why == "sent a Fatal, which only a server sends");
}

TEST_CASE(
    "remote session: pipelined failures are kept for the next synchronising request and release frees all") {
  rs::Counters counters;
  Recorder out;
  rs::ServerLimits limits;
  limits.max_session_bytes = 100;
  {
    rs::Session s(7, cpu_backend(), limits, counters, out);
    run(s, msg::alloc(1, 1, 0, 40));
    run(s, msg::alloc(2, 2, 0, 40));
    CHECK(out.sent.empty());  // pipelined: no reply
    CHECK(counters.bytes == 80);
    CHECK(counters.buffers == 2);
    CHECK(s.bytes() == 80);
    run(s, msg::alloc(3, 3, 0, 40));  // over 100 bytes
    run(s, msg::free(4, 99));
    run(s, msg::synchronize(5));
    REQUIRE(out.sent.size() == 1);
    Answer a = out.last();
    CHECK(a.status == BP_STATUS_OUT_OF_MEMORY);
    CHECK(
        a.message ==
        "buffer_alloc (request 3) of 40 bytes for buffer 3 on device 0: this session holds 80 bytes; 40 more "
        "would pass the server's limit of 100 bytes per session (backplane serve --max-session-bytes) (and 1 "
        "later "
        "pipelined request(s) failed too)");
    run(s, msg::synchronize(6));
    CHECK(out.last().status == BP_STATUS_OK);
    CHECK(out.sent.back().msg()->id() == 6);

    // A read of a host-visible buffer: the bytes the write put there.
    const std::vector<int32_t> v{5, 6, 7};
    run(s, msg::write(7, 1, 4, 12), bytes_of(v));
    run(s, msg::read(8, 1, 4, 12));
    CHECK(out.last().status == BP_STATUS_OK);
    CHECK(values_of<int32_t>(out.sent.back().payload) == v);
    CHECK(out.sent.back().msg()->body_as_ReadReply()->size() == 12);
    s.release();
    CHECK(counters.bytes == 0);
    CHECK(counters.buffers == 0);
    const std::size_t n = out.sent.size();
    run(s, msg::synchronize(9));  // a released session runs nothing more
    CHECK(out.sent.size() == n);
  }
  CHECK(counters.bytes == 0);
}

TEST_CASE(
    "remote session: comm_create asks the client's store through the Sender and its failure fails the "
    "create") {
  rs::Counters counters;
  Recorder out;
  rs::Session s(1, cpu_backend(), rs::ServerLimits{}, counters, out);
  flatbuffers::FlatBufferBuilder b;
  run(s, frame_of(b, 1, wire::CreateCommCreate(b, 5, 0, 0, 2, 10000, b.CreateString("job/"))));
  CHECK_FALSE(out.kv_calls.empty());
  for (const rs::KvCall& call : out.kv_calls)
    for (const std::string& key : call.keys) CHECK(key.rfind("job/", 0) == 0);
  REQUIRE(out.sent.size() == 1);
  const Answer a = out.last();
  CHECK(a.status != BP_STATUS_OK);
  CHECK(a.message.find("comm_create (request 1) of communicator 5 (rank 0 of 2) on device 0: ") == 0);
  CHECK(counters.comms == 0);
  // Bad arguments never reach the backend.
  b.Clear();
  run(s, frame_of(b, 2, wire::CreateCommCreate(b, 6, 0, 2, 2, 10000, b.CreateString("job/"))));
  CHECK(out.last().message.find("rank 2 is outside 0..1") != std::string::npos);
  b.Clear();
  run(s, frame_of(b, 3, wire::CreateCommCreate(b, 6, 0, 0, 2, 0, b.CreateString("job/"))));
  CHECK(out.last().message.find("timeout_ms 0 is outside") != std::string::npos);
  b.Clear();
  run(s, frame_of(b, 4, wire::CreateCollective(b, 6, wire::CollectiveKind::Barrier)));
  CHECK(out.last().message.find("communicator 6 is not a communicator of this session") != std::string::npos);
}

TEST_CASE(
    "remote session: --max-total-bytes holds across sessions and a refused Alloc leaves the others going") {
  rs::Counters counters;
  Recorder out_a, out_b;
  rs::ServerLimits limits;
  limits.max_total_bytes = 100;
  rs::Session a(1, cpu_backend(), limits, counters, out_a);
  rs::Session b(2, cpu_backend(), limits, counters, out_b);
  run(a, msg::alloc(1, 1, 0, 60));
  run(b, msg::alloc(1, 1, 0, 40));
  CHECK(counters.bytes == 100);
  run(b, msg::alloc(2, 2, 0, 1));  // one byte past the whole
  run(b, msg::synchronize(3));
  REQUIRE(out_b.sent.size() == 1);
  const Answer refused = out_b.last();
  CHECK(refused.status == BP_STATUS_OUT_OF_MEMORY);
  CHECK_MESSAGE(
      refused.message.find("allocating 1 bytes would pass the server's limit of 100 bytes for all sessions "
                           "together (backplane serve --max-total-bytes): it holds 100 (100 in buffers") !=
          std::string::npos,
      refused.message);
  CHECK(counters.bytes == 100);  // the refused reservation was given back
  CHECK(counters.memory.held() == 100);
  // A size that overflows any sum is refused the same way.
  run(b, msg::alloc(4, 4, 0, UINT64_MAX));
  run(b, msg::synchronize(5));
  CHECK(out_b.last().status == BP_STATUS_OUT_OF_MEMORY);
  CHECK(counters.bytes == 100);
  // The other session goes on, and what one frees another may take.
  run(a, msg::free(6, 1));
  run(b, msg::alloc(7, 2, 0, 50));
  run(b, msg::synchronize(8));
  CHECK(out_b.last().status == BP_STATUS_OK);
  CHECK(counters.bytes == 90);
  a.release();
  b.release();
  CHECK(counters.bytes == 0);
}
