// The remote plugin's options and messages without a network: option parsing
// (defaults, every option, every refusal), tokens from files and the
// environment, tensor descriptors as the server will decode them, the
// Welcome's checks and the wording of failures.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "client_support.hpp"
#include "plugins/remote/messages.hpp"
#include "plugins/remote/options.hpp"

namespace bprc = backplane::remote::client;
namespace wire = backplane::remote::wire;
using backplane::plugin::Failure;
using backplane::remote::test::contains;
using backplane::remote::test::TempDir;

namespace {

// The message of the failure parse_options throws (fails the test if none).
std::string refusal(const std::string& json) {
  try {
    bprc::parse_options(json);
  } catch (const Failure& e) {
    CHECK(e.code() == BP_STATUS_INVALID_ARGUMENT);
    return e.what();
  }
  FAIL("options were accepted: " << json);
  return "";
}

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  REQUIRE(::chmod(path.c_str(), mode) == 0);
}

}  // namespace

TEST_CASE("options: the defaults, and every option read") {
  const bprc::Options d = bprc::parse_options(R"({"endpoints": ["127.0.0.1:7070"]})");
  CHECK(d.endpoints == std::vector<std::string>{"127.0.0.1:7070"});
  CHECK(d.token_env == "BACKPLANE_REMOTE_TOKEN");
  CHECK(d.token_file.empty());
  CHECK(d.connect_timeout_ms == 15000);
  CHECK(d.request_timeout_ms == 60000);
  CHECK(d.heartbeat_ms == 10000);
  CHECK(d.tls_ca.empty());
  CHECK(d.tls_server_name.empty());
  CHECK(d.max_coalesce_bytes == 64 * 1024);

  const bprc::Options o = bprc::parse_options(
      R"({"endpoints": ["a.example:1", "[::1]:2"], "token_env": "MY_TOKEN", "connect_timeout_ms": 5,
          "request_timeout_ms": 6, "heartbeat_ms": 0, "tls_ca": "ca.pem", "tls_server_name": "srv",
          "max_coalesce_bytes": 0})");
  CHECK(o.endpoints.size() == 2);
  CHECK(o.token_env == "MY_TOKEN");
  CHECK(o.connect_timeout_ms == 5);
  CHECK(o.request_timeout_ms == 6);
  CHECK(o.heartbeat_ms == 0);
  CHECK(o.tls_ca == "ca.pem");
  CHECK(o.tls_server_name == "srv");
  CHECK(o.max_coalesce_bytes == 0);
}

TEST_CASE("options: every bad value is refused, naming the option and what is allowed") {
  CHECK(contains(refusal("{}"), "\"endpoints\" is required"));
  CHECK(contains(refusal("null"), "must be a JSON object"));
  CHECK(contains(refusal("{"), "not valid JSON"));
  CHECK(contains(refusal(R"({"endpoints": []})"), "non-empty array of \"HOST:PORT\""));
  CHECK(contains(refusal(R"({"endpoints": "127.0.0.1:7070"})"), "non-empty array"));
  CHECK(contains(refusal(R"({"endpoints": [7070]})"), "non-empty array"));
  CHECK(contains(refusal(R"({"endpoints": ["localhost"]})"), "is not HOST:PORT"));
  CHECK(contains(refusal(R"({"endpoints": ["h:70000"]})"), "no valid port"));
  CHECK(contains(refusal(R"({"endpoints": ["h:1", "h:1"]})"), "names \"h:1\" twice"));
  CHECK(contains(refusal(R"({"endpoints": ["h:1"], "connect_timeout_ms": 0})"),
                 "\"connect_timeout_ms\" must be an integer from 1"));
  CHECK(contains(refusal(R"({"endpoints": ["h:1"], "request_timeout_ms": -5})"), "\"request_timeout_ms\""));
  CHECK(contains(refusal(R"({"endpoints": ["h:1"], "heartbeat_ms": "10"})"), "\"heartbeat_ms\""));
  CHECK(contains(refusal(R"({"endpoints": ["h:1"], "max_coalesce_bytes": 1e12})"), "\"max_coalesce_bytes\""));
  CHECK(contains(refusal(R"({"endpoints": ["h:1"], "token_env": ""})"), "non-empty string"));
  CHECK(contains(refusal(R"({"endpoints": ["h:1"], "token_env": "A=B"})"), "no '='"));
  CHECK(
      contains(refusal(R"({"endpoints": ["h:1"], "token_env": "T", "token_file": "f"})"), "set one of them"));
  CHECK(contains(refusal(R"({"endpoints": ["h:1"], "tls_server_name": "x"})"), "needs \"tls_ca\""));
  const std::string unknown = refusal(R"({"endpoints": ["h:1"], "conect_timeout_ms": 5})");
  CHECK(contains(unknown, "unknown option \"conect_timeout_ms\""));
  CHECK(contains(unknown, "did you mean \"connect_timeout_ms\"?"));
  CHECK(contains(unknown, "\"heartbeat_ms\""));  // lists what is accepted
  CHECK_FALSE(contains(refusal(R"({"endpoints": ["h:1"], "zzzzzzzz": 1})"), "did you mean"));
}

TEST_CASE("options: the token comes from a private one-line file, or from the named variable") {
  TempDir dir;
  const std::string file = dir.path + "/token";
  write_file(file, "s3cret\n", 0600);
  bprc::Options o = bprc::parse_options(R"({"endpoints": ["h:1"], "token_file": ")" + file + "\"}");
  CHECK(bprc::read_token(o) == "s3cret");
  // The rules are every secret file's (backplane_common's read_secret_file).
  write_file(file, "s3cret\nsecond line\n", 0600);
  CHECK_THROWS_WITH_AS(bprc::read_token(o), doctest::Contains("more than one line"), Failure);

  write_file(file, "s3cret\n", 0644);
  try {
    bprc::read_token(o);
    FAIL("a token file others can read was accepted");
  } catch (const Failure& e) {
    CHECK(contains(e.what(), "chmod 600"));
  }
  write_file(file, "\n", 0600);
  CHECK_THROWS_WITH_AS(bprc::read_token(o), doctest::Contains("is empty"), Failure);
  o.token_file = dir.path + "/missing";
  CHECK_THROWS_WITH_AS(bprc::read_token(o), doctest::Contains("cannot be opened"), Failure);
  CHECK_THROWS_WITH_AS(bprc::read_token(o),
                       doctest::Contains("remote: the token file (option \"token_file\")"), Failure);

  o = bprc::parse_options(R"({"endpoints": ["h:1"], "token_env": "BP_TEST_REMOTE_OPTIONS_TOKEN"})");
  ::unsetenv("BP_TEST_REMOTE_OPTIONS_TOKEN");
  CHECK(bprc::read_token(o).empty());
  ::setenv("BP_TEST_REMOTE_OPTIONS_TOKEN", "from-env", 1);
  CHECK(bprc::read_token(o) == "from-env");
  ::unsetenv("BP_TEST_REMOTE_OPTIONS_TOKEN");
}

TEST_CASE("messages: a tensor descriptor carries the view exactly, and passes the Verifier") {
  const int64_t shape[3] = {2, 3, 4};
  const int64_t strides[3] = {12, 4, 1};
  const bp_tensor t{nullptr, 16, 0, BP_DTYPE_F64, 3, 0, shape, strides};
  flatbuffers::FlatBufferBuilder fbb;
  const auto desc = bprc::encode_tensor(fbb, t, 42, "inputs[0]");
  const auto ins = fbb.CreateVector(std::vector<flatbuffers::Offset<wire::TensorDesc>>{desc});
  const auto exec = wire::CreateExecute(fbb, 1, BP_OP_ADD, ins, 0, 0, 0, 0.5, 0, 7);
  const wire::Encoded e = wire::finish(fbb, wire::CreateMessage(fbb, 9, wire::Body::Execute, exec.Union()));
  std::string why;
  const wire::Message* m =
      wire::verify_message(std::span<const uint8_t>(e.bytes).subspan(wire::kHeaderBytes), why);
  REQUIRE_MESSAGE(m != nullptr, why);
  const wire::Execute* x = m->body_as_Execute();
  REQUIRE(x != nullptr);
  CHECK(m->id() == 9);
  CHECK(x->device() == 1);
  CHECK(x->scalar0() == 0.5);
  CHECK(x->seed() == 7);
  const wire::TensorDesc* d = x->inputs()->Get(0);
  CHECK(d->buffer() == 42);
  CHECK(d->byte_offset() == 16);
  CHECK(d->dtype() == BP_DTYPE_F64);
  CHECK(std::vector<int64_t>(d->shape()->begin(), d->shape()->end()) == std::vector<int64_t>{2, 3, 4});
  CHECK(std::vector<int64_t>(d->strides()->begin(), d->strides()->end()) == std::vector<int64_t>{12, 4, 1});

  // A scalar: rank 0, empty shape and strides.
  const bp_tensor s{nullptr, 0, 0, BP_DTYPE_F32, 0, 0, nullptr, nullptr};
  flatbuffers::FlatBufferBuilder fbb2;
  fbb2.Finish(bprc::encode_tensor(fbb2, s, 1, "output"));
  const auto* sd = flatbuffers::GetRoot<wire::TensorDesc>(fbb2.GetBufferPointer());
  CHECK(sd->shape()->size() == 0);

  const int64_t big[65] = {};
  const bp_tensor too_deep{nullptr, 0, 0, BP_DTYPE_F32, 65, 0, big, big};
  CHECK_THROWS_WITH_AS(bprc::encode_tensor(fbb2, too_deep, 1, "inputs[1]"),
                       doctest::Contains("inputs[1] has 65 dimensions"), Failure);
}

TEST_CASE("messages: the Welcome's device list is checked before the client uses it") {
  const auto welcome = [](int32_t ops, int32_t dtypes, std::vector<uint8_t> support, const char* name) {
    auto fbb = std::make_unique<flatbuffers::FlatBufferBuilder>();
    const auto n = fbb->CreateString(name);
    const auto s = fbb->CreateVector(support);
    const auto dev = wire::CreateDeviceDesc(*fbb, n, BP_CAP_F32, 0, ops, dtypes, s);
    const auto devs = fbb->CreateVector(std::vector<flatbuffers::Offset<wire::DeviceDesc>>{dev});
    fbb->Finish(wire::CreateWelcome(*fbb, 5, fbb->CreateString("cpu"), 0, devs, 0));
    return fbb;
  };
  bprc::ServerInfo info;
  // 3 ops x 4 dtypes = 12 bits: bit (1 * 4 + 2) = 6 set -> op 1 on dtype 2.
  auto good = welcome(3, 4, {0x40, 0x00}, "dev");
  CHECK(bprc::decode_welcome(*flatbuffers::GetRoot<wire::Welcome>(good->GetBufferPointer()), info) == "");
  REQUIRE(info.devices.size() == 1);
  CHECK(info.session == 5);
  CHECK(info.backend == "cpu");
  CHECK(info.devices[0].supports(1, 2));
  CHECK_FALSE(info.devices[0].supports(1, 1));
  CHECK_FALSE(info.devices[0].supports(3, 0));  // outside the table
  CHECK_FALSE(info.devices[0].supports(-1, 0));

  auto short_table = welcome(3, 4, {0x40}, "dev");
  CHECK(contains(
      bprc::decode_welcome(*flatbuffers::GetRoot<wire::Welcome>(short_table->GetBufferPointer()), info),
      "support table holds 1 bytes, fewer than the 2"));
  auto nameless = welcome(0, 0, {}, "");
  CHECK(
      contains(bprc::decode_welcome(*flatbuffers::GetRoot<wire::Welcome>(nameless->GetBufferPointer()), info),
               "device 0 has no name"));
}

TEST_CASE("messages: failures name the server, and unknown status codes become internal") {
  CHECK(bprc::server_failure("h:1", BP_STATUS_INVALID_ARGUMENT, "execute add (request 3) on device 0: bad") ==
        "server h:1: execute add (request 3) on device 0: bad");
  CHECK(contains(bprc::server_failure("h:1", 99, "x"), "unknown status code 99"));
  CHECK(bprc::server_status_code(BP_STATUS_OUT_OF_MEMORY) == BP_STATUS_OUT_OF_MEMORY);
  CHECK(bprc::server_status_code(99) == BP_STATUS_INTERNAL);
  CHECK(bprc::server_status_code(0) == BP_STATUS_INTERNAL);
  const std::string u = bprc::unreachable("h:1", "connection lost (x)");
  CHECK(contains(u, "server h:1 is unreachable: connection lost (x)"));
  CHECK(contains(u, "restart the server and the job"));
}
