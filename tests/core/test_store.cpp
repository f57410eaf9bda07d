// The TCP rendezvous store and Rendezvous: the store's operations across
// ranks and threads, its timeouts and handshake checks, its survival of
// hostile input, and Rendezvous::from_env for each launcher's variables.
#include "test_support.hpp"

#include <backplane/backplane.hpp>
#include <backplane/rendezvous.hpp>

#include "distributed/slurm_hostlist.hpp"
#include "distributed/store_wire.hpp"
#include "free_port.hpp"
#include "store_raw_client.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace bp = backplane;
using namespace std::chrono_literals;
using std::chrono::milliseconds;

namespace {

std::vector<uint8_t> bytes(std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

constexpr std::string_view kSecret = "test-store-secret";

uint16_t port_of(const bp::Store& store) {
  const std::string a = store.address();
  return static_cast<uint16_t>(std::stoi(a.substr(a.rfind(':') + 1)));
}

bp::TcpStoreOptions options(int32_t rank, int32_t world_size, uint16_t port, milliseconds timeout = 5s) {
  bp::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.is_server = false;
  o.rank = rank;
  o.world_size = world_size;
  o.timeout = timeout;
  o.job_token = std::string(kSecret);
  return o;
}

// Rank 0 hosting a store for `world_size` ranks on an ephemeral port.
std::shared_ptr<bp::Store> host(int32_t world_size, milliseconds timeout = 5s) {
  bp::TcpStoreOptions o = options(0, world_size, 0, timeout);
  o.is_server = true;
  return bp::make_tcp_store(o);
}

using bptest::free_port;

using RawConnection = bptest::RawStoreClient;

// Frame pieces, through the real codec (core/distributed/store_wire.hpp).
void put32(std::vector<uint8_t>& v, uint32_t x) {
  uint8_t b[4];
  bp::store_wire::put_u32(b, x);
  v.insert(v.end(), b, b + 4);
}
void put64(std::vector<uint8_t>& v, uint64_t x) {
  uint8_t b[8];
  bp::store_wire::put_u64(b, x);
  v.insert(v.end(), b, b + 8);
}
void append(std::vector<uint8_t>& v, std::string_view s) {
  for (char c : s) v.push_back(static_cast<uint8_t>(c));
}
std::vector<uint8_t> frame_header(uint32_t payload_bytes, uint8_t kind, uint64_t id) {
  const bp::store_wire::Header h = bp::store_wire::make_header(payload_bytes, kind, id);
  return std::vector<uint8_t>(h.begin(), h.end());
}

// Unsets every variable from_env reads for a scope, and restores them all.
class EnvGuard {
 public:
  EnvGuard() {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name);
    }
  }
  ~EnvGuard() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  void unset(const char* name) { ::unsetenv(name); }

  static constexpr const char* kNames[] = {"RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_RANK",
                                           "OMPI_COMM_WORLD_RANK",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "SLURM_PROCID",
                                           "SLURM_NTASKS",
                                           "SLURM_LOCALID",
                                           "SLURM_STEP_NUM_NODES",
                                           "SLURM_JOB_NUM_NODES",
                                           "SLURM_NNODES",
                                           "SLURM_STEP_NODELIST",
                                           "SLURM_JOB_NODELIST",
                                           "SLURM_NODELIST",
                                           "SLURM_JOB_ID",
                                           "MASTER_ADDR",
                                           "MASTER_PORT",
                                           "BACKPLANE_TIMEOUT"};

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Runs fn on a thread and keeps the first failure's text for the main thread.
class Worker {
 public:
  template <class Fn>
  explicit Worker(Fn fn)
      : thread_([this, fn = std::move(fn)]() mutable {
          try {
            fn();
          } catch (const std::exception& e) {
            error_ = e.what();
          }
        }) {}
  ~Worker() {
    if (thread_.joinable()) thread_.join();
  }
  std::string join() {
    thread_.join();
    return error_;
  }

 private:
  std::string error_;
  std::thread thread_;
};

}  // namespace

TEST_CASE("store: set get wait add check and remove work across ranks") {
  constexpr int kWorld = 4;
  auto rank0 = host(kWorld);
  const uint16_t port = port_of(*rank0);
  std::vector<std::shared_ptr<bp::Store>> stores{rank0};
  for (int r = 1; r < kWorld; ++r) stores.push_back(bp::make_tcp_store(options(r, kWorld, port)));

  std::vector<std::string> all_keys;
  for (int r = 0; r < kWorld; ++r) all_keys.push_back("key/" + std::to_string(r));
  std::vector<std::unique_ptr<Worker>> workers;
  std::atomic<int> mismatches{0};
  for (int r = 0; r < kWorld; ++r) {
    workers.push_back(std::make_unique<Worker>([&, r] {
      bp::Store& s = *stores[r];
      s.set("key/" + std::to_string(r), bytes("value of " + std::to_string(r)));
      s.wait(all_keys, 5s);
      for (int peer = 0; peer < kWorld; ++peer) {
        if (text(s.get("key/" + std::to_string(peer), 5s)) != "value of " + std::to_string(peer))
          ++mismatches;
      }
      s.add("sum", r + 1);
    }));
  }
  for (auto& w : workers) CHECK(w->join() == "");
  CHECK(mismatches.load() == 0);

  bp::Store& s = *stores[1];
  CHECK(text(s.get("sum", 1s)) == "10");
  CHECK(s.add("sum", 0) == 10);
  CHECK(s.add("sum", -15) == -5);
  CHECK(s.add("fresh", 7) == 7);
  CHECK(s.check(all_keys));
  CHECK(s.check({}));
  CHECK_FALSE(s.check({"key/0", "absent"}));
  CHECK(s.remove("key/0"));
  CHECK_FALSE(s.remove("key/0"));
  CHECK_FALSE(stores[2]->check({"key/0"}));
  // Overwrites replace; empty values are values.
  stores[3]->set("key/1", {});
  CHECK(stores[0]->get("key/1", 1s).empty());
  CHECK(rank0->timeout() == 5s);
  CHECK(stores[3]->address() == "127.0.0.1:" + std::to_string(port));
}

TEST_CASE("store: get and wait time out naming the missing keys") {
  auto s = host(1);
  bp::Error e = bptest::error_from([&] { s->get("missing/key", 200ms); });
  CHECK(e.code() == bp::Errc::timeout);
  BP_CHECK_CONTAINS(e.message(), "'missing/key'");
  BP_CHECK_CONTAINS(e.message(), "0.2 s");
  BP_CHECK_CONTAINS(e.message(), s->address());

  s->set("present", bytes("x"));
  e = bptest::error_from([&] { s->wait({"present", "absent/one", "absent/two"}, 200ms); });
  CHECK(e.code() == bp::Errc::timeout);
  BP_CHECK_CONTAINS(e.message(), "'absent/one', 'absent/two'");
  CHECK(e.message().find("'present'") == std::string::npos);

  // A zero timeout polls: a present key is returned, a missing one times out at once.
  CHECK(text(s->get("present", 0ms)) == "x");
  CHECK(bptest::error_from([&] { s->get("absent/one", 0ms); }).code() == bp::Errc::timeout);
  // The store keeps serving after timeouts, and a key set later is found.
  s->set("absent/one", bytes("late"));
  CHECK(text(s->get("absent/one", 1s)) == "late");
}

TEST_CASE("store: a get parked on one thread does not hold up other threads on the same client") {
  auto s = host(1);
  std::string got;
  Worker waiter([&] { got = text(s->get("released/later", 20s)); });
  std::this_thread::sleep_for(50ms);  // lets the get reach the server first (not a timing assertion)
  // Were requests serialised behind the parked get, these would wait for it.
  s->set("other", bytes("1"));
  CHECK(text(s->get("other", 1s)) == "1");
  CHECK(s->add("counter", 3) == 3);
  s->set("released/later", bytes("now"));
  CHECK(waiter.join() == "");
  CHECK(got == "now");
}

TEST_CASE("store: waiters wake when their last key arrives and each gets its own reply") {
  auto rank0 = host(2);
  auto rank1 = bp::make_tcp_store(options(1, 2, port_of(*rank0)));
  std::vector<std::unique_ptr<Worker>> workers;
  std::atomic<int> done{0};
  for (int i = 0; i < 6; ++i) {
    workers.push_back(std::make_unique<Worker>([&, i] {
      if (i % 2 == 0) {
        rank1->wait({"w/a", "w/b", "w/c"}, 20s);
      } else {
        if (text(rank1->get("w/" + std::string(1, "abc"[i % 3]), 20s)).empty()) return;
      }
      ++done;
    }));
  }
  rank0->set("w/c", bytes("C"));
  rank0->set("w/a", bytes("A"));
  rank0->set("w/b", bytes("B"));
  for (auto& w : workers) CHECK(w->join() == "");
  CHECK(done.load() == 6);
}

TEST_CASE("store: a client started before the server connects once the server appears") {
  const uint16_t port = free_port();
  std::shared_ptr<bp::Store> late;
  std::string value;
  Worker client([&] {
    late = bp::make_tcp_store(options(1, 2, port, 10s));
    value = text(late->get("greeting", 10s));
  });
  std::this_thread::sleep_for(300ms);  // the client is retrying meanwhile
  bp::TcpStoreOptions o = options(0, 2, port);
  o.is_server = true;
  auto server = bp::make_tcp_store(o);
  CHECK(port_of(*server) == port);
  server->set("greeting", bytes("hello"));
  CHECK(client.join() == "");
  CHECK(value == "hello");
}

TEST_CASE("store: a wrong world size is refused naming both values on both sides") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  auto server = host(2);
  const uint16_t port = port_of(*server);
  bp::Error e = bptest::error_from([&] { bp::make_tcp_store(options(1, 3, port)); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "rank 1 says world_size 3 but the store at 127.0.0.1:" +
                                     std::to_string(port) + " was started with world_size 2");
  CHECK(
      logs.at(bp::LogLevel::warning, "rank 1 says world_size 3 but this store was started with world_size 2")
          .size() == 1);
  // The refused rank is not taken: the right world size connects.
  auto ok = bp::make_tcp_store(options(1, 2, port));
  ok->set("k", bytes("v"));
  CHECK(text(server->get("k", 1s)) == "v");
}

TEST_CASE("store: a duplicate rank is refused and freed when its holder leaves") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  auto server = host(3);
  const uint16_t port = port_of(*server);
  // Rank 0 is taken by the server's own client.
  bp::Error e = bptest::error_from([&] { bp::make_tcp_store(options(0, 3, port)); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(),
                    "rank 0 is already connected to the store at 127.0.0.1:" + std::to_string(port));
  BP_CHECK_CONTAINS(e.message(), "RANK");

  auto first = bp::make_tcp_store(options(2, 3, port));
  e = bptest::error_from([&] { bp::make_tcp_store(options(2, 3, port)); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "rank 2 is already connected");
  CHECK(logs.at(bp::LogLevel::warning, "rank 2 is already connected").size() == 1);

  // Once the holder disconnects the rank may join again (the server sees
  // the disconnect asynchronously, so allow it a moment).
  first.reset();
  std::shared_ptr<bp::Store> again;
  for (int attempt = 0; attempt < 100 && !again; ++attempt) {
    try {
      again = bp::make_tcp_store(options(2, 3, port));
    } catch (const bp::Error& err) {
      REQUIRE(err.code() == bp::Errc::invalid_argument);
      std::this_thread::sleep_for(20ms);
    }
  }
  REQUIRE(again);
  again->set("back", bytes("1"));
  CHECK(server->check({"back"}));
}

TEST_CASE("store: an unreachable store times out naming the address and MASTER_ADDR") {
  const uint16_t port = free_port();
  bp::Error e = bptest::error_from([&] { bp::make_tcp_store(options(1, 2, port, 300ms)); });
  CHECK(e.code() == bp::Errc::timeout);
  BP_CHECK_CONTAINS(e.message(), "127.0.0.1:" + std::to_string(port));
  BP_CHECK_CONTAINS(e.message(), "MASTER_ADDR/MASTER_PORT");
  BP_CHECK_CONTAINS(e.message(), "within 0.");
  BP_CHECK_CONTAINS(e.message(), "refused");

  // A non-routable address (TEST-NET-1): the connect itself must give up in time.
  bp::TcpStoreOptions o = options(1, 2, 29500, 300ms);
  o.host = "192.0.2.1";
  e = bptest::error_from([&] { bp::make_tcp_store(o); });
  CHECK(e.code() == bp::Errc::timeout);
  BP_CHECK_CONTAINS(e.message(), "192.0.2.1:29500");
}

TEST_CASE("store: destroying the server fails a waiting client with io_error") {
  auto server = host(2);
  auto client = bp::make_tcp_store(options(1, 2, port_of(*server), 30s));
  bp::Error seen(bp::Errc::internal, "");
  Worker waiter([&] {
    try {
      client->get("never/set", 30s);
    } catch (const bp::Error& e) {
      seen = e;
    }
  });
  std::this_thread::sleep_for(50ms);  // lets the get park on the server (either way it must fail)
  server.reset();                     // must not hang although the client is parked
  CHECK(waiter.join() == "");
  CHECK(seen.code() == bp::Errc::io_error);
  BP_CHECK_CONTAINS(seen.message(), "closed the connection");
  BP_CHECK_CONTAINS(seen.message(), "did rank 0 exit?");
  BP_CHECK_CONTAINS(seen.message(), "'never/set'");

  // Every later call fails the same way, at once.
  bp::Error later = bptest::error_from([&] { client->set("k", bytes("v")); });
  CHECK(later.code() == bp::Errc::io_error);
  BP_CHECK_CONTAINS(later.message(), "did rank 0 exit?");
}

TEST_CASE("store: garbage and malformed frames close only the offending connection") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  auto server = host(8);
  const uint16_t port = port_of(*server);

  {  // A port scanner or a stray HTTP client.
    RawConnection c(port);
    c.send(bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    CHECK(c.closed_by_peer());
  }
  {  // A frame announcing 4 GiB.
    RawConnection c(port);
    CHECK(c.authenticate(1, 8, kSecret) == 0);
    c.send(frame_header(0xffffffffu, 1, 1));
    CHECK(c.closed_by_peer());
  }
  {  // An unknown opcode.
    RawConnection c(port);
    CHECK(c.authenticate(2, 8, kSecret) == 0);
    c.send(frame_header(0, 0x7f, 1));
    CHECK(c.closed_by_peer());
  }
  {  // A get whose key length runs past the payload.
    RawConnection c(port);
    CHECK(c.authenticate(3, 8, kSecret) == 0);
    std::vector<uint8_t> f = frame_header(14, 2, 1);
    put64(f, 1000);
    put32(f, 100);
    append(f, "ab");
    c.send(f);
    CHECK(c.closed_by_peer());
  }
  {  // A frame cut short by the client going away: the server just drops it.
    RawConnection c(port);
    CHECK(c.authenticate(4, 8, kSecret) == 0);
    std::vector<uint8_t> f = frame_header(1000, 1, 1);
    append(f, "xxxxxxxxxx");
    c.send(f);
  }
  {  // Nonzero reserved header bytes.
    RawConnection c(port);
    CHECK(c.authenticate(5, 8, kSecret) == 0);
    std::vector<uint8_t> f = frame_header(0, 6, 1);
    f[6] = 1;
    c.send(f);
    CHECK(c.closed_by_peer());
  }
  {  // A rank outside the world: refused with its verdict, then closed.
    RawConnection c(port);
    CHECK(c.authenticate(9, 8, kSecret) == 3);
    CHECK(c.closed_by_peer());
  }
  {  // An empty key in a well-framed set.
    RawConnection c(port);
    CHECK(c.authenticate(6, 8, kSecret) == 0);
    std::vector<uint8_t> f = frame_header(5, 1, 1);
    put32(f, 0);
    f.push_back('v');
    c.send(f);
    CHECK(c.closed_by_peer());
  }
  {  // A well-formed set and get over the raw protocol are answered.
    RawConnection c(port);
    CHECK(c.authenticate(7, 8, kSecret) == 0);
    std::vector<uint8_t> f = frame_header(4 + 3 + 2, 1, 41);
    put32(f, 3);
    append(f, "rawok");
    c.send(f);
    std::vector<uint8_t> reply = c.read(16);
    REQUIRE(reply.size() == 16);
    CHECK(reply[4] == 0x80);
    CHECK(reply[15] == 41);
  }

  // The server kept serving: rank 0 works and rank 1 (closed by the server, so free) connects.
  server->set("after", bytes("garbage"));
  CHECK(text(server->get("raw", 1s)) == "ok");
  std::shared_ptr<bp::Store> rank1;
  for (int attempt = 0; attempt < 100 && !rank1; ++attempt) {
    try {
      rank1 = bp::make_tcp_store(options(1, 8, port));
    } catch (const bp::Error&) {
      std::this_thread::sleep_for(20ms);  // the last raw connection's close may still be in flight
    }
  }
  REQUIRE(rank1);
  CHECK(text(rank1->get("after", 1s)) == "garbage");

  CHECK(logs.at(bp::LogLevel::warning, "not a backplane store client").size() == 1);
  CHECK(logs.at(bp::LogLevel::warning, "bytes (the limit is").size() == 1);
  CHECK(logs.at(bp::LogLevel::warning, "unknown opcode 0x7f").size() == 1);
  CHECK(logs.at(bp::LogLevel::warning, "truncated payload").size() == 1);
  CHECK(logs.at(bp::LogLevel::warning, "reserved bytes").size() == 1);
  CHECK(logs.at(bp::LogLevel::warning, "rank 9 is out of range for world_size 8").size() == 1);
  CHECK(logs.at(bp::LogLevel::warning, "a key of 0 bytes").size() == 1);
  // The cut-short frame is noticed when its connection closes, at a moment of the server's choosing.
  for (int i = 0; i < 250 && logs.at(bp::LogLevel::warning, "truncated set frame").empty(); ++i) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK(logs.at(bp::LogLevel::warning, "truncated set frame (announced 1000 bytes").size() == 1);
}

TEST_CASE("store: a 64 MiB value round-trips between ranks") {
  auto rank0 = host(2, 30s);
  auto rank1 = bp::make_tcp_store(options(1, 2, port_of(*rank0), 30s));
  // A pattern block copied with a per-block stamp: every block differs, and
  // the fill stays cheap under the sanitizers.
  std::vector<uint8_t> block(std::size_t{64} << 10);
  for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  std::vector<uint8_t> big(std::size_t{64} << 20);
  for (std::size_t b = 0; b < big.size() / block.size(); ++b) {
    std::memcpy(big.data() + b * block.size(), block.data(), block.size());
    std::memcpy(big.data() + b * block.size(), &b, sizeof b);
  }
  rank1->set("big", big);
  std::vector<uint8_t> back = rank0->get("big", 30s);
  REQUIRE(back.size() == big.size());
  CHECK(back == big);
  CHECK(text(rank1->get("big", 30s)).size() == big.size());
}

TEST_CASE("store: concurrent adds from many threads sum exactly") {
  constexpr int kWorld = 3;
  constexpr int kThreads = 8;
  constexpr int kAdds = 150;
  auto rank0 = host(kWorld);
  std::vector<std::shared_ptr<bp::Store>> stores{rank0};
  for (int r = 1; r < kWorld; ++r) stores.push_back(bp::make_tcp_store(options(r, kWorld, port_of(*rank0))));
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.push_back(std::make_unique<Worker>([&, t] {
      for (int i = 0; i < kAdds; ++i) stores[t % kWorld]->add("counter", t + 1);
    }));
  }
  for (auto& w : workers) CHECK(w->join() == "");
  CHECK(rank0->add("counter", 0) == int64_t{kAdds} * (kThreads * (kThreads + 1) / 2));
}

TEST_CASE("store: bad arguments are refused with invalid_argument") {
  auto s = host(1);
  bp::Error e = bptest::error_from([&] { s->set("", bytes("v")); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "1 to 4096 bytes");
  CHECK(bptest::error_from([&] { s->get(std::string(4097, 'k'), 1s); }).code() == bp::Errc::invalid_argument);
  CHECK(bptest::error_from([&] { s->wait({"ok", ""}, 1s); }).code() == bp::Errc::invalid_argument);
  e = bptest::error_from([&] { s->get("k", -1ms); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "negative");

  s->set("text", bytes("abc"));
  e = bptest::error_from([&] { s->add("text", 1); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "'text' is not a decimal integer");
  s->set("big", bytes(std::to_string(INT64_MAX)));
  e = bptest::error_from([&] { s->add("big", 1); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "overflows");
  // A refused add changes nothing, and the connection stays usable.
  CHECK(text(s->get("text", 1s)) == "abc");

  auto bad = [](bp::TcpStoreOptions o) { return bptest::error_from([&] { bp::make_tcp_store(o); }); };
  e = bad(options(2, 2, 1234));
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "rank 2 is out of range for world_size 2");
  CHECK(bad(options(0, 0, 1234)).code() == bp::Errc::invalid_argument);
  e = bad(options(1, 2, 0));
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "port 0");
  bp::TcpStoreOptions o = options(1, 2, 1234);
  o.host = "";
  CHECK(bad(o).code() == bp::Errc::invalid_argument);
  CHECK(bad(options(1, 2, 1234, 0ms)).code() == bp::Errc::invalid_argument);
}

TEST_CASE("store: a port already in use is reported with MASTER_PORT") {
  auto first = host(1);
  bp::TcpStoreOptions o = options(0, 1, port_of(*first));
  o.is_server = true;
  bp::Error e = bptest::error_from([&] { bp::make_tcp_store(o); });
  CHECK(e.code() == bp::Errc::io_error);
  BP_CHECK_CONTAINS(e.message(), std::to_string(port_of(*first)));
  BP_CHECK_CONTAINS(e.message(), "MASTER_PORT");
}

TEST_CASE("rendezvous: from_env reads RANK WORLD_SIZE and LOCAL_RANK") {
  EnvGuard env;
  env.set("RANK", "2");
  env.set("WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "1");
  bp::Rendezvous r = bp::Rendezvous::from_env();
  CHECK(r.rank() == 2);
  CHECK(r.world_size() == 4);
  CHECK(r.local_rank() == 1);
  CHECK(r.master_addr() == "127.0.0.1");
  CHECK(r.master_port() == 29500);
  CHECK(r.timeout() == 300s);
  CHECK(r.source() == "RANK/WORLD_SIZE");

  env.unset("LOCAL_RANK");
  env.set("MASTER_ADDR", "node-17");
  env.set("MASTER_PORT", "6001");
  env.set("BACKPLANE_TIMEOUT", "0.25");
  r = bp::Rendezvous::from_env();
  CHECK(r.local_rank() == 2);
  CHECK(r.master_addr() == "node-17");
  CHECK(r.master_port() == 6001);
  CHECK(r.timeout() == 250ms);
}

TEST_CASE("rendezvous: from_env reads Open MPI's variables") {
  EnvGuard env;
  env.set("OMPI_COMM_WORLD_RANK", "3");
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "3");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  bp::Rendezvous r = bp::Rendezvous::from_env();
  CHECK(r.rank() == 3);
  CHECK(r.world_size() == 4);
  CHECK(r.local_rank() == 3);
  CHECK(r.master_addr() == "127.0.0.1");
  CHECK(r.source() == "Open MPI");

  // Ranks on several nodes: MASTER_ADDR is required, then used.
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  bp::Error e = bptest::error_from([] { bp::Rendezvous::from_env(); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "MASTER_ADDR is not set");
  BP_CHECK_CONTAINS(e.message(), "OMPI_COMM_WORLD_LOCAL_SIZE=2 of OMPI_COMM_WORLD_SIZE=4");
  BP_CHECK_CONTAINS(e.message(), "export MASTER_ADDR");
  env.unset("OMPI_COMM_WORLD_LOCAL_SIZE");
  CHECK(bptest::error_from([] { bp::Rendezvous::from_env(); }).code() == bp::Errc::invalid_argument);
  env.set("MASTER_ADDR", "10.1.2.3");
  r = bp::Rendezvous::from_env();
  CHECK(r.master_addr() == "10.1.2.3");
  CHECK(r.local_rank() == 1);
}

TEST_CASE("rendezvous: from_env reads Slurm's variables") {
  EnvGuard env;
  env.set("SLURM_PROCID", "1");
  env.set("SLURM_NTASKS", "2");
  env.set("SLURM_LOCALID", "1");
  env.set("SLURM_NNODES", "1");
  bp::Rendezvous r = bp::Rendezvous::from_env();
  CHECK(r.rank() == 1);
  CHECK(r.world_size() == 2);
  CHECK(r.local_rank() == 1);
  CHECK(r.master_addr() == "127.0.0.1");
  CHECK(r.source() == "Slurm");

  env.unset("SLURM_NNODES");
  env.set("SLURM_JOB_NUM_NODES", "2");
  env.set("SLURM_LOCALID", "0");
  bp::Error e = bptest::error_from([] { bp::Rendezvous::from_env(); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "SLURM_JOB_NUM_NODES=2");
  BP_CHECK_CONTAINS(e.message(), "none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST and SLURM_NODELIST is set");
  BP_CHECK_CONTAINS(e.message(), "srun");
  env.unset("SLURM_JOB_NUM_NODES");
  e = bptest::error_from([] { bp::Rendezvous::from_env(); });
  BP_CHECK_CONTAINS(e.message(), "MASTER_ADDR is not set");
  env.set("MASTER_ADDR", "head-node");
  CHECK(bp::Rendezvous::from_env().master_addr() == "head-node");
}

TEST_CASE("rendezvous: the first host of a Slurm node list keeps its zero padding") {
  struct Case {
    const char* list;
    const char* first;
  };
  const Case cases[] = {
      {"node[07-09,12],gpu1", "node07"},
      {"a,b", "a"},
      {"solo", "solo"},
      {"node7", "node7"},
      {"node[7-9]", "node7"},
      {"node[009-011]", "node009"},
      {"node[12,07-09]", "node12"},
      {"node[5]", "node5"},
      {"gpu1,node[07-09]", "gpu1"},
      {"rack[2-3]-n[001-004],x", "rack2-n001"},
      {"n[1-2].cluster.example", "n1.cluster.example"},
      {"head_node-1.lan", "head_node-1.lan"},
      {"[3-4]", "3"},
      {"c[1-2],d[3-4],e", "c1"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.list);
    CHECK(bp::slurm::first_host("SLURM_JOB_NODELIST", c.list) == c.first);
  }
}

TEST_CASE("rendezvous: a malformed Slurm node list is refused naming the variable and the fault") {
  struct Case {
    const char* list;
    const char* fault;
  };
  const Case cases[] = {
      {"", "it is empty"},
      {",node1", "an empty entry at offset 0"},
      {"node1,,node2", "an empty entry at offset 6"},
      {"node1,", "it ends with a comma"},
      {"node[1-3", "a '[' at offset 4 is never closed"},
      {"node[1-[3]]", "brackets nest at offset 7"},
      {"node]1", "a ']' at offset 4 closes nothing"},
      {"node[1-2]]", "a ']' at offset 9 closes nothing"},
      {"node[]", "empty brackets []"},
      {"node[a-b]", "'[a-b]' holds 'a-b', which is not a number N or a range N-M"},
      {"node[1,]", "holds '', which is not a number"},
      {"node[-3]", "holds '-3'"},
      {"node[1-]", "holds '1-'"},
      {"node[1-2-3]", "holds '1-2-3'"},
      {"node[09-3]", "the range 09-3 in '[09-3]' runs backwards"},
      {"node 1", "byte 32 at offset 4"},
      {"node\n1", "byte 10 at offset 4"},
      {"node/1", "'/' at offset 4 is not part of a host name"},
      {"gpu1,bad[2-1]", "runs backwards"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.list);
    bp::Error e = bptest::error_from([&] { bp::slurm::first_host("SLURM_STEP_NODELIST", c.list); });
    CHECK(e.code() == bp::Errc::invalid_argument);
    BP_CHECK_CONTAINS(e.message(), "environment variable SLURM_STEP_NODELIST='");
    BP_CHECK_CONTAINS(e.message(), "is not a Slurm host list");
    BP_CHECK_CONTAINS(e.message(), c.fault);
    CHECK(e.message().find('\n') == std::string::npos);
  }
}

TEST_CASE("rendezvous: under Slurm the store is on the first node at a port from the job id") {
  EnvGuard env;
  env.set("SLURM_PROCID", "3");
  env.set("SLURM_NTASKS", "4");
  env.set("SLURM_LOCALID", "1");
  env.set("SLURM_JOB_NUM_NODES", "2");
  env.set("SLURM_JOB_NODELIST", "node[07-09,12],gpu1");
  env.set("SLURM_JOB_ID", "123456");
  bp::Rendezvous r = bp::Rendezvous::from_env();
  CHECK(r.source() == "Slurm");
  CHECK(r.rank() == 3);
  CHECK(r.local_rank() == 1);
  CHECK(r.master_addr() == "node07");
  CHECK(r.master_port() == 10000 + 123456 % 20000);

  // The ports span 10000..29999, below the kernel's ephemeral ports.
  for (const auto& [id, port] :
       std::vector<std::pair<const char*, int>>{{"0", 10000},
                                                {"1", 10001},
                                                {"19999", 29999},
                                                {"20000", 10000},
                                                {"9223372036854775807", 10000 + 15807}}) {
    CAPTURE(id);
    env.set("SLURM_JOB_ID", id);
    CHECK(bp::Rendezvous::from_env().master_port() == port);
  }

  // Steps of one job get ports of their own (step 0 keeps the job's).
  env.set("SLURM_JOB_ID", "0");
  for (const auto& [step, port] : std::vector<std::pair<const char*, int>>{
           {"0", 10000},
           {"1", 14001},
           {"5", 10005},
           {"4294967294", 10000 + (4294967294 % 20000) * 4001 % 20000}}) {
    CAPTURE(step);
    env.set("SLURM_STEP_ID", step);
    CHECK(bp::Rendezvous::from_env().master_port() == port);
  }
  env.set("SLURM_STEP_ID", "x1");
  BP_CHECK_CONTAINS(bptest::error_from([] { bp::Rendezvous::from_env(); }).message(), "SLURM_STEP_ID");
  env.unset("SLURM_STEP_ID");

  // The step's node list comes first (rank 0 runs on the step's first
  // node), then the job's, then SLURM_NODELIST.
  env.set("SLURM_STEP_NODELIST", "gpu[3-4]");
  CHECK(bp::Rendezvous::from_env().master_addr() == "gpu3");
  env.unset("SLURM_STEP_NODELIST");
  env.unset("SLURM_JOB_NODELIST");
  env.set("SLURM_NODELIST", "old[010-011]");
  CHECK(bp::Rendezvous::from_env().master_addr() == "old010");

  // A one-node step keeps the store on loopback, even in a larger job.
  env.set("SLURM_JOB_ID", "19999");
  env.set("SLURM_STEP_NUM_NODES", "1");
  r = bp::Rendezvous::from_env();
  CHECK(r.master_addr() == "127.0.0.1");
  CHECK(r.master_port() == 29999);
  env.set("SLURM_STEP_NUM_NODES", "2");
  CHECK(bp::Rendezvous::from_env().master_addr() == "old010");

  // MASTER_ADDR and MASTER_PORT win, and a node list is not even read then.
  env.set("SLURM_NODELIST", "broken[");
  env.set("MASTER_ADDR", "head");
  env.set("MASTER_PORT", "6001");
  r = bp::Rendezvous::from_env();
  CHECK(r.master_addr() == "head");
  CHECK(r.master_port() == 6001);

  // Without a job id, the default port.
  env.unset("MASTER_PORT");
  env.unset("SLURM_JOB_ID");
  CHECK(bp::Rendezvous::from_env().master_port() == 29500);
}

TEST_CASE("rendezvous: Slurm's malformed node list or job id is refused naming the variable") {
  EnvGuard env;
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_NTASKS", "2");
  env.set("SLURM_NNODES", "2");
  env.set("SLURM_JOB_NODELIST", "node[1-");
  bp::Error e = bptest::error_from([] { bp::Rendezvous::from_env(); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "SLURM_JOB_NODELIST='node[1-'");
  BP_CHECK_CONTAINS(e.message(), "never closed");

  env.set("SLURM_JOB_NODELIST", "node[1-2]");
  for (const char* id : {"abc", "-1", "12x", "", "99999999999999999999"}) {
    CAPTURE(id);
    env.set("SLURM_JOB_ID", id);
    e = bptest::error_from([] { bp::Rendezvous::from_env(); });
    CHECK(e.code() == bp::Errc::invalid_argument);
    BP_CHECK_CONTAINS(e.message(), "SLURM_JOB_ID");
  }
}

TEST_CASE("rendezvous: only Slurm's own ranks take the port from SLURM_JOB_ID") {
  // backplane launch or mpirun inside a Slurm allocation: the job id is in
  // the environment but the ranks are not Slurm's.
  EnvGuard env;
  env.set("SLURM_JOB_ID", "77");
  env.set("SLURM_JOB_NODELIST", "node[1-2]");
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "2");
  bp::Rendezvous r = bp::Rendezvous::from_env();
  CHECK(r.master_port() == 29500);
  CHECK(r.master_addr() == "127.0.0.1");
}

TEST_CASE("rendezvous: from_env prefers RANK then Open MPI then Slurm") {
  EnvGuard env;
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_NTASKS", "8");
  env.set("SLURM_NNODES", "1");
  env.set("OMPI_COMM_WORLD_RANK", "1");
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  CHECK(bp::Rendezvous::from_env().source() == "Open MPI");
  CHECK(bp::Rendezvous::from_env().world_size() == 4);
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "2");
  CHECK(bp::Rendezvous::from_env().source() == "RANK/WORLD_SIZE");
  CHECK(bp::Rendezvous::from_env().world_size() == 2);
}

TEST_CASE("rendezvous: from_env names each malformed variable and its value") {
  struct Case {
    const char* name;
    const char* value;
    const char* expected;
  };
  const Case cases[] = {
      {"RANK", "abc", "RANK='abc' is not a whole number"},
      {"RANK", "-1", "RANK=-1 is out of range"},
      {"RANK", "4", "RANK=4 is out of range for WORLD_SIZE=4"},
      {"RANK", "1.5", "RANK='1.5'"},
      {"RANK", "", "RANK=''"},
      {"WORLD_SIZE", "0", "WORLD_SIZE=0 is out of range"},
      {"WORLD_SIZE", "four", "WORLD_SIZE='four'"},
      {"WORLD_SIZE", "99999999999", "WORLD_SIZE=99999999999 is out of range"},
      {"LOCAL_RANK", "4", "LOCAL_RANK=4 is out of range"},
      {"LOCAL_RANK", "x", "LOCAL_RANK='x'"},
      {"MASTER_PORT", "0", "MASTER_PORT=0 is out of range"},
      {"MASTER_PORT", "65536", "MASTER_PORT=65536 is out of range"},
      {"MASTER_PORT", "http", "MASTER_PORT='http'"},
      {"MASTER_PORT", " 80", "MASTER_PORT=' 80'"},
      {"MASTER_ADDR", "", "MASTER_ADDR is set but empty"},
      {"BACKPLANE_TIMEOUT", "-1", "BACKPLANE_TIMEOUT=-1 is out of range"},
      {"BACKPLANE_TIMEOUT", "0", "BACKPLANE_TIMEOUT=0 is out of range"},
      {"BACKPLANE_TIMEOUT", "soon", "BACKPLANE_TIMEOUT='soon'"},
      {"BACKPLANE_TIMEOUT", "inf", "BACKPLANE_TIMEOUT='inf'"},
      {"BACKPLANE_TIMEOUT", "nan", "BACKPLANE_TIMEOUT='nan'"},
      {"BACKPLANE_TIMEOUT", "1e12", "BACKPLANE_TIMEOUT=1e12 is out of range"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "two", "OMPI_COMM_WORLD_LOCAL_SIZE='two'"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    CAPTURE(c.value);
    EnvGuard env;
    if (std::string(c.name).rfind("OMPI", 0) == 0) {
      env.set("OMPI_COMM_WORLD_RANK", "0");
      env.set("OMPI_COMM_WORLD_SIZE", "4");
    } else {
      env.set("RANK", "1");
      env.set("WORLD_SIZE", "4");
    }
    env.set(c.name, c.value);
    bp::Error e = bptest::error_from([] { bp::Rendezvous::from_env(); });
    CHECK(e.code() == bp::Errc::invalid_argument);
    BP_CHECK_CONTAINS(e.message(), c.expected);
  }
}

TEST_CASE("rendezvous: from_env without a rank or with half a pair says what to set") {
  EnvGuard env;
  bp::Error e = bptest::error_from([] { bp::Rendezvous::from_env(); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "set RANK and WORLD_SIZE");
  BP_CHECK_CONTAINS(e.message(), "single_process");

  env.set("WORLD_SIZE", "2");
  e = bptest::error_from([] { bp::Rendezvous::from_env(); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "RANK is not set but WORLD_SIZE is");

  env.unset("WORLD_SIZE");
  env.set("SLURM_PROCID", "0");
  e = bptest::error_from([] { bp::Rendezvous::from_env(); });
  BP_CHECK_CONTAINS(e.message(), "SLURM_NTASKS is not set but SLURM_PROCID is");
}

TEST_CASE("rendezvous: the constructor validates its arguments") {
  auto bad = [](auto fn) { return bptest::error_from(fn).code(); };
  CHECK(bad([] { bp::Rendezvous(2, 2, "127.0.0.1", 29500); }) == bp::Errc::invalid_argument);
  CHECK(bad([] { bp::Rendezvous(-1, 2, "127.0.0.1", 29500); }) == bp::Errc::invalid_argument);
  CHECK(bad([] { bp::Rendezvous(0, 0, "127.0.0.1", 29500); }) == bp::Errc::invalid_argument);
  CHECK(bad([] { bp::Rendezvous(0, 2, "", 29500); }) == bp::Errc::invalid_argument);
  CHECK(bad([] { bp::Rendezvous(0, 2, "127.0.0.1", 0); }) == bp::Errc::invalid_argument);
  CHECK(bad([] { bp::Rendezvous(0, 2, "127.0.0.1", 29500, 0ms); }) == bp::Errc::invalid_argument);
  CHECK(bad([] { bp::Rendezvous(0, 2, "127.0.0.1", 29500, 1s, 2); }) == bp::Errc::invalid_argument);
  bp::Rendezvous r(1, 2, "127.0.0.1", 29500);
  CHECK(r.local_rank() == 1);
  CHECK(r.source() == "explicit");
}

TEST_CASE("rendezvous: single_process serves a store and hands out group prefixes") {
  bp::Rendezvous r = bp::Rendezvous::single_process(5s);
  CHECK(r.rank() == 0);
  CHECK(r.world_size() == 1);
  CHECK(r.master_addr() == "127.0.0.1");
  CHECK(r.master_port() != 0);
  CHECK(r.timeout() == 5s);
  auto store = r.store();
  CHECK(port_of(*store) == r.master_port());
  store->set("k", bytes("v"));

  bp::Rendezvous copy = r;
  CHECK(copy.store() == store);
  CHECK(text(copy.store()->get("k", 1s)) == "v");
  CHECK(r.next_group_prefix() == "pg/0/");
  CHECK(copy.next_group_prefix() == "pg/1/");
  CHECK(r.next_group_prefix() == "pg/2/");
  // A separate Rendezvous counts on its own.
  CHECK(bp::Rendezvous::single_process(5s).next_group_prefix() == "pg/0/");
}

TEST_CASE("rendezvous: store is made once when many threads ask at once") {
  bp::Rendezvous r(0, 1, "127.0.0.1", 0, 5s);
  std::vector<std::shared_ptr<bp::Store>> seen(6);
  std::vector<std::unique_ptr<Worker>> workers;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    workers.push_back(std::make_unique<Worker>([&, i] { seen[i] = bp::Rendezvous(r).store(); }));
  }
  for (auto& w : workers) CHECK(w->join() == "");
  for (const auto& s : seen) CHECK(s == seen[0]);
  REQUIRE(seen[0]);
}

TEST_CASE("rendezvous: two ranks meet through their stores in either order") {
  const uint16_t port = free_port();
  bp::Rendezvous r0(0, 2, "127.0.0.1", port, 10s);
  bp::Rendezvous r1(1, 2, "127.0.0.1", port, 10s);
  std::string from0;
  Worker rank1([&] {
    auto s = r1.store();  // may start before rank 0's server: it retries
    s->set("from/1", bytes("one"));
    from0 = text(s->get("from/0", 10s));
  });
  std::this_thread::sleep_for(100ms);
  auto s0 = r0.store();
  s0->set("from/0", bytes("zero"));
  CHECK(text(s0->get("from/1", 10s)) == "one");
  CHECK(rank1.join() == "");
  CHECK(from0 == "zero");
  // Both sides derive the same group prefixes.
  CHECK(r0.next_group_prefix() == r1.next_group_prefix());
}

TEST_CASE(
    "store: a rank whose group failed keeps its store serving the ranks still connected, until they leave") {
  // Two ranks in threads, a real cpu group between them. Rank 0 hosts the
  // store, leaves a note in it and ends its group: aborted (a failed
  // collective does the same) or cleanly. Then rank 1 reads the note.
  const bp::Registry registry =
      bp::Registry::from_json(R"({"schema_version": 1, "backends": [{"name": "cpu", "library": )" +
                                  bptest::json_path(bptest::plugin_dir() / "libbackplane_cpu.so") +
                                  R"(, "options": {"threads": 1}}]})",
                              ".", "store linger test");
  const bp::Device device = registry.backend("cpu").device();
  // Bounded, so that a rank whose set-up failed fails the test instead of hanging it.
  auto wait_for = [](const std::atomic<bool>& flag) {
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!flag.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  };
  struct Case {
    bool failed;
    const char* linger_ms;  // BACKPLANE_STORE_FAILED_LINGER_MS, or null for the default (2 s)
  };
  for (const Case c : {Case{true, nullptr}, Case{false, nullptr}, Case{true, "50"}}) {
    const bool failed = c.failed;
    const bool served = failed && c.linger_ms == nullptr;  // rank 1 asks after 300 ms
    CAPTURE(failed);
    CAPTURE(c.linger_ms);
    std::optional<bptest::ScopedEnv> linger;
    if (c.linger_ms != nullptr) linger.emplace("BACKPLANE_STORE_FAILED_LINGER_MS", c.linger_ms);
    const uint16_t port = free_port();
    std::atomic<bool> rank1_joined{false}, rank0_leaving{false};
    double rank0_close_s = 0;
    std::string note_seen;
    bp::Error note_error(bp::Errc::internal, "");
    Worker rank1([&] {
      bp::Rendezvous rv(1, 2, "127.0.0.1", port, 10s);
      bp::ProcessGroup pg = bp::ProcessGroup::create(device, rv);
      rank1_joined.store(true);
      wait_for(rank0_leaving);
      std::this_thread::sleep_for(300ms);  // rank 0's store is closing by now
      try {
        note_seen = text(rv.store()->get("note", 2s));
      } catch (const bp::Error& e) {
        note_error = e;
      }
    });  // rank 1 leaves: its connection to the store closes
    {
      std::optional<bp::Rendezvous> rv(std::in_place, 0, 2, "127.0.0.1", port, 10s);
      std::optional<bp::ProcessGroup> pg(bp::ProcessGroup::create(device, *rv));
      rv->store()->set("note", bytes("rank 0 failed: why"));
      wait_for(rank1_joined);  // its group is set up through the store
      if (failed) pg->abort();
      rank0_leaving.store(true);
      const auto start = std::chrono::steady_clock::now();
      pg.reset();
      rv.reset();  // the last owner of the store: the server closes (or lingers) here
      rank0_close_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    CHECK(rank1.join() == "");
    if (served) {
      CHECK(note_seen == "rank 0 failed: why");
      // It served rank 1 until rank 1 left (about 0.3 s), not its 2 s limit.
      CHECK(rank0_close_s > 0.2);
      CHECK(rank0_close_s < 5.0);
    } else {
      // Closed at once (no failure), or at the 50 ms limit, before rank 1 asked.
      CHECK(note_seen.empty());
      CHECK(note_error.code() == bp::Errc::io_error);
      BP_CHECK_CONTAINS(note_error.message(), "did rank 0 exit?");
      if (failed) {
        CHECK(rank0_close_s >= 0.05);
        CHECK(rank0_close_s < 5.0);
      }
    }
  }
  // The limit's variable is checked where the store starts.
  bptest::ScopedEnv bad("BACKPLANE_STORE_FAILED_LINGER_MS", "soon");
  bp::TcpStoreOptions o = options(0, 1, 0);
  o.is_server = true;
  const bp::Error e = bptest::error_from([&] { bp::make_tcp_store(o); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "BACKPLANE_STORE_FAILED_LINGER_MS='soon'");
}
