// The server's one memory account (--max-total-bytes): write payloads staged
// for a busy worker count with the buffers, an allocation past it is
// out_of_memory, a write that finds no room fails in its place, and the
// session, the server and an idle session go on.
#include "server_support.hpp"

#include <doctest/doctest.h>

#include <poll.h>

#include <string>
#include <thread>
#include <vector>

using namespace rstest;
namespace rs = backplane::remote::server;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Rank 0 of a group of 2 whose rendezvous asks the client's store: the
// session's worker waits for the client's answer until it comes.
std::vector<uint8_t> comm_create(uint64_t id, uint64_t comm) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, wire::CreateCommCreate(b, comm, 0, 0, 2, 120000, b.CreateString("test/memory/")));
}

std::vector<uint8_t> kv_failure(uint64_t id) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id,
                  wire::CreateKvReply(b, BP_STATUS_UNAVAILABLE, b.CreateString("test: no peer will come"),
                                      b.CreateVector(std::vector<uint8_t>{})));
}

Answer sync(RawClient& c, uint64_t id) {
  const auto r = c.request(msg::synchronize(id));
  REQUIRE(r);
  CHECK(r->msg()->id() == id);
  return answer_of(*r);
}

// The number in `text` after `before`, or -1.
long number_after(const std::string& text, const std::string& before) {
  const auto at = text.find(before);
  if (at == std::string::npos) return -1;
  return std::stol(text.substr(at + before.size()));
}

}  // namespace

TEST_CASE(
    "remote server: writes staged for a busy worker count against --max-total-bytes and an idle session goes "
    "on") {
  rs::ServerOptions o = test_options();
  o.limits.max_total_bytes = 16 * kMiB;
  auto server = std::make_unique<rs::Server>(cpu_backend(), o);

  RawClient idle(server->port());
  REQUIRE(idle.handshake());
  std::vector<uint8_t> small(kMiB);
  for (std::size_t i = 0; i < small.size(); ++i) small[i] = static_cast<uint8_t>(i * 7 + 1);
  REQUIRE(idle.send(msg::alloc(1, 1, 0, kMiB)));
  REQUIRE(idle.write(2, 1, 0, small));
  REQUIRE(sync(idle, 3).status == BP_STATUS_OK);

  RawClient busy(server->port());
  REQUIRE(busy.handshake());
  REQUIRE(busy.send(msg::alloc(1, 1, 0, 8 * kMiB)));
  REQUIRE(sync(busy, 2).status == BP_STATUS_OK);
  // (A spare payload buffer of the idle session's write goes once its worker is idle.)
  REQUIRE(wait_until([&] { return server->stats().held == static_cast<int64_t>(9 * kMiB); }));
  // The worker now waits on the client's store, which does not answer yet.
  REQUIRE(busy.send(comm_create(3, 5)));
  const auto asked = busy.read_frame();
  REQUIRE(asked);
  REQUIRE(asked->type() == wire::Body::KvRequest);

  // Twelve 1 MiB writes behind it: 7 MiB of room stages the first seven;
  // the rest find none and fail (the worker waits on the store, so reading
  // goes on for the client's answer).
  constexpr int kWrites = 12;
  std::vector<uint8_t> data(kWrites * kMiB);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 11);
  std::thread writer([&] {
    for (int i = 0; i < kWrites; ++i)
      busy.write(10 + static_cast<uint64_t>(i), 1, static_cast<uint64_t>(i) * kMiB,
                 std::span<const uint8_t>(data.data() + static_cast<std::size_t>(i) * kMiB, kMiB));
  });
  writer.join();
  REQUIRE(wait_until([&] { return server->stats().held >= static_cast<int64_t>(15 * kMiB); }));
  CHECK(server->stats().held <= static_cast<int64_t>(16 * kMiB));
  CHECK(server->stats().bytes == static_cast<int64_t>(9 * kMiB));

  // An allocation that the buffers alone would leave room for is out_of_memory,
  // and the idle session goes on: a ping, and its data read back.
  REQUIRE(idle.send(msg::alloc(4, 2, 0, 2 * kMiB)));
  const Answer refused = sync(idle, 5);
  CHECK(refused.status == BP_STATUS_OUT_OF_MEMORY);
  CHECK_MESSAGE(refused.message.find("allocating 2097152 bytes would pass the server's limit of 16777216 "
                                     "bytes for all sessions together (backplane serve --max-total-bytes)") !=
                    std::string::npos,
                refused.message);
  CHECK_MESSAGE(refused.message.find("9437184 in buffers") != std::string::npos, refused.message);
  const auto pong = idle.request(msg::ping(6));
  REQUIRE(pong);
  CHECK(answer_of(*pong).status == BP_STATUS_OK);
  const auto back = idle.request(msg::read(7, 1, 0, kMiB));
  REQUIRE(back);
  REQUIRE(answer_of(*back).status == BP_STATUS_OK);
  CHECK(back->payload == small);

  // The store fails the rendezvous; the staged writes land, the others fail
  // with out_of_memory at the next synchronising request, and the session goes on.
  REQUIRE(busy.send(kv_failure(asked->msg()->id())));
  std::optional<Frame> created;
  while (!created) {
    auto f = busy.read_frame();
    REQUIRE(f);
    if (f->type() == wire::Body::KvRequest) {
      REQUIRE(busy.send(kv_failure(f->msg()->id())));
    } else if (f->msg()->id() == 3) {
      created = std::move(f);
    }
  }
  CHECK(answer_of(*created).status != BP_STATUS_OK);
  const Answer failed = sync(busy, 30);
  CHECK(failed.status == BP_STATUS_OUT_OF_MEMORY);
  CHECK_MESSAGE(failed.message.find("staging a write of 1048576 bytes would pass the server's limit of "
                                    "16777216 bytes") != std::string::npos,
                failed.message);
  // The first refused write is the first that did not fit; the later ones are counted.
  const long later = number_after(failed.message, "(and ");
  const long landed = kWrites - 1 - std::max(0L, later);
  CHECK(landed >= 1);
  CHECK(landed <= 7);
  const auto written = busy.request(msg::read(31, 1, 0, static_cast<uint64_t>(landed) * kMiB));
  REQUIRE(written);
  REQUIRE(answer_of(*written).status == BP_STATUS_OK);
  CHECK(written->payload ==
        std::vector<uint8_t>(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(landed * kMiB)));
  REQUIRE(sync(busy, 32).status == BP_STATUS_OK);

  // Once the staged payloads are freed (and the large spare buffers dropped),
  // the allocation refused above fits.
  REQUIRE(wait_until([&] { return server->stats().held == static_cast<int64_t>(9 * kMiB); }));
  REQUIRE(idle.send(msg::alloc(8, 2, 0, 2 * kMiB)));
  CHECK(sync(idle, 9).status == BP_STATUS_OK);
  CHECK(idle.send(msg::goodbye(10)));
  CHECK(busy.send(msg::goodbye(33)));
  CHECK(idle.closed_by_peer());
  CHECK(busy.closed_by_peer());
  CHECK(server_is_empty(*server));
  CHECK(server->stats().held == 0);
}
