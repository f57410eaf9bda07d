// The remote server under attack: wrong and missing tokens, a replayed
// handshake, TLS required but not offered, frames that are oversized,
// truncated, stalled or of unknown type, out-of-range descriptors, ids of
// another session, allocations over the limits, thousands of connections at
// once. Each gets a clear error or a closed connection, and a well-behaved
// client is served on the same server afterwards.
#include "server_support.hpp"

#include <backplane/log.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

using namespace rstest;
namespace rs = backplane::remote::server;

namespace {

constexpr const char* kToken = "remote-server-test-token";

std::unique_ptr<rs::Server> serve(rs::ServerOptions o = test_options()) {
  return std::make_unique<rs::Server>(cpu_backend(), std::move(o));
}

// The Fatal the server sent before closing (fails the test when it sent none).
Answer fatal_then_close(RawClient& c) {
  std::optional<Frame> last;
  CHECK(c.closed_by_peer(20s, &last));
  REQUIRE_MESSAGE(last.has_value(), "the server closed without a Fatal");
  const Answer a = answer_of(*last);
  CHECK(a.type == wire::Body::Fatal);
  return a;
}

// A session past its handshake (fails the test otherwise).
void open_session(RawClient& c, const std::string& token = "") {
  const auto welcome = c.handshake(token);
  REQUIRE(welcome);
  REQUIRE_MESSAGE(welcome->type() == wire::Body::Welcome, answer_of(*welcome).message);
}

// Synchronize's answer: the sticky failure of pipelined work, if any.
Answer sync(RawClient& c, uint64_t id) {
  const auto r = c.request(msg::synchronize(id));
  REQUIRE(r);
  CHECK(r->msg()->id() == id);
  return answer_of(*r);
}

}  // namespace

TEST_CASE("remote server: the Welcome describes the hosted devices and the limits and a session works") {
  auto server = serve();
  RawClient c(server->port());
  const auto welcome = c.handshake();
  REQUIRE(welcome);
  const wire::Welcome* w = welcome->msg()->body_as_Welcome();
  REQUIRE(w != nullptr);
  CHECK(w->session() > 0);
  CHECK(w->backend()->str() == "cpu");
  REQUIRE(w->devices()->size() == 1);
  const wire::DeviceDesc* d = w->devices()->Get(0);
  CHECK(d->capabilities() == cpu_backend()->devices()[0].capabilities);
  CHECK((d->capabilities() & BP_CAP_COLLECTIVE) != 0);
  CHECK(d->op_count() == BP_OP_COUNT_);
  CHECK(d->dtype_count() == BP_DTYPE_COUNT_);
  const auto bit = static_cast<std::size_t>(int{BP_OP_ADD} * int{BP_DTYPE_COUNT_} + int{BP_DTYPE_F32});
  CHECK((d->support()->Get(static_cast<uint32_t>(bit / 8)) >> (bit % 8) & 1) == 1);
  const rs::ServerLimits defaults;
  CHECK(w->limits()->max_session_bytes() == defaults.max_session_bytes);
  CHECK(w->limits()->max_buffers() == defaults.max_buffers);
  CHECK(w->limits()->idle_timeout_ms() == 60000);
  // A Ping is answered at once with the same id.
  const auto pong = c.request(msg::ping(41));
  REQUIRE(pong);
  CHECK(pong->msg()->id() == 41);
  CHECK(answer_of(*pong).status == BP_STATUS_OK);
  CHECK(server->stats().sessions == 1);
  check_round_trip(server->port());
}

TEST_CASE(
    "remote server: a wrong token or no token or a replayed handshake is refused and the server keeps "
    "serving") {
  auto server = serve(test_options(kToken));
  SUBCASE("wrong token") {
    RawClient c(server->port());
    const auto challenge = c.hello();
    REQUIRE(challenge);
    const wire::Challenge* ch = challenge->msg()->body_as_Challenge();
    REQUIRE(ch != nullptr);
    CHECK(ch->auth_required());
    // The server proves it holds the token first; a client with another token sees that it cannot check it.
    const wire::Mac good = wire::server_proof(
        kToken, c.client_nonce(), std::span<const uint8_t>(ch->nonce()->data(), ch->nonce()->size()));
    const wire::Mac bad = wire::server_proof(
        "another", c.client_nonce(), std::span<const uint8_t>(ch->nonce()->data(), ch->nonce()->size()));
    CHECK(wire::same_mac(good,
                         std::span<const uint8_t>(ch->server_proof()->data(), ch->server_proof()->size())));
    CHECK_FALSE(wire::same_mac(
        bad, std::span<const uint8_t>(ch->server_proof()->data(), ch->server_proof()->size())));
    c.prove(*challenge, "another-token");
    const Answer a = fatal_then_close(c);
    CHECK(a.message.find("authentication failed: the client did not prove this server's token") !=
          std::string::npos);
  }
  SUBCASE("no token") {
    RawClient c(server->port());
    const auto challenge = c.hello();
    REQUIRE(challenge);
    c.prove(*challenge, "");
    CHECK(fatal_then_close(c).message.find("authentication failed") != std::string::npos);
  }
  SUBCASE("a replayed handshake") {
    // Record what a good client sends, then replay it on a new connection.
    RawClient good(server->port());
    const wire::Nonce nonce = wire::random_nonce();
    const std::vector<uint8_t> hello = msg::hello(nonce);
    REQUIRE(good.send(hello));
    const auto challenge = good.read_frame();
    REQUIRE(challenge);
    const auto* ch = challenge->msg()->body_as_Challenge();
    const std::vector<uint8_t> proof = msg::proof(wire::client_proof(
        kToken, nonce, std::span<const uint8_t>(ch->nonce()->data(), ch->nonce()->size())));
    REQUIRE(good.send(proof));
    const auto welcome = good.read_frame();
    REQUIRE(welcome);
    CHECK(welcome->type() == wire::Body::Welcome);

    RawClient replay(server->port());
    REQUIRE(replay.send(hello));
    const auto challenge2 = replay.read_frame();
    REQUIRE(challenge2);
    CHECK(challenge2->type() == wire::Body::Challenge);  // with a fresh nonce, so the old proof is worthless
    REQUIRE(replay.send(proof));
    CHECK(fatal_then_close(replay).message.find("authentication failed") != std::string::npos);
  }
  SUBCASE("a client of another protocol version") {
    RawClient c(server->port());
    const auto f = c.hello(wire::kProtocolVersion + 1);
    REQUIRE(f);
    const Answer a = answer_of(*f);
    CHECK(a.type == wire::Body::Fatal);
    CHECK(a.status == BP_STATUS_UNAVAILABLE);
    CHECK(a.message.find("this server speaks remote protocol version " +
                         std::to_string(wire::kProtocolVersion)) != std::string::npos);
    CHECK(c.closed_by_peer());
  }
  check_round_trip(server->port(), kToken);
  CHECK(server_is_empty(*server));
}

TEST_CASE("remote server: beyond loopback it refuses to start without a token") {
  rs::ServerOptions o = test_options();
  o.listen = "0.0.0.0:0";
  try {
    rs::Server s(cpu_backend(), o);
    FAIL("a server on 0.0.0.0 without a token started");
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    CHECK(m.find("refusing to listen on 0.0.0.0:0") != std::string::npos);
    CHECK(m.find("--token-file FILE") != std::string::npos);
    CHECK(m.find("BACKPLANE_REMOTE_TOKEN") != std::string::npos);
  }
  for (const char* loopback : {"127.0.0.1:0", "localhost:0", "127.0.0.2:0"}) {
    CAPTURE(loopback);
    o.listen = loopback;
    rs::Server s(cpu_backend(), o);
    CHECK(s.loopback_only());
  }
  o.listen = "0.0.0.0:0";
  o.token = kToken;
  rs::Server s(cpu_backend(), o);
  CHECK_FALSE(s.loopback_only());
}

TEST_CASE("remote server: TLS required but not offered closes the connection and a TLS client is served") {
  TempDir dir;
  const TlsFiles files = make_self_signed(dir.path());
  rs::ServerOptions o = test_options(kToken);
  o.tls_cert = files.cert;
  o.tls_key = files.key;
  auto server = serve(o);
  CHECK(server->tls());
  {
    RawClient plain(server->port());
    plain.send(msg::hello(wire::random_nonce()));
    // The TLS layer answers garbage with an alert (not a frame) and closes.
    CHECK(plain.closed_by_peer());
  }
  ClientTls tls(files.cert);
  check_round_trip(server->port(), kToken, tls.ctx);
  CHECK(server_is_empty(*server));
  // A certificate without its key (or the reverse) is refused at start.
  rs::ServerOptions half = test_options(kToken);
  half.tls_cert = files.cert;
  CHECK_THROWS_WITH_AS(rs::Server(cpu_backend(), half), doctest::Contains("--tls-key"), std::runtime_error);
}

TEST_CASE("remote server: oversized and truncated and stalled and unknown frames are refused") {
  rs::ServerOptions o = test_options();
  o.limits.max_frame_bytes = 1 << 20;
  o.limits.idle_timeout = std::chrono::milliseconds(500);
  o.limits.handshake_timeout = std::chrono::milliseconds(500);
  auto server = serve(o);
  const uint16_t port = server->port();

  SUBCASE("a message over the limit, before any allocation") {
    RawClient c(port);
    open_session(c);
    const auto h = wire::encode_header({static_cast<uint32_t>(wire::kDefaultMaxMessageBytes + 1), 0});
    REQUIRE(c.send(h));
    const Answer a = fatal_then_close(c);
    CHECK(a.status == BP_STATUS_INVALID_ARGUMENT);
    CHECK(a.message.find("over the limit of " + std::to_string(wire::kDefaultMaxMessageBytes)) !=
          std::string::npos);
  }
  SUBCASE("a payload over the frame limit") {
    RawClient c(port);
    open_session(c);
    REQUIRE(c.send(msg::write(1, 1, 0, (1 << 20) + 1)));
    CHECK(fatal_then_close(c).message.find("payload bytes, over the limit of 1048576") != std::string::npos);
  }
  SUBCASE("a payload during the handshake") {
    RawClient c(port);
    const auto h = wire::encode_header({64, 1});
    REQUIRE(c.send(h));
    CHECK(fatal_then_close(c).message.find("during the handshake") != std::string::npos);
  }
  SUBCASE("a Write whose payload is not its size") {
    RawClient c(port);
    open_session(c);
    flatbuffers::FlatBufferBuilder b;
    REQUIRE(c.send(frame_of(b, 1, wire::CreateWrite(b, 1, 0, 8), 4)));
    CHECK(fatal_then_close(c).message.find("carries 4 payload bytes but whose size field says 8") !=
          std::string::npos);
  }
  SUBCASE("bytes that are not a frame") {
    RawClient c(port);
    const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    REQUIRE(c.send(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(junk.data()), junk.size())));
    CHECK(fatal_then_close(c).message.find("magic bytes") != std::string::npos);
  }
  SUBCASE("a message the verifier refuses") {
    RawClient c(port);
    open_session(c);
    std::vector<uint8_t> f = msg::synchronize(9);
    for (std::size_t i = wire::kHeaderBytes; i < f.size(); ++i) f[i] = 0xff;
    REQUIRE(c.send(f));
    CHECK(fatal_then_close(c).message.find("not a valid FlatBuffers Message") != std::string::npos);
  }
  SUBCASE("a message of unknown type, one only a server sends, a Hello again") {
    {
      RawClient c(port);
      open_session(c);
      flatbuffers::FlatBufferBuilder b;
      const auto body = wire::CreatePing(b);
      b.Finish(wire::CreateMessage(b, 3, static_cast<wire::Body>(200), body.Union()));
      std::vector<uint8_t> f(wire::kHeaderBytes + b.GetSize());
      const auto h = wire::encode_header({static_cast<uint32_t>(b.GetSize()), 0});
      std::memcpy(f.data(), h.data(), h.size());
      std::memcpy(f.data() + wire::kHeaderBytes, b.GetBufferPointer(), b.GetSize());
      REQUIRE(c.send(f));
      CHECK(fatal_then_close(c).message.find("unknown type 200") != std::string::npos);
    }
    {
      RawClient c(port);
      open_session(c);
      flatbuffers::FlatBufferBuilder b;
      REQUIRE(c.send(frame_of(b, 3, wire::CreateReply(b, 0, b.CreateString("")))));
      CHECK(fatal_then_close(c).message.find("sent a Reply, which only a server sends") != std::string::npos);
    }
    {
      RawClient c(port);
      open_session(c);
      REQUIRE(c.send(msg::hello(wire::random_nonce())));
      CHECK(fatal_then_close(c).message.find("sent a Hello after its handshake had finished") !=
            std::string::npos);
    }
    {
      RawClient c(port);  // a request before the handshake
      REQUIRE(c.send(msg::synchronize(1)));
      CHECK(fatal_then_close(c).message.find("the first message must be a Hello, not a Synchronize") !=
            std::string::npos);
    }
  }
  SUBCASE("a truncated frame, then the client is gone") {
    RawClient c(port);
    open_session(c);
    REQUIRE(c.send(msg::alloc(1, 1, 0, 1024)));
    const std::vector<uint8_t> f = msg::synchronize(2);
    REQUIRE(c.send(std::span<const uint8_t>(f.data(), f.size() / 2)));
    c.reset();
  }
  SUBCASE("a frame stalled half-way: closed after the idle timeout") {
    RawClient c(port);
    open_session(c);
    const std::vector<uint8_t> f = msg::synchronize(2);
    REQUIRE(c.send(std::span<const uint8_t>(f.data(), 10)));
    const Answer a = fatal_then_close(c);
    CHECK(a.status == BP_STATUS_TIMEOUT);
    CHECK(a.message.find("sent nothing for 500 ms (the server's idle timeout, --idle-timeout-ms)") !=
          std::string::npos);
  }
  SUBCASE("a handshake stalled half-way: closed after the handshake timeout") {
    RawClient c(port);
    const std::vector<uint8_t> f = msg::hello(wire::random_nonce());
    REQUIRE(c.send(std::span<const uint8_t>(f.data(), 20)));
    CHECK(c.closed_by_peer());
  }
  CHECK(server_is_empty(*server));
  check_round_trip(port);
}

TEST_CASE(
    "remote server: out-of-range descriptors fail the op named at the next synchronize and the session goes "
    "on") {
  auto server = serve();
  RawClient c(server->port());
  open_session(c);
  REQUIRE(c.send(msg::alloc(1, 1, 0, 64)));
  REQUIRE(c.send(msg::alloc(2, 2, 0, 64)));
  REQUIRE(c.send(msg::alloc(3, 3, 0, 64)));
  CHECK(sync(c, 4).status == BP_STATUS_OK);
  uint64_t id = 10;
  struct Case {
    const char* what;
    int32_t op;
    msg::Desc in0;
    const char* expected;
  };
  const msg::Desc ok = msg::contiguous(1, {4});
  auto with = [&](auto change) {
    msg::Desc d = ok;
    change(d);
    return d;
  };
  const std::vector<Case> cases = {
      {"dtype", BP_OP_ADD, with([](msg::Desc& d) { d.dtype = 99; }), "inputs[0]: dtype 99 is not a dtype"},
      {"op", 999, ok, "op 999 is not an op this server knows"},
      {"shape", BP_OP_ADD, with([](msg::Desc& d) { d.shape = {-4}; }), "inputs[0].shape[0] is -4"},
      {"strides", BP_OP_ADD, with([](msg::Desc& d) { d.strides = {-1}; }), "inputs[0].strides[0] is -1"},
      {"rank", BP_OP_ADD, with([](msg::Desc& d) { d.strides.push_back(1); }), "1 extents but 2 strides"},
      {"offset past the buffer", BP_OP_ADD, with([](msg::Desc& d) { d.byte_offset = 56; }),
       "reaches byte 72"},
      {"misaligned offset", BP_OP_ADD, with([](msg::Desc& d) { d.byte_offset = 2; }), "not a multiple"},
      {"huge extent", BP_OP_ADD, with([](msg::Desc& d) { d.shape = {int64_t{1} << 62}; }), "inputs[0]"},
      {"a buffer never allocated", BP_OP_ADD, with([](msg::Desc& d) { d.buffer = 77; }),
       "buffer 77 is not a buffer of this session"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.what);
    const uint64_t exec_id = id++;
    REQUIRE(c.send(msg::execute(exec_id, k.op, {k.in0, msg::contiguous(2, {4})}, {msg::contiguous(3, {4})})));
    const Answer a = sync(c, id++);
    CHECK(a.status == BP_STATUS_INVALID_ARGUMENT);
    CHECK_MESSAGE(
        a.message.find("(request " + std::to_string(exec_id) + ") on device 0: ") != std::string::npos,
        a.message);
    CHECK_MESSAGE(a.message.find(k.expected) != std::string::npos, a.message);
    // Reported once: the next synchronize is clean.
    CHECK(sync(c, id++).status == BP_STATUS_OK);
  }
  // A device that does not exist, and an output that overlaps an input.
  REQUIRE(c.send(msg::execute(id++, BP_OP_ADD, {ok, ok}, {ok}, /*device=*/5)));
  Answer a = sync(c, id++);
  CHECK(a.message.find("device 5 does not exist: this server hosts 1 device(s)") != std::string::npos);
  REQUIRE(c.send(msg::execute(id++, BP_OP_NEG, {ok}, {ok})));
  a = sync(c, id++);
  CHECK(a.message.find("overlaps inputs[0]") != std::string::npos);
  // Several failures: the first is reported, the rest counted.
  REQUIRE(c.send(msg::free(id++, 55)));
  REQUIRE(c.send(msg::free(id++, 56)));
  a = sync(c, id++);
  CHECK(a.message.find("buffer_free (request") != std::string::npos);
  CHECK(a.message.find("buffer 55 is not a buffer of this session") != std::string::npos);
  CHECK(a.message.find("(and 1 later pipelined request(s) failed too)") != std::string::npos);
  // Reads and writes outside the buffer.
  const std::vector<uint8_t> eight(8, 1);
  REQUIRE(c.write(id++, 1, 60, eight));
  a = sync(c, id++);
  CHECK(a.message.find("bytes at offset 60 (8 of them) lie outside buffer 1 of 64 bytes") !=
        std::string::npos);
  const auto r = c.request(msg::read(id++, 1, uint64_t{0} - 8, 16));
  REQUIRE(r);
  CHECK(answer_of(*r).status == BP_STATUS_INVALID_ARGUMENT);
  CHECK(r->payload.empty());
  CHECK(server->stats().sessions == 1);
  CHECK(server->stats().bytes == 192);
  check_round_trip(server->port());
}

TEST_CASE("remote server: a session sees only its own buffers and the limits on bytes and buffers hold") {
  rs::ServerOptions o = test_options();
  o.limits.max_session_bytes = 1024;
  o.limits.max_buffers = 4;
  auto server = serve(o);
  RawClient a(server->port()), b(server->port());
  open_session(a);
  open_session(b);
  const std::vector<float> secret{1, 2, 3, 4};
  REQUIRE(a.send(msg::alloc(1, 7, 0, 16)));
  REQUIRE(a.write(2, 7, 0, bytes_of(secret)));
  CHECK(sync(a, 3).status == BP_STATUS_OK);

  // B names A's buffer 7: every use is refused, and A's data is untouched.
  const auto r = b.request(msg::read(1, 7, 0, 16));
  REQUIRE(r);
  CHECK(answer_of(*r).message.find("buffer 7 is not a buffer of this session") != std::string::npos);
  CHECK(r->payload.empty());
  const std::vector<float> junk{9, 9, 9, 9};
  REQUIRE(b.write(2, 7, 0, bytes_of(junk)));
  REQUIRE(b.send(msg::free(3, 7)));
  REQUIRE(b.send(msg::alloc(4, 8, 0, 16)));
  REQUIRE(b.send(msg::execute(5, BP_OP_NEG, {msg::contiguous(7, {4})}, {msg::contiguous(8, {4})})));
  Answer ans = sync(b, 6);
  CHECK(ans.message.find("buffer_write (request 2)") != std::string::npos);
  CHECK(ans.message.find("(and 2 later pipelined request(s) failed too)") != std::string::npos);
  const auto mine = a.request(msg::read(4, 7, 0, 16));
  REQUIRE(mine);
  CHECK(values_of<float>(mine->payload) == secret);

  // B's own ids are its own: it may use 7 too.
  REQUIRE(b.send(msg::alloc(7, 7, 0, 16)));
  CHECK(sync(b, 8).status == BP_STATUS_OK);

  // Over the byte limit, and over the buffer limit: out_of_memory, naming the option.
  REQUIRE(a.send(msg::alloc(5, 9, 0, 2048)));
  ans = sync(a, 6);
  CHECK(ans.status == BP_STATUS_OUT_OF_MEMORY);
  CHECK(ans.message.find(
            "pass the server's limit of 1024 bytes per session (backplane serve --max-session-bytes)") !=
        std::string::npos);
  for (uint64_t i = 0; i < 3; ++i) REQUIRE(a.send(msg::alloc(10 + i, 20 + i, 0, 8)));
  CHECK(sync(a, 13).status == BP_STATUS_OK);
  REQUIRE(a.send(msg::alloc(14, 30, 0, 8)));
  ans = sync(a, 15);
  CHECK(ans.status == BP_STATUS_OUT_OF_MEMORY);
  CHECK(ans.message.find("4 buffers, the server's limit (backplane serve --max-buffers)") !=
        std::string::npos);
  // A duplicate id is refused.
  REQUIRE(a.send(msg::free(16, 20)));
  REQUIRE(a.send(msg::alloc(17, 21, 0, 8)));
  CHECK(sync(a, 18).message.find("buffer id 21 is already in use in this session") != std::string::npos);
  CHECK(server->stats().sessions == 2);
}

TEST_CASE("remote server: sessions over --max-sessions get a Fatal and a freed slot is taken again") {
  rs::ServerOptions o = test_options();
  o.limits.max_sessions = 1;
  auto server = serve(o);
  auto first = std::make_unique<RawClient>(server->port());
  open_session(*first);
  {
    RawClient second(server->port());
    const auto f = second.handshake();
    REQUIRE(f);
    const Answer a = answer_of(*f);
    CHECK(a.type == wire::Body::Fatal);
    CHECK(a.status == BP_STATUS_UNAVAILABLE);
    CHECK(a.message == "the server has 1 sessions, its limit (--max-sessions); try later");
  }
  first.reset();
  REQUIRE(wait_until([&] { return server->stats().sessions == 0; }));
  check_round_trip(server->port());
}

TEST_CASE("remote server: a client that vanishes frees everything it held") {
  auto server = serve();
  SUBCASE("closed") {
    RawClient c(server->port());
    open_session(c);
    REQUIRE(c.send(msg::alloc(1, 1, 0, 1 << 20)));
    REQUIRE(c.send(msg::alloc(2, 2, 0, 1 << 10)));
    CHECK(sync(c, 3).status == BP_STATUS_OK);
    CHECK(server->stats().bytes == (1 << 20) + (1 << 10));
    CHECK(server->stats().buffers == 2);
  }
  SUBCASE("reset mid-stream, with queued work") {
    RawClient c(server->port());
    open_session(c);
    REQUIRE(c.send(msg::alloc(1, 1, 0, 1 << 20)));
    CHECK(sync(c, 2).status == BP_STATUS_OK);
    for (uint64_t i = 0; i < 200; ++i)
      REQUIRE(c.send(msg::execute(10 + i, BP_OP_FILL, {}, {msg::contiguous(1, {1 << 18})})));
    c.reset();
  }
  SUBCASE("killed (SIGKILL) in a child process") {
    // The child only replays frames made here; the server needs no token on loopback.
    const wire::Nonce nonce = wire::random_nonce();
    const std::vector<uint8_t> hello = msg::hello(nonce), proof = msg::proof({}),
                               alloc = msg::alloc(1, 1, 0, 4 << 20), syncf = msg::synchronize(2);
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const uint16_t port = server->port();
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(ready[0]);
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::_exit(1);
      auto frame = [&](const std::vector<uint8_t>& f) {
        return ::write(fd, f.data(), f.size()) == ssize_t(f.size());
      };
      auto skip_frame = [&] {  // reads one whole frame
        uint8_t h[16];
        std::size_t got = 0;
        while (got < 16) {
          const ssize_t n = ::read(fd, h + got, 16 - got);
          if (n <= 0) return false;
          got += static_cast<std::size_t>(n);
        }
        uint64_t left = 0;
        for (int i = 3; i >= 0; --i) left = (left << 8) | h[4 + i];
        std::vector<uint8_t> rest(left);
        got = 0;
        while (got < left) {
          const ssize_t n = ::read(fd, rest.data() + got, left - got);
          if (n <= 0) return false;
          got += static_cast<std::size_t>(n);
        }
        return true;
      };
      if (!frame(hello) || !skip_frame() || !frame(proof) || !skip_frame() || !frame(alloc) ||
          !frame(syncf) || !skip_frame())
        ::_exit(2);
      const char one = 1;
      if (::write(ready[1], &one, 1) != 1) ::_exit(3);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char got = 0;
    const bool child_ready = ::read(ready[0], &got, 1) == 1;
    ::close(ready[0]);
    CHECK(child_ready);
    if (child_ready) CHECK(server->stats().bytes == (4 << 20));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
  }
  CHECK(server_is_empty(*server));
  check_round_trip(server->port());
}

TEST_CASE(
    "remote server: a silent session is closed after the idle timeout and freed while pings keep one alive") {
  rs::ServerOptions o = test_options();
  o.limits.idle_timeout = std::chrono::milliseconds(300);
  auto server = serve(o);
  RawClient quiet(server->port()), pinging(server->port());
  open_session(quiet);
  open_session(pinging);
  REQUIRE(quiet.send(msg::alloc(1, 1, 0, 4096)));
  // Pings every 50 ms for longer than the idle timeout (a safety bound, not a timing assertion).
  for (uint64_t i = 1; i <= 20; ++i) {
    const auto pong = pinging.request(msg::ping(i));
    REQUIRE(pong);
    CHECK(pong->msg()->id() == i);
    std::this_thread::sleep_for(50ms);
  }
  const Answer a = fatal_then_close(quiet);
  CHECK(a.message.find("sent nothing for 300 ms") != std::string::npos);
  CHECK(answer_of(*pinging.request(msg::ping(99))).status == BP_STATUS_OK);
  REQUIRE(wait_until([&] { return server->stats().sessions == 1 && server->stats().bytes == 0; }));
}

TEST_CASE("remote server: thousands of connections at once and then a well-behaved client is served") {
  constexpr int kFlood = 1500;
  rlimit lim{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &lim) == 0);
  // Each flood connection costs two descriptors here (both ends are in this process).
  const rlim_t need = 2 * kFlood + 256;
  if (lim.rlim_cur < need) {
    rlimit raised = lim;
    raised.rlim_cur = std::min<rlim_t>(need, lim.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &raised);
    ::getrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < need) {
    MESSAGE("skipped: RLIMIT_NOFILE is " << lim.rlim_cur << " (hard " << lim.rlim_max << "), " << need
                                         << " descriptors are needed");
    return;
  }
  rs::ServerOptions o = test_options();
  o.limits.handshake_timeout = std::chrono::milliseconds(2000);
  auto server = serve(o);
  std::vector<std::unique_ptr<RawClient>> flood;
  flood.reserve(kFlood);
  for (int i = 0; i < kFlood; ++i) flood.push_back(std::make_unique<RawClient>(server->port()));
  // Over --max-handshakes-per-address (16) new connections wait for a slot;
  // each is closed at the handshake timeout, waiting or in its handshake.
  // None is left open.
  int closed = 0;
  for (auto& c : flood) closed += c->closed_by_peer(30s) ? 1 : 0;
  CHECK(closed == kFlood);
  flood.clear();
  CHECK(server_is_empty(*server));
  check_round_trip(server->port());
}

TEST_CASE("remote server: 200 silent connections from one address leave clients from others a way in") {
  rs::ServerOptions o = test_options();
  o.limits.handshake_timeout = std::chrono::milliseconds(3000);
  auto server = serve(o);
  // The flood's own address: 127.0.0.2 is loopback too. It gets its 16
  // handshake slots (--max-handshakes-per-address); the rest waits without one.
  std::vector<std::unique_ptr<RawClient>> flood;
  for (int i = 0; i < 200; ++i)
    flood.push_back(std::make_unique<RawClient>(server->port(), nullptr, "127.0.0.2"));
  REQUIRE(wait_until([&] { return server->stats().handshakes == 16 && server->stats().waiting == 184; }));
  int served = 0;
  for (int i = 0; i < 10; ++i) {
    RawClient c(server->port());
    const auto welcome = c.handshake();
    if (welcome && welcome->type() == wire::Body::Welcome) ++served;
  }
  CHECK(served == 10);
  CHECK(server->stats().handshakes <= 16);
  flood.clear();
  CHECK(server_is_empty(*server));
}

TEST_CASE("remote server: a client from the address of 200 silent connections gets in ahead of them") {
  rs::ServerOptions o = test_options();
  o.limits.handshake_timeout = std::chrono::milliseconds(2000);
  auto server = serve(o);
  // Every client here is 127.0.0.1, the flood's address too: over its 16
  // slots a connection waits (never closed for the limit), and one that
  // sends its Hello goes ahead of the silent ones.
  std::vector<std::unique_ptr<RawClient>> flood;
  for (int i = 0; i < 200; ++i) flood.push_back(std::make_unique<RawClient>(server->port()));
  REQUIRE(wait_until([&] { return server->stats().handshakes == 16 && server->stats().waiting == 184; }));
  for (int i = 0; i < 2; ++i) {
    RawClient c(server->port());
    const auto welcome = c.handshake();
    REQUIRE(welcome);
    CHECK(welcome->type() == wire::Body::Welcome);
    CHECK(c.send(msg::goodbye(1)));
    CHECK(c.closed_by_peer());
  }
  CHECK(server->stats().handshakes <= 16);
  flood.clear();
  CHECK(server_is_empty(*server));
}

TEST_CASE("remote server: at --max-handshakes a new client waits, and gets in once a slot frees") {
  rs::ServerOptions o = test_options();
  o.limits.max_handshakes = 8;
  o.limits.max_handshakes_per_address = 4;
  o.limits.handshake_timeout = std::chrono::milliseconds(1000);
  auto server = serve(o);
  // Two silent addresses fill every slot.
  std::vector<std::unique_ptr<RawClient>> silent;
  for (const char* from : {"127.0.0.2", "127.0.0.3"})
    for (int i = 0; i < 4; ++i) silent.push_back(std::make_unique<RawClient>(server->port(), nullptr, from));
  REQUIRE(wait_until([&] { return server->stats().handshakes == 8; }));
  // A client now waits for a slot instead of being closed, and is served
  // once the silent ones time out.
  RawClient late(server->port());
  const auto welcome = late.handshake();
  REQUIRE(welcome);
  CHECK(welcome->type() == wire::Body::Welcome);
  int closed = 0;
  for (auto& c : silent) closed += c->closed_by_peer(30s) ? 1 : 0;
  CHECK(closed == 8);
  CHECK(late.send(msg::goodbye(1)));
  CHECK(late.closed_by_peer());
  silent.clear();
  CHECK(server_is_empty(*server));
  check_round_trip(server->port());
}

TEST_CASE("remote server: pausing and resuming accepting under a flood stay within the log limit") {
  // Room for 16 waiting connections (half of a descriptor limit of 32, read
  // when the server starts), one handshake slot, and a flood whose every
  // connection sends a byte and then nothing: the server pauses and resumes
  // accepting over and over as they time out.
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = 32;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  rs::ServerOptions o = test_options();
  o.limits.max_handshakes = 1;
  o.limits.max_handshakes_per_address = 1;
  o.limits.handshake_timeout = std::chrono::milliseconds(100);
  std::unique_ptr<rs::Server> server;
  try {
    server = serve(o);
  } catch (...) {
    ::setrlimit(RLIMIT_NOFILE, &saved);
    throw;
  }
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);

  struct Line {
    std::chrono::steady_clock::time_point at;
    std::string text;
  };
  std::mutex mutex;
  std::vector<Line> lines;
  backplane::set_log_handler([&](backplane::LogLevel, std::string_view text) {
    std::lock_guard lock(mutex);
    lines.push_back(Line{std::chrono::steady_clock::now(), std::string(text)});
  });
  const auto paused_or_resumed = [](const std::string& t) {
    return t.find("paused accepting") != std::string::npos ||
           t.find("accepting connections again") != std::string::npos;
  };
  {
    std::vector<std::unique_ptr<RawClient>> flood;
    for (int i = 0; i < 300; ++i) {
      flood.push_back(std::make_unique<RawClient>(server->port()));
      flood.back()->send(std::vector<uint8_t>{0x42});
    }
    // Until the limit has held some of them back (30 s is the safety bound).
    CHECK(wait_until([&] {
      std::lock_guard lock(mutex);
      int shown = 0;
      bool held_back = false;
      for (const Line& l : lines) {
        shown += paused_or_resumed(l.text) ? 1 : 0;
        held_back = held_back || l.text.find("were not shown") != std::string::npos;
      }
      return held_back && shown >= 2;
    }));
    flood.clear();
  }
  CHECK(server_is_empty(*server));
  backplane::set_log_handler({});
  // Ten lines a second at most, plus a line saying how many were not shown:
  // any second holds at most two windows' worth.
  std::lock_guard lock(mutex);
  std::size_t most = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::size_t in_second = 0;
    for (std::size_t j = i; j < lines.size() && lines[j].at - lines[i].at < std::chrono::seconds(1); ++j)
      in_second += paused_or_resumed(lines[j].text) ? 1 : 0;
    most = std::max(most, in_second);
  }
  CHECK(most <= 22);
}

TEST_CASE("remote server: stop() tells every session and frees what they held") {
  auto server = serve();
  RawClient c(server->port());
  open_session(c);
  REQUIRE(c.send(msg::alloc(1, 1, 0, 4096)));
  CHECK(sync(c, 2).status == BP_STATUS_OK);
  server->stop();
  const Answer a = fatal_then_close(c);
  CHECK(a.status == BP_STATUS_UNAVAILABLE);
  CHECK(a.message == "the server is shutting down");
  const rs::ServerStats s = server->stats();
  CHECK(s.sessions == 0);
  CHECK(s.bytes == 0);
}

TEST_CASE("remote server: large writes and reads arrive intact while pings and pipelined work interleave") {
  auto server = serve();
  RawClient c(server->port());
  open_session(c);
  constexpr uint64_t kBytes = 4 << 20;
  REQUIRE(c.send(msg::alloc(1, 1, 0, kBytes)));
  REQUIRE(c.send(msg::alloc(2, 2, 0, 64)));
  uint64_t id = 10;
  for (uint32_t round = 0; round < 12; ++round) {
    CAPTURE(round);
    std::vector<uint32_t> pattern(kBytes / 4);
    for (std::size_t i = 0; i < pattern.size(); ++i)
      pattern[i] = static_cast<uint32_t>(i * 2654435761u + round);
    // Odd rounds queue work first, so the write's payload is staged until the
    // worker has run it; even rounds find the worker idle, so it goes straight
    // into the buffer.
    if (round % 2 == 1)
      for (int k = 0; k < 50; ++k)
        REQUIRE(c.send(msg::execute(id++, BP_OP_FILL, {}, {msg::contiguous(2, {16})})));
    REQUIRE(c.write(id++, 1, 0, bytes_of(pattern)));
    const auto pong = c.request(msg::ping(id++));
    REQUIRE(pong);
    CHECK(pong->type() == wire::Body::Reply);
    const auto r = c.request(msg::read(id++, 1, 0, kBytes));  // read_frame checks every header and message
    REQUIRE(r);
    REQUIRE(answer_of(*r).status == BP_STATUS_OK);
    CHECK(values_of<uint32_t>(r->payload) == pattern);
  }
  CHECK(sync(c, id++).status == BP_STATUS_OK);
}

TEST_CASE(
    "remote server: a large write that arrives while the worker is busy lands after the work before it") {
  auto server = serve();
  RawClient c(server->port());
  open_session(c);
  constexpr uint64_t kBytes = 8 << 20;
  const msg::Desc whole = msg::contiguous(1, {static_cast<int64_t>(kBytes / 4)});
  REQUIRE(c.send(msg::alloc(1, 1, 0, kBytes)));
  uint64_t id = 10;
  for (uint32_t round = 0; round < 6; ++round) {
    CAPTURE(round);
    std::vector<uint32_t> pattern(kBytes / 4);
    for (std::size_t i = 0; i < pattern.size(); ++i)
      pattern[i] = static_cast<uint32_t>(i * 2654435761u + round) | 1u;  // never the fills' zero
    // Fills of the whole buffer keep the worker busy while the write's header
    // and the start of its payload come in. Depending on when the worker is
    // done, the payload is staged whole, or staged in part and the rest read
    // straight into the buffer; a write that overtook a fill would leave zeros.
    for (int k = 0; k < 20; ++k) REQUIRE(c.send(msg::execute(id++, BP_OP_FILL, {}, {whole})));
    const std::span<const uint8_t> bytes = bytes_of(pattern);
    const std::size_t split = (round % 3) * (3u << 20);
    REQUIRE(c.send(msg::write(id++, 1, 0, kBytes)));
    REQUIRE(c.send(bytes.first(split)));
    if (round % 2 == 1) std::this_thread::sleep_for(50ms);  // the worker may finish the fills meanwhile
    REQUIRE(c.send(bytes.subspan(split)));
    const auto r = c.request(msg::read(id++, 1, 0, kBytes));
    REQUIRE(r);
    REQUIRE(answer_of(*r).status == BP_STATUS_OK);
    CHECK(values_of<uint32_t>(r->payload) == pattern);
  }

  // A large write behind a queued Free of its buffer fails as that write, and
  // one behind a queued Alloc of its buffer lands in the new buffer.
  const std::vector<uint32_t> pattern(kBytes / 4, 0x5eed5eedu);
  REQUIRE(c.send(msg::alloc(id++, 2, 0, kBytes)));
  for (int k = 0; k < 20; ++k) REQUIRE(c.send(msg::execute(id++, BP_OP_FILL, {}, {whole})));
  REQUIRE(c.send(msg::free(id++, 2)));
  const uint64_t doomed = id++;
  REQUIRE(c.write(doomed, 2, 0, bytes_of(pattern)));
  const Answer a = sync(c, id++);
  CHECK(a.status == BP_STATUS_INVALID_ARGUMENT);
  CHECK_MESSAGE(a.message.find("buffer_write (request " + std::to_string(doomed) + ")") != std::string::npos,
                a.message);
  CHECK_MESSAGE(a.message.find("buffer 2 is not a buffer of this session") != std::string::npos, a.message);
  for (int k = 0; k < 20; ++k) REQUIRE(c.send(msg::execute(id++, BP_OP_FILL, {}, {whole})));
  REQUIRE(c.send(msg::alloc(id++, 3, 0, kBytes)));
  REQUIRE(c.write(id++, 3, 0, bytes_of(pattern)));
  const auto r = c.request(msg::read(id++, 3, 0, kBytes));
  REQUIRE(r);
  REQUIRE(answer_of(*r).status == BP_STATUS_OK);
  CHECK(values_of<uint32_t>(r->payload) == pattern);
  CHECK(sync(c, id++).status == BP_STATUS_OK);
}
