// The remote plugin against real `backplane serve` processes hosting the cpu
// backend: the host's view of a served device, round trips of ops and large
// transfers, pipelined failures surfacing at the next synchronising call,
// a server killed with SIGKILL, and an all_reduce between two servers whose
// rendezvous goes through the client's store.
#include <backplane/backplane.hpp>

#include <doctest/doctest.h>

#include <future>
#include <numeric>

#include "client_support.hpp"
#include "serve_process.hpp"

namespace bp = backplane;
using namespace backplane::remote::test;

namespace {

std::string options_for(const std::string& endpoint, const std::string& extra = "") {
  return R"({"endpoints": [")" + endpoint + R"("], "token_env": "BP_TEST_REMOTE_NO_SUCH_TOKEN")" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

bp_tensor view(bp_buffer* b, int32_t dtype, const std::vector<int64_t>& shape,
               const std::vector<int64_t>& strides, uint64_t offset = 0) {
  return bp_tensor{b, offset, 0, dtype, static_cast<int32_t>(shape.size()), 0, shape.data(), strides.data()};
}

}  // namespace

TEST_CASE("serve: the host sees the served cpu device with remote and async, and runs tensors on it") {
  TempDir dir;
  ServeProcess server(dir.path);
  bp::Registry r = bp::Registry::from_json(
      R"({"schema_version": 1, "backends": [{"name": "remote", "library": "backplane_remote", "required": true, )"
      R"("options": )" +
          options_for(server.endpoint()) + "}]}",
      BP_TEST_PLUGIN_DIR, "test_serve");
  bp::Backend b = r.backend("remote");
  REQUIRE(b.device_count() == 1);
  const bp::Device d = b.device(0);
  CHECK(contains(d.name(), " @ " + server.endpoint()));
  CHECK(d.capabilities().has(bp::Capability::remote));
  CHECK(d.capabilities().has(bp::Capability::async));
  CHECK(d.capabilities().has(bp::Capability::collective));  // the cpu device has it
  CHECK_FALSE(d.capabilities().has(bp::Capability::host_visible));
  CHECK(d.attributes().at("server_backend") == "cpu");
  CHECK(d.attributes().at("endpoint") == server.endpoint());
  CHECK(d.memory().has_value());

  const bp::Tensor x = bp::Tensor::from_vector(d, bp::Shape{2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  const bp::Tensor y = bp::Tensor::from_vector(d, bp::Shape{3}, std::vector<float>{10, 20, 30});
  const bp::Tensor z = bp::sum(x + y, 1);  // broadcast, then a reduction
  CHECK(z.to_vector<float>() == std::vector<float>{66, 75});
}

TEST_CASE("serve: strided views and large transfers round trip through the ABI") {
  TempDir dir;
  ServeProcess server(dir.path);
  RemoteInstance p(options_for(server.endpoint()));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);
  REQUIRE(n == 1);

  // 16 MiB each way: the large-write path (sent from the caller's memory) and
  // the read reply received straight into the caller's memory.
  const uint64_t big = uint64_t{16} << 20;
  std::vector<uint8_t> data(big), back(big);
  for (uint64_t i = 0; i < big; ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  bp_buffer* buf = p.alloc(0, big);
  REQUIRE(p.write(buf, 0, data.data(), big).code == BP_STATUS_OK);
  const Outcome r = p.read(buf, 0, back.data(), big);
  REQUIRE_MESSAGE(r.code == BP_STATUS_OK, r.message);
  CHECK(back == data);
  CHECK(p.free(buf).code == BP_STATUS_OK);

  // out[i][j] = a[j][i] + b[j] (a transposed view, b broadcast with stride 0), at an offset.
  std::vector<float> a(6), bv(3);
  std::iota(a.begin(), a.end(), 0.0f);  // a is 3x2: [[0,1],[2,3],[4,5]]
  std::iota(bv.begin(), bv.end(), 100.0f);
  bp_buffer* ba = p.alloc(0, 16 + a.size() * 4);
  bp_buffer* bb = p.alloc(0, bv.size() * 4);
  bp_buffer* bo = p.alloc(0, 6 * 4);
  REQUIRE(p.write(ba, 16, a.data(), a.size() * 4).code == BP_STATUS_OK);
  REQUIRE(p.write(bb, 0, bv.data(), bv.size() * 4).code == BP_STATUS_OK);
  const std::vector<int64_t> shape{2, 3};
  const std::vector<int64_t> at_strides{1, 2}, b_strides{0, 1}, out_strides{3, 1};
  const bp_tensor in[2] = {view(ba, BP_DTYPE_F32, shape, at_strides, 16),
                           view(bb, BP_DTYPE_F32, shape, b_strides)};
  const bp_tensor out = view(bo, BP_DTYPE_F32, shape, out_strides);
  const bp_op_attrs attrs{BP_OP_ATTRS_STRUCT_SIZE, 0, 0, 0, 0.0, 0.0, 0};
  bp_execute_args e{BP_EXECUTE_ARGS_STRUCT_SIZE, p.plugin, 0, BP_OP_ADD, in, &out, 2, 1, &attrs};
  REQUIRE(p.take(p.api->execute(&e)).code == BP_STATUS_OK);
  std::vector<float> got(6);
  REQUIRE(p.read(bo, 0, got.data(), 24).code == BP_STATUS_OK);
  CHECK(got == std::vector<float>{100, 103, 106, 101, 104, 107});
  for (bp_buffer* x : {ba, bb, bo}) CHECK(p.free(x).code == BP_STATUS_OK);
}

TEST_CASE("serve: failures of pipelined work surface at the next synchronising call, naming the op") {
  TempDir dir;
  ServeProcess server(dir.path, {"--max-session-bytes", "1048576"});
  RemoteInstance p(options_for(server.endpoint()));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);

  // A data-dependent failure in the hosted plugin: gather with an index out of range.
  std::vector<float> x{1, 2, 3};
  std::vector<int64_t> index{0, 7};
  bp_buffer* bx = p.alloc(0, 12);
  bp_buffer* bi = p.alloc(0, 16);
  bp_buffer* bo = p.alloc(0, 8);
  REQUIRE(p.write(bx, 0, x.data(), 12).code == BP_STATUS_OK);
  REQUIRE(p.write(bi, 0, index.data(), 16).code == BP_STATUS_OK);
  const std::vector<int64_t> xs{3}, is{2}, one{1};
  const bp_tensor in[2] = {view(bx, BP_DTYPE_F32, xs, one), view(bi, BP_DTYPE_I64, is, one)};
  const bp_tensor out = view(bo, BP_DTYPE_F32, is, one);
  const bp_op_attrs attrs{BP_OP_ATTRS_STRUCT_SIZE, 0, 0, 0, 0.0, 0.0, 0};
  bp_execute_args e{BP_EXECUTE_ARGS_STRUCT_SIZE, p.plugin, 0, BP_OP_GATHER, in, &out, 2, 1, &attrs};
  CHECK(p.take(p.api->execute(&e)).code == BP_STATUS_OK);  // queued
  std::vector<float> got(2);
  const Outcome r = p.read(bo, 0, got.data(), 8);
  CHECK(r.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK_MESSAGE(contains(r.message, "server " + server.endpoint() + ": execute gather (request"), r.message);
  for (bp_buffer* b : {bx, bi, bo}) CHECK(p.free(b).code == BP_STATUS_OK);

  // An allocation over the session's byte limit: accepted at once, reported later.
  bp_buffer* huge = p.alloc(0, uint64_t{1} << 30);
  const Outcome s = p.synchronize(0);
  CHECK(s.code == BP_STATUS_OUT_OF_MEMORY);
  CHECK(contains(s.message, "server " + server.endpoint() + ": "));
  CHECK(contains(s.message, "buffer_alloc"));
  CHECK(p.synchronize(0).code == BP_STATUS_OK);  // reported once
  CHECK(p.free(huge).code == BP_STATUS_OK);      // the server never had it: its complaint comes later
}

TEST_CASE("serve: a server killed with SIGKILL makes every later call fail as unavailable, naming it") {
  TempDir dir;
  ServeProcess server(dir.path);
  RemoteInstance p(options_for(server.endpoint(), R"("request_timeout_ms": 30000)"));
  int32_t n = 0;
  REQUIRE(p.device_count(n).code == BP_STATUS_OK);
  bp_buffer* b = p.alloc(0, 64);
  REQUIRE(p.synchronize(0).code == BP_STATUS_OK);
  server.kill_hard();
  std::vector<uint8_t> dst(64);
  const Outcome r = p.read(b, 0, dst.data(), dst.size());
  CHECK(r.code == BP_STATUS_UNAVAILABLE);
  CHECK(contains(r.message, "server " + server.endpoint() + " is unreachable"));
  CHECK(p.synchronize(0).code == BP_STATUS_UNAVAILABLE);
  CHECK(p.free(b).code == BP_STATUS_OK);  // nothing left to free
}

TEST_CASE("serve: all_reduce between two servers, with the rendezvous through the client's store") {
  TempDir dir0, dir1;
  ServeProcess s0(dir0.path), s1(dir1.path);
  RemoteInstance p0(options_for(s0.endpoint())), p1(options_for(s1.endpoint()));
  int32_t n = 0;
  REQUIRE(p0.device_count(n).code == BP_STATUS_OK);
  REQUIRE(p1.device_count(n).code == BP_STATUS_OK);
  MemoryStore store;
  // Rank r holds [r+1, r+1, r+1, r+1]; the sum is [3, 3, 3, 3] on both.
  const auto rank = [&](RemoteInstance& p, int32_t r) -> std::vector<float> {
    bp_comm_create_args c{
        BP_COMM_CREATE_ARGS_STRUCT_SIZE, p.plugin, 0, r, 2, 0, 60000, &store.kv, "test/allreduce/", nullptr};
    const Outcome created = p.take(p.api->comm_create(&c));
    if (created.code != BP_STATUS_OK) return {-1.0f};
    const std::vector<float> mine(4, static_cast<float>(r + 1));
    bp_buffer* b = p.alloc(0, 16);
    p.write(b, 0, mine.data(), 16);
    const std::vector<int64_t> shape{4}, strides{1};
    const bp_tensor t = view(b, BP_DTYPE_F32, shape, strides);
    bp_collective_args a{BP_COLLECTIVE_ARGS_STRUCT_SIZE, p.plugin, c.comm, &t, &t, BP_REDUCE_SUM, 0};
    const Outcome reduced = p.take(p.api->all_reduce(&a));
    std::vector<float> got(4, -1.0f);
    if (reduced.code == BP_STATUS_OK) p.read(b, 0, got.data(), 16);
    p.free(b);
    bp_comm_args d{BP_COMM_ARGS_STRUCT_SIZE, p.plugin, c.comm};
    p.take(p.api->comm_destroy(&d));
    return got;
  };
  auto r0 = std::async(std::launch::async, rank, std::ref(p0), 0);
  auto r1 = std::async(std::launch::async, rank, std::ref(p1), 1);
  CHECK(r0.get() == std::vector<float>(4, 3.0f));
  CHECK(r1.get() == std::vector<float>(4, 3.0f));
  bool set_through_client = false;
  for (const auto& call : store.log()) set_through_client |= call.rfind("set test/allreduce/", 0) == 0;
  CHECK(set_through_client);
}
