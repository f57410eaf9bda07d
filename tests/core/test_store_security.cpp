// The rendezvous store under attack: impostors without the job secret,
// floods of connections that never authenticate, half-sent and oversized
// frames, loopback spellings, the secret file's permissions, a hung store
// host, and a bounded fuzzer of frames against the decoder and a live
// server. Limits are lowered through their environment variables.
#include "test_support.hpp"

#include <backplane/rendezvous.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "distributed/drop_log.hpp"
#include "distributed/store_wire.hpp"
#include "store_raw_client.hpp"

namespace bp = backplane;
namespace w = backplane::store_wire;
using namespace std::chrono_literals;
using std::chrono::milliseconds;

namespace {

constexpr const char* kSecret = "security-test-secret";

std::vector<uint8_t> bytes(std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

uint16_t port_of(const bp::Store& store) {
  const std::string a = store.address();
  return static_cast<uint16_t>(std::stoi(a.substr(a.rfind(':') + 1)));
}

bp::TcpStoreOptions options(int32_t rank, int32_t world_size, uint16_t port, std::string secret = kSecret,
                            milliseconds timeout = 10s) {
  bp::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.rank = rank;
  o.world_size = world_size;
  o.timeout = timeout;
  o.job_token = std::move(secret);
  return o;
}

std::shared_ptr<bp::Store> host(int32_t world_size, std::string secret = kSecret) {
  bp::TcpStoreOptions o = options(0, world_size, 0, std::move(secret));
  o.is_server = true;
  return bp::make_tcp_store(o);
}

// Sets an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

using Raw = bptest::RawStoreClient;

// Connects rank `rank`, retrying while the server frees a slot the test closed.
std::shared_ptr<bp::Store> join(int32_t rank, int32_t world_size, uint16_t port) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    try {
      return bp::make_tcp_store(options(rank, world_size, port));
    } catch (const bp::Error& e) {
      if (e.code() != bp::Errc::invalid_argument) throw;
      std::this_thread::sleep_for(20ms);
    }
  }
  return nullptr;
}

long resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

}  // namespace

TEST_CASE("store security: a rank with another secret gets a clear error and the real rank still joins") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  auto server = host(2);
  const uint16_t port = port_of(*server);
  for (const std::string& wrong : {std::string("another-secret"), std::string()}) {
    bp::Error e = bptest::error_from([&] { bp::make_tcp_store(options(1, 2, port, wrong, 3s)); });
    CHECK(e.code() == bp::Errc::invalid_argument);
    BP_CHECK_CONTAINS(e.message(), "the store at 127.0.0.1:" + std::to_string(port) +
                                       " refused this process's job secret: ranks must share "
                                       "BACKPLANE_JOB_TOKEN");
  }
  // An impostor that answers the challenge with a guess is closed without a word.
  {
    Raw c(port);
    CHECK(c.authenticate(1, 2, "guess") == -1);
    CHECK(c.closed_by_peer());
  }
  CHECK(logs.at(bp::LogLevel::warning, "failed to prove the job secret").size() == 1);
  auto rank1 = join(1, 2, port);
  REQUIRE(rank1);
  rank1->set("k", bytes("v"));
  CHECK(text(server->get("k", 1s)) == "v");
}

TEST_CASE("store security: nothing about the job reaches a client before it proves the secret") {
  auto server = host(7);
  const uint16_t port = port_of(*server);
  {  // The challenge is nonce and proof only: the world size (7) is not in it.
    Raw c(port);
    const auto h = w::make_hello(w::random_nonce());
    c.send(h.data(), h.size());
    const std::vector<uint8_t> challenge = c.read(w::kChallengeBytes);
    REQUIRE(challenge.size() == w::kChallengeBytes);
    CHECK(w::get_u16(challenge.data() + 6) == 0);
    // A wrong proof: the connection closes with no verdict at all.
    std::vector<uint8_t> proof(w::kProofBytes, 0);
    c.send(proof.data(), proof.size());
    CHECK(c.read(w::kVerdictBytes).empty());
  }
  {  // Another protocol version is told so, with world size 0.
    Raw c(port);
    auto h = w::make_hello(w::random_nonce());
    w::put_u16(h.data() + 4, 1);
    c.send(h.data(), 8);
    const std::vector<uint8_t> v = c.read(w::kVerdictBytes);
    REQUIRE(v.size() == w::kVerdictBytes);
    CHECK(w::get_u16(v.data() + 6) == static_cast<uint16_t>(w::Verdict::version_mismatch));
    CHECK(w::get_u32(v.data() + 8) == 0);
  }
  {  // Only after the proof: the verdict carries the world size.
    Raw c(port);
    CHECK(c.authenticate(3, 7, kSecret) == 0);
  }
}

TEST_CASE("store security: beyond loopback the store refuses to start without a secret") {
  bp::TcpStoreOptions o = options(0, 1, 0, "");
  o.is_server = true;
  o.host = "0.0.0.0";
  bp::Error e = bptest::error_from([&] { bp::make_tcp_store(o); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "export BACKPLANE_JOB_TOKEN=$(openssl rand -hex 32)");
  BP_CHECK_CONTAINS(e.message(), "mpirun -x BACKPLANE_JOB_TOKEN");
  BP_CHECK_CONTAINS(e.message(), "0.0.0.0:");
}

TEST_CASE("store security: every loopback spelling binds loopback only") {
  bptest::LogCapture logs(bp::LogLevel::debug);
  for (const char* spelling : {"127.1", "LOCALHOST", "::ffff:127.0.0.1", "127.0.0.2"}) {
    CAPTURE(spelling);
    bp::TcpStoreOptions o = options(0, 1, 0, "");
    o.is_server = true;
    o.host = spelling;
    std::shared_ptr<bp::Store> s;
    // Without a secret only a loopback store may start: the refusal would say otherwise.
    CHECK_NOTHROW(s = bp::make_tcp_store(o));
    if (s) {
      s->set("k", bytes("v"));
      CHECK(text(s->get("k", 1s)) == "v");
    }
  }
  CHECK(logs.at(bp::LogLevel::debug, "(loopback only)").size() == 4);
  CHECK(logs.at(bp::LogLevel::debug, "listening (every interface)").empty());
}

TEST_CASE("store security: a flood of connections that never authenticate does not lock out a rank") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  ScopedEnv cap("BACKPLANE_STORE_MAX_UNAUTHENTICATED", "4");
  ScopedEnv deadline("BACKPLANE_STORE_HANDSHAKE_TIMEOUT_MS", "300");
  auto server = host(2);
  const uint16_t port = port_of(*server);
  std::vector<std::unique_ptr<Raw>> flood;
  for (int i = 0; i < 12; ++i) flood.push_back(std::make_unique<Raw>(port));
  auto rank1 = join(1, 2, port);
  REQUIRE(rank1);
  rank1->set("in", bytes("yes"));
  CHECK(text(server->get("in", 1s)) == "yes");
  for (auto& c : flood) CHECK(c->closed_by_peer());
  CHECK_FALSE(logs.at(bp::LogLevel::warning, "accepting pauses").empty());
  CHECK_FALSE(
      logs.at(bp::LogLevel::warning, "did not complete the authenticated handshake within 0.3 s").empty());
}

TEST_CASE(
    "store security: dropped unauthenticated connections are logged a few per interval, then summed up") {
  using bp::store_detail::DropLog;
  using namespace std::chrono;
  DropLog drops(10s, 5);
  const DropLog::Clock::time_point t0{hours(1)};
  int own = 0;
  for (int i = 0; i < 40; ++i)
    if (drops.drop(t0 + milliseconds(i), bp::LogLevel::warning, "peer " + std::to_string(i) + " failed"))
      ++own;
  CHECK(own == 5);
  CHECK(drops.pending());
  CHECK(drops.due() == t0 + 10s);
  std::optional<DropLog::Line> sum = drops.summary(t0 + 10s);
  REQUIRE(sum);
  CHECK(sum->level == bp::LogLevel::warning);
  CHECK(sum->text ==
        "35 more unauthenticated connections dropped in the last 10 s (logged 5 per 10 s at most; the last: "
        "peer 39 failed)");
  CHECK_FALSE(drops.pending());
  // The flood goes on: no more lines of their own, one summary per interval.
  for (int i = 0; i < 20; ++i)
    CHECK_FALSE(drops.drop(t0 + 10s + seconds(i) / 4, bp::LogLevel::debug, "scan " + std::to_string(i)));
  sum = drops.summary(t0 + 20s);
  REQUIRE(sum);
  CHECK(sum->level == bp::LogLevel::debug);
  BP_CHECK_CONTAINS(sum->text, "20 more unauthenticated connections dropped in the last 10 s");
  // A quiet interval: nothing to sum up, and the next drop is logged in full again.
  CHECK_FALSE(drops.summary(t0 + 30s));
  const auto line = drops.drop(t0 + 31s, bp::LogLevel::warning, "late");
  REQUIRE(line);
  CHECK(line->text == "late");
}

TEST_CASE("store security: a flood of impostors writes a handful of log lines, not one per connection") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  constexpr int kImpostors = 40;
  {
    auto server = host(2);
    const uint16_t port = port_of(*server);
    for (int i = 0; i < kImpostors; ++i) {
      Raw c(port);
      CHECK(c.authenticate(1, 2, "guess") == -1);
      CHECK(c.closed_by_peer());
    }
    auto rank1 = join(1, 2, port);  // the real rank is not held up
    REQUIRE(rank1);
    rank1->set("k", bytes("v"));
    CHECK(text(server->get("k", 1s)) == "v");
  }  // the store's shutdown sums up what it counted
  const std::vector<std::string> own = logs.at(bp::LogLevel::warning, "failed to prove the job secret");
  const std::vector<std::string> summaries =
      logs.at(bp::LogLevel::warning, "more unauthenticated connections");
  INFO(logs.all());
  CHECK(own.size() == 5 + summaries.size());  // the summaries name the last one's reason too
  REQUIRE(summaries.size() == 1);
  BP_CHECK_CONTAINS(summaries[0], "35 more unauthenticated connections dropped in the last ");
  BP_CHECK_CONTAINS(summaries[0], "failed to prove the job secret (BACKPLANE_JOB_TOKEN)");
}

TEST_CASE("store security: half-sent frames are dropped at the idle deadline") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  ScopedEnv idle("BACKPLANE_STORE_FRAME_IDLE_TIMEOUT_MS", "300");
  auto server = host(3);
  const uint16_t port = port_of(*server);
  {  // Half a header.
    Raw c(port);
    REQUIRE(c.authenticate(1, 3, kSecret) == 0);
    const w::Header h = w::make_header(10, static_cast<uint8_t>(w::Op::set), 1);
    c.send(h.data(), 5);
    CHECK(c.closed_by_peer());
  }
  {  // A header and part of its payload.
    Raw c(port);
    REQUIRE(c.authenticate(2, 3, kSecret) == 0);
    const w::Header h = w::make_header(100, static_cast<uint8_t>(w::Op::set), 1);
    c.send(h.data(), h.size());
    c.send("0123456789", 10);
    CHECK(c.closed_by_peer());
  }
  CHECK(logs.at(bp::LogLevel::warning, "and then nothing for 0.3 s").size() == 2);
  auto rank1 = join(1, 3, port);
  REQUIRE(rank1);
  CHECK(rank1->add("n", 2) == 2);
}

TEST_CASE(
    "store security: a huge announced frame allocates only what arrives, and a client's memory is capped") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  ScopedEnv client_cap("BACKPLANE_STORE_MAX_CLIENT_BYTES", std::to_string(256 << 10));
  auto server = host(3);
  const uint16_t port = port_of(*server);
  {
    ScopedEnv idle("BACKPLANE_STORE_FRAME_IDLE_TIMEOUT_MS", "60000");
    Raw c(port);
    REQUIRE(c.authenticate(1, 3, kSecret) == 0);
    // Over the per-client cap: closed before a byte of payload is read.
    const w::Header h = w::make_header(std::size_t{64} << 20, static_cast<uint8_t>(w::Op::set), 1);
    const long before = resident_bytes();
    c.send(h.data(), h.size());
    c.send("k", 1);
    CHECK(c.closed_by_peer());
    CHECK(resident_bytes() - before < (32L << 20));
  }
  BP_CHECK_CONTAINS(logs.at(bp::LogLevel::error, "BACKPLANE_STORE_MAX_CLIENT_BYTES").at(0),
                    "the limit per rank is 262144 bytes");
  auto rank2 = join(2, 3, port);
  REQUIRE(rank2);
  // Within the cap values are stored; past it the connection is closed.
  rank2->set("small", std::vector<uint8_t>(100 << 10, 1));
  CHECK(bptest::error_from([&] { rank2->set("big", std::vector<uint8_t>(200 << 10, 2)); }).code() ==
        bp::Errc::io_error);
  CHECK(server->get("small", 1s).size() == (100 << 10));
  CHECK_FALSE(server->check({"big"}));
}

namespace {

// A frame as the server sends it: header fields and payload.
struct RawReply {
  uint8_t kind = 0;
  uint64_t id = 0;
  std::string payload;
};

std::optional<RawReply> read_reply(Raw& c) {
  const std::vector<uint8_t> h = c.read(w::kHeaderBytes);
  if (h.size() != w::kHeaderBytes) return std::nullopt;
  RawReply r{h[4], w::get_u64(h.data() + 8), {}};
  r.payload = text(c.read(w::get_u32(h.data())));
  return r;
}

void send_request(Raw& c, w::Op op, uint64_t id, const std::vector<uint8_t>& payload) {
  const w::Header h = w::make_header(payload.size(), static_cast<uint8_t>(op), id);
  c.send(h.data(), h.size());
  c.send(payload);
}

}  // namespace

TEST_CASE("store security: parked waits and their key lists count against the rank's limit") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  ScopedEnv client_cap("BACKPLANE_STORE_MAX_CLIENT_BYTES", std::to_string(256 << 10));
  auto server = host(2);
  const uint16_t port = port_of(*server);
  Raw c(port);
  REQUIRE(c.authenticate(1, 2, kSecret) == 0);
  // 40 waits on 16 keys each: 15 present keys of 1 KiB, the same for all, and one missing key of
  // its own, so each holds about 16 KiB of key list while it is parked.
  constexpr int kWaits = 40;
  std::vector<std::string> present;
  for (int k = 0; k < 15; ++k) {
    present.push_back("present/" + std::to_string(k) + "/");
    present.back().resize(1024, 'k');
    server->set(present.back(), bytes("v"));
  }
  auto missing = [](int wait) { return "missing/" + std::to_string(wait); };
  auto keys_of = [&](int wait) {
    std::vector<std::string> keys = present;
    keys.push_back(missing(wait));
    return keys;
  };
  for (int i = 0; i < kWaits; ++i)
    send_request(c, w::Op::wait, 1 + i, w::encode_wait(keys_of(i), w::kNoTimeout));
  // Requests are served in order: once the check is answered, every refusal has been sent.
  send_request(c, w::Op::check, 1000, w::encode_check({"anything"}));
  int refused = 0;
  std::string refusal;
  for (;;) {
    const std::optional<RawReply> r = read_reply(c);
    REQUIRE_MESSAGE(r, "the store stopped answering");
    if (r->id == 1000) break;
    CHECK(r->kind == static_cast<uint8_t>(w::Reply::refused));
    ++refused;
    refusal = r->payload;
  }
  const int parked = kWaits - refused;
  CAPTURE(parked);
  CHECK(parked >= 10);   // 256 KiB holds about 15 of them
  CHECK(refused >= 20);  // the rest are refused, not parked
  BP_CHECK_CONTAINS(refusal, "the store refused: this rank would hold ");
  BP_CHECK_CONTAINS(refusal, "a parked wait on 16 keys");
  BP_CHECK_CONTAINS(refusal, "the limit per rank is 262144 bytes");
  BP_CHECK_CONTAINS(refusal, "BACKPLANE_STORE_MAX_CLIENT_BYTES");
  CHECK(logs.at(bp::LogLevel::warning, "refused a request of rank 1").size() ==
        static_cast<std::size_t>(refused));
  // The parked ones still complete, and give back what they held: a new wait parks again.
  for (int i = 0; i < parked; ++i) server->set(missing(i), bytes("v"));
  for (int i = 0; i < parked; ++i) {
    const std::optional<RawReply> r = read_reply(c);
    REQUIRE(r);
    CHECK(r->kind == static_cast<uint8_t>(w::Reply::ok));
  }
  send_request(c, w::Op::wait, 2000, w::encode_wait(keys_of(kWaits), w::kNoTimeout));
  send_request(c, w::Op::check, 2001, w::encode_check({"anything"}));
  const std::optional<RawReply> after = read_reply(c);
  REQUIRE(after);
  CHECK(after->id == 2001);  // the wait parked instead of being refused
}

TEST_CASE("store security: a rank that reconnects keeps its account while another rank has its own") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  ScopedEnv client_cap("BACKPLANE_STORE_MAX_CLIENT_BYTES", std::to_string(256 << 10));
  auto server = host(3);
  const uint16_t port = port_of(*server);
  {
    auto rank1 = join(1, 3, port);
    REQUIRE(rank1);
    rank1->set("first", std::vector<uint8_t>(200 << 10, 1));
  }  // disconnected; its value stays in the store
  {
    auto rank1 = join(1, 3, port);
    REQUIRE(rank1);
    // 200 + 100 KiB are over 256 KiB whichever connection sent them.
    CHECK(bptest::error_from([&] { rank1->set("second", std::vector<uint8_t>(100 << 10, 2)); }).code() ==
          bp::Errc::io_error);
  }
  CHECK_FALSE(server->check({"second"}));
  BP_CHECK_CONTAINS(logs.at(bp::LogLevel::error, "BACKPLANE_STORE_MAX_CLIENT_BYTES").at(0), "rank 1 (");
  {
    auto rank2 = join(2, 3, port);  // another rank: a budget of its own
    REQUIRE(rank2);
    rank2->set("other", std::vector<uint8_t>(100 << 10, 3));
  }
  // Once its first value is removed, rank 1 has room again.
  CHECK(server->remove("first"));
  auto rank1 = join(1, 3, port);
  REQUIRE(rank1);
  rank1->set("second", std::vector<uint8_t>(100 << 10, 2));
  CHECK(server->get("second", 1s).size() == (100 << 10));
}

TEST_CASE("store security: the store's total memory is capped, naming the limit and the remedy") {
  bptest::LogCapture logs(bp::LogLevel::warning);
  ScopedEnv total_cap("BACKPLANE_STORE_MAX_TOTAL_BYTES", std::to_string(256 << 10));
  auto server = host(3);
  const uint16_t port = port_of(*server);
  auto rank1 = join(1, 3, port);
  REQUIRE(rank1);
  rank1->set("a", std::vector<uint8_t>(200 << 10, 1));
  auto rank2 = join(2, 3, port);
  REQUIRE(rank2);
  // Each rank is far below its own limit (2 GiB); together they are over the store's.
  std::vector<std::string> keys;
  for (int k = 0; k < 64; ++k) keys.push_back(std::string(1000, 'a' + k % 26) + std::to_string(k));
  const bp::Error refused = bptest::error_from([&] { rank2->wait(keys, 2s); });
  CHECK(refused.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(refused.message(), "the limit of the store is 262144 bytes");
  BP_CHECK_CONTAINS(refused.message(),
                    "remove keys no longer needed, or raise BACKPLANE_STORE_MAX_TOTAL_BYTES");
  CHECK(bptest::error_from([&] { rank2->set("b", std::vector<uint8_t>(100 << 10, 2)); }).code() ==
        bp::Errc::io_error);
  BP_CHECK_CONTAINS(logs.at(bp::LogLevel::error, "BACKPLANE_STORE_MAX_TOTAL_BYTES").at(0), "rank 2 (");
  CHECK_FALSE(server->check({"b"}));
  rank1->set("small", bytes("fits"));
  CHECK(text(server->get("small", 1s)) == "fits");
}

TEST_CASE("store security: a huge announced frame with 1 byte sent does not pin its announced size") {
  ScopedEnv idle("BACKPLANE_STORE_FRAME_IDLE_TIMEOUT_MS", "60000");
  auto server = host(2);
  const uint16_t port = port_of(*server);
  Raw c(port);
  REQUIRE(c.authenticate(1, 2, kSecret) == 0);
  const long before = resident_bytes();
  const w::Header h = w::make_header(std::size_t{64} << 20, static_cast<uint8_t>(w::Op::set), 1);
  c.send(h.data(), h.size());
  c.send("\0", 1);
  // The server reads the byte and waits for more; it keeps serving others meanwhile.
  server->set("alive", bytes("1"));
  CHECK(text(server->get("alive", 1s)) == "1");
  CHECK(resident_bytes() - before < (32L << 20));
}

TEST_CASE("store security: the secret file must be private") {
  const bptest::TempDir tmp;
  const std::string token = "file-secret";
  const std::string path = tmp.write("token", token + "\n").string();
  ScopedEnv file("BACKPLANE_JOB_TOKEN_FILE", path);
  ::unsetenv("BACKPLANE_JOB_TOKEN");
  bp::TcpStoreOptions o = options(0, 2, 0);
  o.is_server = true;
  o.job_token.reset();  // from the environment
  REQUIRE(::chmod(path.c_str(), 0644) == 0);
  bp::Error e = bptest::error_from([&] { bp::make_tcp_store(o); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "chmod 600");
  BP_CHECK_CONTAINS(e.message(), "BACKPLANE_JOB_TOKEN_FILE");
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  auto server = bp::make_tcp_store(o);
  // The file's secret, its newline dropped, is the one the ranks share.
  auto rank1 = bp::make_tcp_store(options(1, 2, port_of(*server), token));
  rank1->set("k", bytes("v"));
  CHECK(text(server->get("k", 1s)) == "v");
}

TEST_CASE("store security: failure paths on a hung store host are bounded and say the time waited") {
  // A store host that authenticates and then never answers (as if stopped).
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const uint16_t port = ntohs(addr.sin_port);
  std::atomic<int> conn{-1};
  std::thread hung([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    conn = fd;
    std::vector<uint8_t> hello(w::kHelloBytes);
    if (::recv(fd, hello.data(), hello.size(), MSG_WAITALL) != static_cast<ssize_t>(hello.size())) return;
    w::Nonce cn{}, sn = w::random_nonce();
    std::memcpy(cn.data(), hello.data() + w::kHelloPrefixBytes, w::kNonceBytes);
    const auto challenge = w::make_challenge(sn, w::server_proof(kSecret, cn, sn));
    ::send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL);
    std::vector<uint8_t> proof(w::kProofBytes);
    if (::recv(fd, proof.data(), proof.size(), MSG_WAITALL) != static_cast<ssize_t>(proof.size())) return;
    const auto verdict = w::make_verdict(w::Verdict::accepted, 2);
    ::send(fd, verdict.data(), verdict.size(), MSG_NOSIGNAL);
  });
  auto client = bp::make_tcp_store(options(1, 2, port, kSecret, 300s));
  hung.join();
  bp::Error e = bptest::error_from([&] { client->set_with_timeout("failed/1", bytes("boom"), 300ms); });
  CHECK(e.code() == bp::Errc::timeout);
  BP_CHECK_CONTAINS(e.message(), "no reply from the rendezvous store");
  BP_CHECK_CONTAINS(e.message(), "after 0.");  // measured, well under the store's 300 s
  // A zero-timeout get (the plugin's probe before publishing) gives up within the reply grace.
  e = bptest::error_from([&] { client->get("conn/1", 0ms); });
  CHECK(e.code() == bp::Errc::timeout);
  BP_CHECK_CONTAINS(e.message(), "no reply from the rendezvous store");
  client.reset();
  if (conn >= 0) ::close(conn);
  ::close(listener);
}

// BP_FUZZ_SEED=<n> and BP_FUZZ_ITERATIONS=<n> (default 20000) make the
// decoder half below a long run.
TEST_CASE("store security: fuzzed frames neither crash the decoder nor stop the server") {
  const char* seed_env = std::getenv("BP_FUZZ_SEED");
  const char* iterations_env = std::getenv("BP_FUZZ_ITERATIONS");
  const uint64_t seed =
      seed_env != nullptr && *seed_env != '\0' ? std::strtoull(seed_env, nullptr, 0) : 0x5eed5u;
  const long long iterations = iterations_env != nullptr && *iterations_env != '\0'
                                   ? std::strtoll(iterations_env, nullptr, 10)
                                   : 20000;
  INFO("seed ", seed, " (rerun with BP_FUZZ_SEED=", seed, ")");
  std::mt19937_64 rng(seed);
  const w::Limits limits;
  auto random_bytes = [&](std::size_t n) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  };
  // Valid payloads of each kind, mutated.
  const std::vector<std::pair<w::Op, std::vector<uint8_t>>> seeds = {
      {w::Op::set, w::encode_set("key", "value", 5)},
      {w::Op::get, w::encode_get("key", 1000)},
      {w::Op::wait, w::encode_wait({"a", "bb", "ccc"}, 1000)},
      {w::Op::add, w::encode_add("n", -3)},
      {w::Op::check, w::encode_check({"a", "b"})},
      {w::Op::remove, w::encode_remove("key")},
  };
  auto mutate = [&](std::vector<uint8_t> v) {
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < edits; ++i) {
      switch (rng() % 4) {
        case 0:
          if (!v.empty()) v[rng() % v.size()] = static_cast<uint8_t>(rng());
          break;
        case 1:
          if (!v.empty()) v.resize(rng() % v.size());
          break;
        case 2:
          for (auto b : random_bytes(rng() % 16)) v.push_back(b);
          break;
        default:
          if (v.size() >= 4) w::put_u32(v.data() + (rng() % (v.size() - 3)), static_cast<uint32_t>(rng()));
      }
    }
    return v;
  };
  long long decoded = 0;
  for (long long i = 0; i < iterations; ++i) {
    const auto& [op, payload] = seeds[rng() % seeds.size()];
    const std::vector<uint8_t> m = i % 5 == 0 ? random_bytes(rng() % 64) : mutate(payload);
    const w::DecodedRequest d = w::decode_request(op, m);
    CHECK((d.request.has_value() != !d.error.empty()));
    if (d.request) {
      ++decoded;
      for (const auto& k : d.request->keys) CHECK((!k.empty() && k.size() <= w::kMaxKeyBytes));
      if (op == w::Op::set) CHECK(d.request->value_offset <= m.size());
    }
    const std::vector<uint8_t> header = random_bytes(w::kHeaderBytes);
    const w::DecodedHeader h = w::decode_request_header(header.data(), limits);
    if (h.header) CHECK(h.header->payload_bytes <= limits.max_payload(*w::to_op(h.header->kind)));
  }
  CHECK(decoded > 0);
  MESSAGE("store frame fuzz: " << iterations << " frames and headers, " << decoded << " decoded, seed "
                               << seed);

  // Against a live server: authenticated connections sending mutated frames.
  bptest::LogCapture quiet(bp::LogLevel::error);
  ScopedEnv idle("BACKPLANE_STORE_FRAME_IDLE_TIMEOUT_MS", "200");
  auto server = host(2);
  const uint16_t port = port_of(*server);
  for (int round = 0; round < 60; ++round) {
    Raw c(port);
    if (c.authenticate(1, 2, kSecret) != 0) {
      std::this_thread::sleep_for(20ms);  // the previous round's close is still in flight
      continue;
    }
    for (int f = 0; f < 50; ++f) {
      const auto& [op, payload] = seeds[rng() % seeds.size()];
      std::vector<uint8_t> body = rng() % 3 == 0 ? payload : mutate(payload);
      w::Header h = w::make_header(body.size(), static_cast<uint8_t>(op), rng());
      if (rng() % 8 == 0) h[rng() % h.size()] = static_cast<uint8_t>(rng());
      std::vector<uint8_t> frame(h.begin(), h.end());
      frame.insert(frame.end(), body.begin(), body.end());
      if (!c.send(frame.data(), frame.size())) break;
    }
  }
  auto rank1 = join(1, 2, port);
  REQUIRE(rank1);
  rank1->set("after-fuzz", bytes("ok"));
  CHECK(text(server->get("after-fuzz", 1s)) == "ok");
}
