// The remote plugin against an in-test fake server (fake_server.hpp): the
// handshake and the device list as the host sees them, tokens both ways,
// TLS, round trips, pipelined errors, a server that closes or stops
// answering, coalescing, heartbeats, the key-value bridge and comm_abort.
#include <backplane/backplane.hpp>

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <numeric>
#include <thread>

#include "client_support.hpp"
#include "fake_server.hpp"
#include "plugins/remote/connection.hpp"

namespace bp = backplane;
namespace bprc = backplane::remote::client;
namespace wire = backplane::remote::wire;
using namespace backplane::remote::test;

namespace {

std::string options_for(const std::vector<std::string>& endpoints, const std::string& extra = "") {
  std::string list;
  for (const auto& e : endpoints) list += (list.empty() ? "\"" : ", \"") + e + "\"";
  return R"({"endpoints": [)" + list + R"(], "token_env": "BP_TEST_REMOTE_NO_SUCH_TOKEN")" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

bp::Registry registry_for(const std::string& options) {
  return bp::Registry::from_json(R"({"schema_version": 1, "backends": [{"name": "remote", "library": )"
                                 R"("backplane_remote", "required": false, "options": )" +
                                     options + "}]}",
                                 BP_TEST_PLUGIN_DIR, "test_remote_client", bp::RequiredPolicy::report);
}

// A port on loopback where nothing listens (bound, then closed).
uint16_t closed_port() {
  wire::asio::io_context io;
  wire::tcp::acceptor a(io, wire::tcp::endpoint(wire::asio::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();
}

std::string write_token(const TempDir& dir, const std::string& name, const std::string& token) {
  const std::string path = dir.path + "/" + name;
  std::ofstream(path) << token << "\n";
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  return path;
}

FakeDevice collective_device() {
  FakeDevice d;
  d.name = "fake collective";
  d.capabilities = BP_CAP_COLLECTIVE | BP_CAP_F32;
  d.ops = {BP_OP_ADD};
  return d;
}

// Polls `done` for up to 30 s (a safety bound on a loaded machine, not a timing check).
template <class Fn>
bool eventually(Fn&& done) {
  for (int i = 0; i < 3000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST_CASE("fake server: the host lists each served device with the server's flags plus remote and async") {
  FakeOptions o;
  FakeDevice first;
  first.name = "accel";
  first.capabilities = BP_CAP_F32 | BP_CAP_HOST_VISIBLE | BP_CAP_MATMUL;
  first.attributes = {{"threads", "4"}};
  first.ops = {BP_OP_ADD, BP_OP_MATMUL};
  o.devices = {first, collective_device()};
  FakeServer server(o);
  FakeServer second(FakeOptions{});

  bp::Registry r = registry_for(options_for({server.endpoint(), second.endpoint()}));
  bp::Backend b = r.backend("remote");
  REQUIRE_MESSAGE(b.status() == bp::Backend::Status::loaded, b.error());
  REQUIRE(b.device_count() == 3);  // two of the first endpoint, then one of the second

  const bp::Device d0 = b.device(0);
  CHECK(d0.name() == "accel @ " + server.endpoint());
  const bp::Capabilities c0 = d0.capabilities();
  CHECK(c0.has(bp::Capability::remote));
  CHECK(c0.has(bp::Capability::async));
  CHECK(c0.has(bp::Capability::matmul));
  CHECK_FALSE(c0.has(bp::Capability::host_visible));  // never host memory here
  CHECK_FALSE(c0.has(bp::Capability::collective));    // only when the server's device has it
  CHECK(d0.attributes().at("server.threads") == "4");
  CHECK(d0.attributes().at("endpoint") == server.endpoint());
  CHECK(d0.attributes().at("server_device") == "0");
  CHECK(d0.attributes().at("server_version") == "9.9.9-fake");
  CHECK(d0.attributes().at("server_backend") == "fake");
  CHECK(d0.attributes().at("tls") == "no");
  CHECK(d0.attributes().at("protocol") == std::to_string(wire::kProtocolVersion));
  CHECK(d0.supports(bp::Op::add, bp::DType::f32));
  CHECK(d0.supports(bp::Op::matmul, bp::DType::f32));
  CHECK_FALSE(d0.supports(bp::Op::sub, bp::DType::f32));

  const bp::Device d1 = b.device(1);
  CHECK(d1.capabilities().has(bp::Capability::collective));
  CHECK(d1.attributes().at("server_device") == "1");
  CHECK(b.device(2).attributes().at("endpoint") == second.endpoint());
}

TEST_CASE(
    "fake server: an endpoint that cannot be reached leaves the backend unavailable, saying what to do") {
  FakeServer up(FakeOptions{});
  const std::string down = "127.0.0.1:" + std::to_string(closed_port());
  bp::Registry r = registry_for(options_for({up.endpoint(), down}, R"("connect_timeout_ms": 5000)"));
  bp::Backend b = r.backend("remote");
  CHECK(b.status() == bp::Backend::Status::unavailable);
  CHECK(b.device_count() == 0);
  CHECK(contains(b.error(), "cannot connect to " + down));
  CHECK(contains(b.error(), "start `backplane serve --listen " + down + "` there, or remove it from"));
  CHECK_FALSE(contains(b.error(), up.endpoint()));  // the reachable one is not blamed
}

TEST_CASE("fake server: tokens are proven both ways and never sent, a mismatch on either side is refused") {
  TempDir dir;
  const std::string right = write_token(dir, "right", "correct horse");
  const std::string wrong = write_token(dir, "wrong", "battery staple");
  FakeOptions with_token;
  with_token.token = "correct horse";
  FakeServer secured(with_token);
  FakeServer open_server(FakeOptions{});

  {
    RemoteInstance ok(R"({"endpoints": [")" + secured.endpoint() + R"("], "token_file": ")" + right + "\"}");
    REQUIRE(ok.create.code == BP_STATUS_OK);
    int32_t n = 0;
    const Outcome o = ok.device_count(n);
    CHECK_MESSAGE(o.code == BP_STATUS_OK, o.message);
    CHECK(n == 1);
  }
  {
    // The wrong token: the server's proof does not match, so the client stops.
    RemoteInstance bad(R"({"endpoints": [")" + secured.endpoint() + R"("], "token_file": ")" + wrong + "\"}");
    int32_t n = 0;
    const Outcome o = bad.device_count(n);
    CHECK(o.code == BP_STATUS_UNAVAILABLE);
    CHECK(contains(o.message, "the server at " + secured.endpoint() + " does not accept this token"));
  }
  {
    // No token for a server that wants one.
    RemoteInstance none(options_for({secured.endpoint()}));
    int32_t n = 0;
    const Outcome o = none.device_count(n);
    CHECK(o.code == BP_STATUS_UNAVAILABLE);
    CHECK(contains(o.message, "requires a token and this client has none"));
    CHECK(contains(o.message, "BP_TEST_REMOTE_NO_SUCH_TOKEN"));
  }
  {
    // A token for a server that authenticates nobody: it could be an impostor.
    ::setenv("BP_TEST_REMOTE_TOKEN_ENV", "correct horse", 1);
    RemoteInstance impostor(R"({"endpoints": [")" + open_server.endpoint() +
                            R"("], "token_env": "BP_TEST_REMOTE_TOKEN_ENV"})");
    int32_t n = 0;
    const Outcome o = impostor.device_count(n);
    ::unsetenv("BP_TEST_REMOTE_TOKEN_ENV");
    CHECK(o.code == BP_STATUS_UNAVAILABLE);
    CHECK(contains(o.message, "does not authenticate"));
    CHECK(contains(o.message, "impostor"));
  }
  CHECK(secured.sessions() == 1);  // only the client with the right token got a session
}

TEST_CASE("fake server: alloc, write, add and read round trip, small pipelined frames are coalesced") {
  FakeOptions fo;
  fo.devices[0].ops = {BP_OP_ADD};
  FakeServer server(fo);
  RemoteInstance p(options_for({server.endpoint()}));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);
  constexpr int64_t kN = 16;
  std::vector<float> a(kN), b(kN), out(kN, -1.0f);
  std::iota(a.begin(), a.end(), 1.0f);
  std::iota(b.begin(), b.end(), 100.0f);
  bp_buffer* ba = p.alloc(0, kN * 4);
  bp_buffer* bb = p.alloc(0, kN * 4);
  bp_buffer* bo = p.alloc(0, kN * 4);
  CHECK(p.write(ba, 0, a.data(), kN * 4).code == BP_STATUS_OK);
  CHECK(p.write(bb, 0, b.data(), kN * 4).code == BP_STATUS_OK);
  constexpr int kOps = 500;
  for (int i = 0; i < kOps; ++i) REQUIRE(p.add(0, ba, bb, bo, kN).code == BP_STATUS_OK);
  const Outcome r = p.read(bo, 0, out.data(), kN * 4);
  REQUIRE_MESSAGE(r.code == BP_STATUS_OK, r.message);
  for (int64_t i = 0; i < kN; ++i)
    CHECK(out[static_cast<std::size_t>(i)] ==
          a[static_cast<std::size_t>(i)] + b[static_cast<std::size_t>(i)]);
  // Over 500 frames came in far fewer reads: they were sent in gathered writes.
  CHECK(server.frames() >= kOps + 6);
  CHECK(server.reads() < server.frames());
  for (bp_buffer* x : {ba, bb, bo}) CHECK(p.free(x).code == BP_STATUS_OK);
  CHECK(p.synchronize(0).code == BP_STATUS_OK);
}

TEST_CASE("fake server: the connection coalesces queued frames into fewer writes than frames") {
  FakeServer server(FakeOptions{});
  bprc::ConnectionSettings s;
  s.endpoint = server.endpoint();
  s.client_version = "test";
  bprc::Connection c(s);
  c.open();
  const std::vector<uint8_t> bytes(64, 7);
  for (uint64_t i = 1; i <= 1000; ++i) {
    c.alloc(i, 0, 64);
    c.write(i, 0, bytes.data(), bytes.size());
  }
  c.synchronize(0);
  const bprc::ConnectionStats stats = c.stats();
  CHECK(stats.frames_sent == 2001);
  CHECK(stats.writes < stats.frames_sent);
  CHECK(server.reads() < server.frames());
  std::vector<uint8_t> back(64);
  c.read(1000, 0, back.data(), back.size());
  CHECK(back == bytes);
}

TEST_CASE("fake server: large transfers are split at the server's frame limit and arrive intact") {
  FakeOptions fo;
  fo.max_frame_bytes = 256 * 1024;  // the client keeps each frame's payload under it
  FakeServer server(fo);
  RemoteInstance p(options_for({server.endpoint()}));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);
  const uint64_t size = 3 * 1024 * 1024 + 123;
  std::vector<uint8_t> data(size), back(size, 0);
  for (uint64_t i = 0; i < size; ++i) data[i] = static_cast<uint8_t>(i * 31 + 7);
  bp_buffer* buf = p.alloc(0, size);
  const Outcome w = p.write(buf, 0, data.data(), size);
  REQUIRE_MESSAGE(w.code == BP_STATUS_OK, w.message);
  const Outcome r = p.read(buf, 0, back.data(), size);
  REQUIRE_MESSAGE(r.code == BP_STATUS_OK, r.message);
  CHECK(back == data);
  // A part of it, at an offset.
  std::vector<uint8_t> part(1000);
  REQUIRE(p.read(buf, 777'777, part.data(), part.size()).code == BP_STATUS_OK);
  CHECK(std::equal(part.begin(), part.end(), data.begin() + 777'777));
  CHECK(p.free(buf).code == BP_STATUS_OK);
}

TEST_CASE("fake server: an error in pipelined work surfaces at the next synchronising call, naming the op") {
  FakeServer server(FakeOptions{});  // the fake device only adds
  RemoteInstance p(options_for({server.endpoint()}));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);
  bp_buffer* a = p.alloc(0, 16);
  bp_buffer* o = p.alloc(0, 16);
  CHECK(p.add(0, a, a, o, 4, BP_OP_MUL).code == BP_STATUS_OK);  // queued: no error yet
  const Outcome s = p.synchronize(0);
  CHECK(s.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(contains(s.message, "server " + server.endpoint() + ": execute mul (request"));
  CHECK(p.synchronize(0).code == BP_STATUS_OK);  // reported once, then cleared
  // Operands on two devices are refused at once (one server device runs an op).
  FakeOptions two;
  two.devices = {FakeDevice{}, FakeDevice{}};
  FakeServer server2(two);
  RemoteInstance q(options_for({server2.endpoint()}));
  REQUIRE(q.device_count(n).code == BP_STATUS_OK);
  bp_buffer* x = q.alloc(0, 16);
  bp_buffer* y = q.alloc(1, 16);
  const Outcome mixed = q.add(0, x, y, x, 4);
  CHECK(mixed.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(contains(mixed.message, "inputs[1] lives on remote:1"));
  for (bp_buffer* b : {a, o}) CHECK(p.free(b).code == BP_STATUS_OK);
  for (bp_buffer* b : {x, y}) CHECK(q.free(b).code == BP_STATUS_OK);
}

TEST_CASE(
    "fake server: a server that closes mid-request fails that call and every later one as unavailable") {
  FakeOptions fo;
  fo.close_on = wire::Body::Read;
  FakeServer server(fo);
  RemoteInstance p(options_for({server.endpoint()}, R"("request_timeout_ms": 60000)"));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);
  bp_buffer* b = p.alloc(0, 64);
  std::vector<uint8_t> dst(64);
  const Outcome r = p.read(b, 0, dst.data(), dst.size());
  // The close fails the pending read ("connection lost"), long before request_timeout_ms would.
  CHECK(r.code == BP_STATUS_UNAVAILABLE);
  CHECK(contains(r.message, "server " + server.endpoint() + " is unreachable: connection lost"));
  CHECK(contains(r.message, "its tensors are gone"));
  // Every later call fails at once, naming the endpoint; freeing succeeds quietly.
  CHECK(p.synchronize(0).code == BP_STATUS_UNAVAILABLE);
  CHECK(p.write(b, 0, dst.data(), 8).code == BP_STATUS_UNAVAILABLE);
  bp_buffer_alloc_args a{BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE, p.plugin, 0, 0, 8, nullptr};
  const Outcome alloc = p.take(p.api->buffer_alloc(&a));
  CHECK(alloc.code == BP_STATUS_UNAVAILABLE);
  CHECK(contains(alloc.message, server.endpoint()));
  CHECK(p.free(b).code == BP_STATUS_OK);
}

TEST_CASE(
    "fake server: a server that stops answering fails the synchronising call after request_timeout_ms") {
  FakeOptions fo;
  fo.stall_on = wire::Body::Synchronize;
  FakeServer server(fo);
  RemoteInstance p(options_for({server.endpoint()}, R"("request_timeout_ms": 300)"));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);
  const Outcome s = p.synchronize(0);
  CHECK(s.code == BP_STATUS_UNAVAILABLE);
  CHECK(contains(s.message, "no reply to synchronize (request"));
  CHECK(contains(s.message, "within 300 ms (request_timeout_ms)"));
  CHECK(p.synchronize(0).code == BP_STATUS_UNAVAILABLE);
}

TEST_CASE(
    "fake server: an idle connection sends heartbeats, and a server that ignores them is declared dead") {
  FakeOptions fo;
  fo.stall_on = wire::Body::Ping;  // answers nothing once the first Ping arrives
  FakeServer server(fo);
  bprc::ConnectionSettings s;
  s.endpoint = server.endpoint();
  s.heartbeat = std::chrono::milliseconds(20);
  s.request_timeout = std::chrono::milliseconds(200);
  bprc::Connection c(s);
  c.open();
  REQUIRE(eventually([&] { return c.dead_reason().has_value(); }));
  CHECK(contains(*c.dead_reason(), "no reply to a heartbeat"));
  const auto bodies = server.bodies();
  CHECK(std::find(bodies.begin(), bodies.end(), "Ping") != bodies.end());
  CHECK_THROWS_WITH_AS(c.synchronize(0), doctest::Contains("is unreachable"), backplane::plugin::Failure);
}

TEST_CASE("fake server: device_memory asks the server") {
  FakeServer server(FakeOptions{});
  RemoteInstance p(options_for({server.endpoint()}));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);
  bp_device_memory_args m{BP_DEVICE_MEMORY_ARGS_STRUCT_SIZE, p.plugin, 0, 0, 0, 0};
  REQUIRE(p.take(p.api->device_memory(&m)).code == BP_STATUS_OK);
  CHECK(m.free_bytes == 1000);
  CHECK(m.total_bytes == 4000);
}

TEST_CASE("fake server: the server's key-value requests during comm_create reach the job's store") {
  FakeOptions fo;
  fo.devices = {collective_device()};
  FakeServer server(fo);
  RemoteInstance p(options_for({server.endpoint()}));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);
  MemoryStore store;
  bp_comm_create_args c{
      BP_COMM_CREATE_ARGS_STRUCT_SIZE, p.plugin, 0, 0, 1, 0, 10000, &store.kv, "job/7/", nullptr};
  const Outcome created = p.take(p.api->comm_create(&c));
  REQUIRE_MESSAGE(created.code == BP_STATUS_OK, created.message);
  const auto log = store.log();
  CHECK(std::find(log.begin(), log.end(), "set job/7/probe") != log.end());
  CHECK(std::find(log.begin(), log.end(), "get job/7/probe") != log.end());
  const auto replies = server.kv_replies();
  REQUIRE(replies.size() == 2);
  CHECK(replies[0].first == BP_STATUS_OK);
  CHECK(replies[1] == std::make_pair(int32_t{BP_STATUS_OK}, std::string("rendezvous")));

  bp_collective_args barrier{BP_COLLECTIVE_ARGS_STRUCT_SIZE, p.plugin, c.comm, nullptr, nullptr, 0, 0};
  CHECK(p.take(p.api->barrier(&barrier)).code == BP_STATUS_OK);
  bp_comm_args d{BP_COMM_ARGS_STRUCT_SIZE, p.plugin, c.comm};
  CHECK(p.take(p.api->comm_destroy(&d)).code == BP_STATUS_OK);
}

TEST_CASE("fake server: comm_abort fails a blocked collective at once with collective") {
  FakeOptions fo;
  fo.devices = {collective_device()};
  fo.stall_on = wire::Body::Collective;  // the collective never completes
  FakeServer server(fo);
  RemoteInstance p(options_for({server.endpoint()}, R"("request_timeout_ms": 1000)"));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);
  MemoryStore store;
  bp_comm_create_args c{
      BP_COMM_CREATE_ARGS_STRUCT_SIZE, p.plugin, 0, 0, 1, 0, 600000, &store.kv, "", nullptr};
  REQUIRE(p.take(p.api->comm_create(&c)).code == BP_STATUS_OK);
  auto blocked = std::async(std::launch::async, [&] {
    bp_collective_args b{BP_COLLECTIVE_ARGS_STRUCT_SIZE, p.plugin, c.comm, nullptr, nullptr, 0, 0};
    return p.take(p.api->barrier(&b));
  });
  REQUIRE(eventually([&] {
    const auto bodies = server.bodies();
    return std::find(bodies.begin(), bodies.end(), "Collective") != bodies.end();
  }));
  bp_comm_args abort{BP_COMM_ARGS_STRUCT_SIZE, p.plugin, c.comm};
  CHECK(p.take(p.api->comm_abort(&abort)).code == BP_STATUS_OK);
  REQUIRE(blocked.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  const Outcome o = blocked.get();
  CHECK(o.code == BP_STATUS_COLLECTIVE);
  CHECK(contains(o.message, "aborted"));
  REQUIRE(eventually([&] {
    const auto bodies = server.bodies();
    return std::find(bodies.begin(), bodies.end(), "CommAbort") != bodies.end();
  }));
  bp_collective_args again{BP_COLLECTIVE_ARGS_STRUCT_SIZE, p.plugin, c.comm, nullptr, nullptr, 0, 0};
  CHECK(p.take(p.api->barrier(&again)).code == BP_STATUS_COLLECTIVE);
  // The host still destroys it; the stalled server never answers, so the
  // connection is declared dead after request_timeout_ms and the destroy is quiet.
  bp_comm_args d{BP_COMM_ARGS_STRUCT_SIZE, p.plugin, c.comm};
  CHECK(p.take(p.api->comm_destroy(&d)).code == BP_STATUS_OK);
}

TEST_CASE("fake server: TLS with a CA the client trusts, TLS on one side only is refused clearly") {
  TempDir dir;
  make_self_signed(dir.path);
  auto tls = wire::server_tls_context(dir.path + "/cert.pem", dir.path + "/key.pem");
  FakeOptions fo;
  fo.tls = tls.get();
  fo.devices[0].ops = {BP_OP_ADD};
  FakeServer secure(fo);
  FakeServer plain(FakeOptions{});
  const std::string ca = R"("tls_ca": ")" + dir.path + "/cert.pem\"";

  {
    RemoteInstance p(options_for({secure.endpoint()}, ca));
    REQUIRE(p.create.code == BP_STATUS_OK);
    int32_t n = 0;
    const Outcome o = p.device_count(n);
    REQUIRE_MESSAGE(o.code == BP_STATUS_OK, o.message);
    bp_device_info_args info{BP_DEVICE_INFO_ARGS_STRUCT_SIZE, p.plugin, 0, 0, nullptr, 0, nullptr};
    REQUIRE(p.take(p.api->device_info(&info)).code == BP_STATUS_OK);
    bool tls_yes = false;
    for (int32_t i = 0; i < info.num_attributes; ++i)
      if (std::string(info.attributes[i].name) == "tls")
        tls_yes = std::string(info.attributes[i].value) == "yes";
    CHECK(tls_yes);
    const std::vector<float> v{1, 2, 3, 4};
    std::vector<float> back(4);
    bp_buffer* b = p.alloc(0, 16);
    CHECK(p.write(b, 0, v.data(), 16).code == BP_STATUS_OK);
    CHECK(p.read(b, 0, back.data(), 16).code == BP_STATUS_OK);
    CHECK(back == v);
    CHECK(p.free(b).code == BP_STATUS_OK);
  }
  {
    RemoteInstance p(options_for({secure.endpoint()}, R"("connect_timeout_ms": 10000)"));  // no tls_ca
    int32_t n = 0;
    const Outcome o = p.device_count(n);
    CHECK(o.code == BP_STATUS_UNAVAILABLE);
    CHECK(contains(o.message, "it may require TLS (set \"tls_ca\")"));
  }
  {
    RemoteInstance p(options_for({plain.endpoint()}, ca));
    int32_t n = 0;
    const Outcome o = p.device_count(n);
    CHECK(o.code == BP_STATUS_UNAVAILABLE);
    CHECK(contains(o.message, "the TLS handshake with " + plain.endpoint() + " failed"));
  }
  {
    RemoteInstance p(options_for({secure.endpoint()}, ca + R"(, "tls_server_name": "elsewhere.example")"));
    int32_t n = 0;
    const Outcome o = p.device_count(n);
    CHECK(o.code == BP_STATUS_UNAVAILABLE);
    CHECK(contains(o.message, "not issued for \"elsewhere.example\""));
  }
  {
    RemoteInstance p(options_for({secure.endpoint()}, R"("tls_ca": ")" + dir.path + "/missing.pem\""));
    CHECK(p.create.code == BP_STATUS_INVALID_ARGUMENT);
    CHECK(contains(p.create.message, "option \"tls_ca\""));
  }
}
