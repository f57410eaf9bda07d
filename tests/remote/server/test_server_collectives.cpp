// Collectives between sessions: the hosted cpu backend's communicator asks the
// job's key-value store through KvRequests that each client answers (here
// from one in-test store), and the data moves between the server's ranks.
// Also: CommAbort reaches a blocked collective, and a client that vanishes
// while its comm_create waits on the store is freed.
#include "server_support.hpp"

#include <doctest/doctest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

using namespace rstest;
namespace rs = backplane::remote::server;

namespace {

// The job's store, as the clients' rendezvous store would be.
class TestStore {
 public:
  void set(const std::string& key, std::vector<uint8_t> value) {
    std::lock_guard lock(mutex_);
    values_[key] = std::move(value);
  }
  std::optional<std::vector<uint8_t>> get(const std::string& key) {
    std::lock_guard lock(mutex_);
    const auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::vector<uint8_t>> values_;
};

std::vector<uint8_t> kv_reply(uint64_t id, const std::vector<uint8_t>& value = {}) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, wire::CreateKvReply(b, BP_STATUS_OK, b.CreateString(""), b.CreateVector(value)));
}

// Reads frames until the answer to request `id`, answering the server's
// KvRequests from `store` meanwhile (a get or wait whose keys are missing
// waits for the other client to set them).
std::optional<Frame> await(RawClient& c, uint64_t id, TestStore& store) {
  std::vector<Frame> waiting;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    for (auto it = waiting.begin(); it != waiting.end();) {
      const wire::KvRequest* r = it->msg()->body_as_KvRequest();
      bool all = true;
      std::vector<uint8_t> value;
      for (const auto* k : *r->keys()) {
        auto v = store.get(k->str());
        all = all && v.has_value();
        if (v) value = std::move(*v);
      }
      if (!all) {
        ++it;
        continue;
      }
      c.send(kv_reply(it->msg()->id(), r->kind() == wire::KvKind::Get ? value : std::vector<uint8_t>{}));
      it = waiting.erase(it);
    }
    pollfd p{c.fd(), POLLIN, 0};
    if (::poll(&p, 1, 10) <= 0) continue;
    auto f = c.read_frame();
    if (!f) return std::nullopt;
    if (f->type() != wire::Body::KvRequest) {
      if (f->msg()->id() == id) return f;
      continue;
    }
    const wire::KvRequest* r = f->msg()->body_as_KvRequest();
    if (r->kind() == wire::KvKind::Set) {
      store.set(r->keys()->Get(0)->str(), std::vector<uint8_t>(r->value()->begin(), r->value()->end()));
      c.send(kv_reply(f->msg()->id()));
    } else {
      waiting.push_back(std::move(*f));
    }
  }
  return std::nullopt;
}

std::vector<uint8_t> comm_create(uint64_t id, uint64_t comm, int32_t rank, int32_t world,
                                 int64_t timeout_ms) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id,
                  wire::CreateCommCreate(b, comm, 0, rank, world, timeout_ms, b.CreateString("test/c1/")));
}

std::vector<uint8_t> all_reduce(uint64_t id, uint64_t comm, uint64_t buffer, int64_t n) {
  flatbuffers::FlatBufferBuilder b;
  const msg::Desc d = msg::contiguous(buffer, {n});
  const auto in = msg::tensor(b, d);
  const auto out = msg::tensor(b, d);
  return frame_of(b, id,
                  wire::CreateCollective(b, comm, wire::CollectiveKind::AllReduce, in, out, BP_REDUCE_SUM));
}

}  // namespace

TEST_CASE("remote server: two sessions form a group through their clients' store and all-reduce") {
  auto server = std::make_unique<rs::Server>(cpu_backend(), test_options());
  TestStore store;
  std::vector<std::vector<float>> results(2);
  std::vector<std::string> failures(2);
  auto rank = [&](int r) {
    try {
      RawClient c(server->port());
      const auto welcome = c.handshake();
      if (!welcome || welcome->type() != wire::Body::Welcome) throw std::runtime_error("no Welcome");
      const std::vector<float> mine = r == 0 ? std::vector<float>{1, 2, 3} : std::vector<float>{10, 20, 30};
      c.send(msg::alloc(1, 1, 0, 12));
      c.write(2, 1, 0, bytes_of(mine));
      c.send(comm_create(3, 9, r, 2, 30000));
      auto created = await(c, 3, store);
      if (!created || answer_of(*created).status != BP_STATUS_OK)
        throw std::runtime_error("comm_create: " +
                                 (created ? answer_of(*created).message : std::string("no reply")));
      c.send(all_reduce(4, 9, 1, 3));
      auto reduced = await(c, 4, store);
      if (!reduced || answer_of(*reduced).status != BP_STATUS_OK)
        throw std::runtime_error("all_reduce: " +
                                 (reduced ? answer_of(*reduced).message : std::string("no reply")));
      flatbuffers::FlatBufferBuilder b;
      c.send(frame_of(b, 5, wire::CreateCommDestroy(b, 9)));
      auto destroyed = await(c, 5, store);
      if (!destroyed || answer_of(*destroyed).status != BP_STATUS_OK)
        throw std::runtime_error("comm_destroy");
      auto read = c.request(msg::read(6, 1, 0, 12));
      if (!read) throw std::runtime_error("read");
      results[static_cast<std::size_t>(r)] = values_of<float>(read->payload);
    } catch (const std::exception& e) {
      failures[static_cast<std::size_t>(r)] = e.what();
    }
  };
  std::thread r0(rank, 0), r1(rank, 1);
  r0.join();
  r1.join();
  CHECK(failures[0] == "");
  CHECK(failures[1] == "");
  CHECK(results[0] == std::vector<float>{11, 22, 33});
  CHECK(results[1] == std::vector<float>{11, 22, 33});
  CHECK(server_is_empty(*server));
}

TEST_CASE("remote server: CommAbort reaches a collective that waits for a peer") {
  auto server = std::make_unique<rs::Server>(cpu_backend(), test_options());
  TestStore store;
  RawClient a(server->port()), b(server->port());
  REQUIRE(a.handshake());
  REQUIRE(b.handshake());
  for (RawClient* c : {&a, &b}) REQUIRE(c->send(msg::alloc(1, 1, 0, 4)));
  // Both join; the communicator's own timeout (60 s) is far beyond the abort.
  std::optional<Frame> created_b;
  std::thread tb([&] {
    b.send(comm_create(2, 4, 1, 2, 60000));
    created_b = await(b, 2, store);
  });
  REQUIRE(a.send(comm_create(2, 4, 0, 2, 60000)));
  const auto created_a = await(a, 2, store);
  tb.join();
  REQUIRE(created_a);
  REQUIRE(created_b);
  REQUIRE(answer_of(*created_a).status == BP_STATUS_OK);
  REQUIRE(answer_of(*created_b).status == BP_STATUS_OK);
  CHECK(server->stats().comms == 2);
  // Only a enters the all-reduce; its CommAbort, sent behind it, is handled at once.
  REQUIRE(a.send(all_reduce(3, 4, 1, 1)));
  flatbuffers::FlatBufferBuilder fb;
  REQUIRE(a.send(frame_of(fb, 4, wire::CreateCommAbort(fb, 4))));
  const auto reduced = await(a, 3, store);
  REQUIRE(reduced);
  CHECK(answer_of(*reduced).status != BP_STATUS_OK);
}

TEST_CASE("remote server: a client that vanishes while comm_create waits on its store is freed") {
  auto server = std::make_unique<rs::Server>(cpu_backend(), test_options());
  {
    RawClient c(server->port());
    REQUIRE(c.handshake());
    REQUIRE(c.send(msg::alloc(1, 1, 0, 1024)));
    // Rank 0 of 2: the backend asks the store for rank 1, which never comes.
    REQUIRE(c.send(comm_create(2, 3, 0, 2, 120000)));
    const auto f = c.read_frame();
    REQUIRE(f);
    CHECK(f->type() == wire::Body::KvRequest);
    c.reset();
  }
  // Freed long before the communicator's 120 s timeout (30 s is the safety bound).
  CHECK(server_is_empty(*server));
}
