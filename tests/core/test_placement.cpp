// Op placement (op_fallback): ops and dtypes a device lacks run on its
// backend's fallback device, the result keeps the user's device, bytes move
// only when needed, autodiff follows, and the report counts what it cost.
// Partial backends: the cpu plugin restricted by its "ops"/"dtypes" options
// (host_visible) and the opaque fixture (not host_visible: ADD, MUL, COPY on f32).
#include "test_support.hpp"

#include <backplane/backplane.hpp>
#include <backplane/dlpack.hpp>

#include <dlpack/dlpack.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace bp = backplane;
using namespace bptest;

namespace {

std::string cpu_library() { return json_path(plugin_dir() / "libbackplane_cpu.so"); }

// "cpu" (the whole cpu plugin), "small" (fill, copy, matmul on f32 only) and
// "opaque", the last two falling back to cpu unless `fallback` is false; with
// `cpu2`, a second whole cpu backend to switch small's fallback to.
bp::Registry placement_registry(bool fallback = true, bool cpu2 = false) {
  const std::string fb = fallback ? R"(, "op_fallback": "host:cpu")" : "";
  const std::string second = cpu2 ? R"({"name": "cpu2", "library": )" + cpu_library() + "},\n" : "";
  const std::string json = R"({"schema_version": 1, "backends": [
    {"name": "cpu", "library": )" +
                           cpu_library() + "},\n" + second + R"(    {"name": "small", "library": )" +
                           cpu_library() +
                           R"(, "options": {"ops": ["fill", "copy", "matmul"], "dtypes": ["f32"]})" + fb +
                           R"(},
    {"name": "opaque", "library": )" +
                           json_path(fixture("opaque")) + fb + R"(}]})";
  return bp::Registry::from_json(json, fixture_dir(), "placement test");
}

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
}

const bp::OpFallbackStats* find_stats(const std::vector<bp::OpFallbackStats>& stats, bp::Op op,
                                      bp::DType dtype) {
  for (const auto& s : stats)
    if (s.op == op && s.dtype == dtype) return &s;
  return nullptr;
}

// The little program every partial device must run like cpu: broadcasting,
// unary math, reductions, a comparison and where, matmul, softmax.
std::vector<float> program(const bp::Device& d) {
  const bp::Tensor x = bp::Tensor::from_vector<float>(d, {2, 3}, {1, -2, 3, -4, 5, -6});
  const bp::Tensor b = bp::Tensor::from_vector<float>(d, {3}, {0.5f, 1.5f, -1});
  bp::Tensor y = bp::relu(bp::add(x, b));
  y = bp::mul(bp::exp(bp::neg(y)), bp::sub(x, b));
  const bp::Tensor w = bp::Tensor::from_vector<float>(d, {3, 2}, {1, 2, 3, 4, 5, 6});
  const bp::Tensor m = bp::matmul(y, w);
  const bp::Tensor s = bp::log_softmax(m, 1);
  const bp::Tensor picked = bp::where(bp::gt(s, bp::full(d, {}, -1.0)), s, bp::zeros(d, {2, 2}));
  bp::Tensor out = bp::add(bp::sum(picked, 0, true), bp::mean(m));
  return out.to_vector<float>();
}

}  // namespace

TEST_CASE("placement: ops a restricted cpu device lacks run on its fallback and give cpu's results") {
  const bp::Registry r = placement_registry();
  const bp::Device small = r.backend("small").device();
  const bp::Device cpu = r.backend("cpu").device();
  CHECK(r.backend("small").op_fallback().to_string() == "host:cpu");
  CHECK_FALSE(small.supports(bp::Op::add, bp::DType::f32));
  LogCapture logs(bp::LogLevel::debug);
  r.backend("small").reset_op_fallback_stats();
  check_close(program(small), program(cpu));

  // The user's device is kept, wherever the bytes are.
  const bp::Tensor x = bp::Tensor::from_vector<float>(small, {2}, {1, 2});
  const bp::Tensor y = bp::add(x, x);
  CHECK(y.device() == small);
  CHECK(y.to(small).to_vector<float>() == std::vector<float>{2, 4});
  CHECK(y.to(cpu).device() == cpu);
  CHECK(y.to(cpu).to_vector<float>() == std::vector<float>{2, 4});

  // The report: per (op, dtype), ranked by time; matmul ran natively.
  const auto stats = r.backend("small").op_fallback_stats();
  const bp::OpFallbackStats* add = find_stats(stats, bp::Op::add, bp::DType::f32);
  REQUIRE(add != nullptr);
  CHECK(add->calls == 3);  // two in program(), one above
  CHECK(find_stats(stats, bp::Op::matmul, bp::DType::f32) == nullptr);
  CHECK(find_stats(stats, bp::Op::exp, bp::DType::f32) != nullptr);
  for (std::size_t i = 1; i < stats.size(); ++i) CHECK(stats[i - 1].seconds >= stats[i].seconds);
  // Between two host_visible devices nothing is copied: imports only.
  for (const auto& s : stats) CHECK(s.bytes_moved() == 0);
  // Logged once per (op, dtype), at debug level (the report says it at info).
  CHECK(logs.at(bp::LogLevel::info, "does not run add on f32").empty());
  REQUIRE(logs.at(bp::LogLevel::debug, "does not run add on f32").size() == 1);
  CHECK(logs.at(bp::LogLevel::debug, "does not run add on f32")[0].find("host:cpu") != std::string::npos);
}

TEST_CASE("placement: dtypes a device lacks are held on its fallback for it, transparently") {
  const bp::Registry r = placement_registry();
  const bp::Device small = r.backend("small").device();
  const bp::Device cpu = r.backend("cpu").device();
  CHECK_FALSE(small.capabilities().has(bp::Capability::i64));

  const bp::Tensor labels = bp::Tensor::from_vector<int64_t>(small, {3}, {2, 0, 1});
  CHECK(labels.device() == small);
  CHECK(labels.dtype() == bp::DType::i64);
  CHECK(labels.to_vector<int64_t>() == std::vector<int64_t>{2, 0, 1});
  CHECK(labels.to(cpu).to_vector<int64_t>() == std::vector<int64_t>{2, 0, 1});
  CHECK(bp::Tensor::empty(small, {4}, bp::DType::f64).device() == small);

  const bp::Tensor mask =
      bp::gt(bp::Tensor::from_vector<float>(small, {3}, {1, -1, 2}), bp::zeros(small, {3}));
  CHECK(mask.dtype() == bp::DType::bool_);
  CHECK(mask.device() == small);
  CHECK(mask.to_vector<bool>() == std::vector<bool>{true, false, true});

  const bp::Tensor scores = bp::Tensor::from_vector<float>(small, {2, 3}, {1, 5, 2, 7, 0, 3});
  const bp::Tensor am = bp::argmax(scores, 1);
  CHECK(am.device() == small);
  CHECK(am.to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  const bp::Tensor as_f64 = bp::cast(scores, bp::DType::f64);
  CHECK(as_f64.device() == small);
  CHECK(as_f64.to_vector<double>()[1] == 5.0);
  CHECK(bp::index_select(scores, 1, labels).to_vector<float>() == std::vector<float>{2, 1, 5, 3, 7, 0});

  // DLPack export says where the bytes really are: an f64 tensor of the
  // opaque device (which cannot hold f64, nor export anything) is host memory of cpu:0.
  const bp::Tensor held = bp::Tensor::from_vector<double>(r.backend("opaque").device(), {2}, {7, 8});
  DLManagedTensor* m = bp::to_dlpack(held);
  REQUIRE(m != nullptr);
  CHECK(m->dl_tensor.device.device_type == kDLCPU);
  CHECK(static_cast<const double*>(m->dl_tensor.data)[1] == 8.0);
  m->deleter(m);
}

TEST_CASE("placement: without a fallback the typed errors are unchanged") {
  const bp::Registry r = placement_registry(false);
  const bp::Device small = r.backend("small").device();
  const bp::Tensor x = bp::Tensor::from_vector<float>(small, {2}, {1, 2});
  bp::Error e = error_from([&] { bp::add(x, x); });
  CHECK(e.code() == bp::Errc::unsupported_op);
  BP_CHECK_CONTAINS(e.message(), "does not support add on f32");
  e = error_from([&] { bp::Tensor::from_vector<int64_t>(small, {1}, {1}); });
  CHECK(e.code() == bp::Errc::capability_missing);
  BP_CHECK_CONTAINS(e.message(), "op_fallback");
}

TEST_CASE("placement: OpFallbackOff and set_op_fallback switch placement at run time") {
  const bp::Registry r = placement_registry();
  const bp::Device small = r.backend("small").device();
  const bp::Tensor x = bp::Tensor::from_vector<float>(small, {2}, {1, 2});
  {
    const bp::OpFallbackOff off;
    CHECK(error_from([&] { bp::add(x, x); }).code() == bp::Errc::unsupported_op);
    CHECK(error_from([&] { bp::Tensor::from_vector<int64_t>(small, {1}, {1}); }).code() ==
          bp::Errc::capability_missing);
  }
  CHECK(bp::add(x, x).to_vector<float>() == std::vector<float>{2, 4});

  r.set_op_fallback("small", bp::OpFallback{});
  CHECK(r.backend("small").op_fallback().kind == bp::OpFallback::Kind::error);
  CHECK(error_from([&] { bp::add(x, x); }).code() == bp::Errc::unsupported_op);
  r.set_op_fallback("small", bp::OpFallback{bp::OpFallback::Kind::host, "cpu"});
  CHECK(bp::add(x, x).to_vector<float>() == std::vector<float>{2, 4});

  // The config's rules.
  bp::Error e = error_from([&] { r.set_op_fallback("small", {bp::OpFallback::Kind::host, "small"}); });
  CHECK(e.code() == bp::Errc::config_error);
  e = error_from([&] { r.set_op_fallback("small", {bp::OpFallback::Kind::host, "nope"}); });
  CHECK(e.code() == bp::Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "nope");
  e = error_from([&] { r.set_op_fallback("cpu", {bp::OpFallback::Kind::host, "opaque"}); });
  CHECK(e.code() == bp::Errc::config_error);  // opaque falls back itself: no chains
  e = error_from([&] { r.set_op_fallback("nope", {}); });
  CHECK(e.code() == bp::Errc::not_found);
}

TEST_CASE("placement: a non-host_visible device moves bytes only when an op or a read needs them") {
  const bp::Registry r = placement_registry();
  const bp::Device op = r.backend("opaque").device();
  const bp::Backend backend = r.backend("opaque");
  backend.reset_op_fallback_stats();
  const bp::Tensor x = bp::Tensor::from_vector<float>(op, {4}, {1, 2, 3, 4});  // 16 bytes on opaque:0
  // A chain of ops opaque lacks: x goes to cpu once; the intermediates stay there.
  const bp::Tensor y = bp::exp(bp::neg(bp::relu(bp::sub(x, x))));
  CHECK(y.device() == op);
  auto stats = backend.op_fallback_stats();
  uint64_t to_host = 0, from_host = 0;
  for (const auto& s : stats) to_host += s.bytes_to_host, from_host += s.bytes_from_host;
  CHECK(to_host == 16);
  CHECK(from_host == 0);
  // A read of bytes on cpu costs no copy back.
  CHECK(y.to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  stats = backend.op_fallback_stats();
  from_host = 0;
  for (const auto& s : stats) from_host += s.bytes_from_host;
  CHECK(from_host == 0);
  // An op opaque runs (add) needs y back: charged to add, which needed it,
  // not to exp, which made it (implementing exp would only move the copy).
  CHECK(bp::add(y, x).to_vector<float>() == std::vector<float>{2, 3, 4, 5});
  stats = backend.op_fallback_stats();
  const bp::OpFallbackStats* add = find_stats(stats, bp::Op::add, bp::DType::f32);
  REQUIRE(add != nullptr);
  CHECK(add->bytes_from_host == 16);
  CHECK(add->calls == 0);  // it ran on opaque itself
  CHECK(find_stats(stats, bp::Op::exp, bp::DType::f32)->bytes_from_host == 0);
  // x is on cpu already (a replica): a second fallback op moves nothing more.
  bp::relu(x);
  to_host = 0;
  for (const auto& s : backend.op_fallback_stats()) to_host += s.bytes_to_host;
  CHECK(to_host == 16);
  // An in-place write drops the stale replica: the next fallback op sees the new values.
  x.copy_(bp::Tensor::from_vector<float>(op, {4}, {-1, -2, -3, -4}));
  CHECK(bp::relu(bp::neg(x)).to_vector<float>() == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("placement: one replica serves every view of an operand, and an in-place write reaches each") {
  const bp::Registry r = placement_registry();
  const bp::Device op = r.backend("opaque").device();
  const bp::Backend backend = r.backend("opaque");
  backend.reset_op_fallback_stats();
  const bp::Tensor x = bp::Tensor::from_vector<float>(op, {2, 3}, {1, -2, 3, -4, 5, -6});  // 24 bytes
  const bp::Tensor xt = bp::transpose(x, 0, 1);                                            // the same bytes
  const std::vector<float> x_relu{1, 0, 3, 0, 5, 0}, xt_relu{1, 0, 0, 5, 3, 0};
  // Alternating layouts of one storage: one copy to cpu, each layout read right every time.
  for (int round = 0; round < 3; ++round) {
    CHECK(bp::relu(x).to_vector<float>() == x_relu);
    CHECK(bp::relu(xt).to_vector<float>() == xt_relu);
  }
  const bp::Tensor x_row = bp::slice(x, 0, 1, 2);  // a third layout: offset into the storage
  CHECK(bp::relu(x_row).to_vector<float>() == std::vector<float>{0, 5, 0});
  CHECK(bp::relu(xt).to_vector<float>() == xt_relu);
  uint64_t to_host = 0, calls = 0;
  double seconds = 0;
  for (const auto& s : backend.op_fallback_stats())
    to_host += s.bytes_to_host, calls += s.calls, seconds += s.seconds;
  CHECK(to_host == 24);
  CHECK(calls == 8);
  CHECK(seconds > 0);  // a pair's first calls are always timed
  // A write in place drops the replica and its views: every layout sees the new values.
  x.copy_(bp::Tensor::from_vector<float>(op, {2, 3}, {-1, 2, -3, 4, -5, 6}));
  CHECK(bp::relu(xt).to_vector<float>() == std::vector<float>{0, 4, 2, 0, 0, 6});
  CHECK(bp::relu(x).to_vector<float>() == std::vector<float>{0, 2, 0, 4, 0, 6});
  CHECK(bp::relu(x_row).to_vector<float>() == std::vector<float>{4, 0, 6});
}

TEST_CASE("placement: backward of placed ops is placed, gradients equal cpu's and arrive on the device") {
  const bp::Registry r = placement_registry();
  auto grads_on = [](const bp::Device& d) {
    const bp::Tensor w =
        bp::Tensor::from_vector<float>(d, {3, 2}, {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f}).require_grad();
    const bp::Tensor b = bp::Tensor::from_vector<float>(d, {2}, {0.01f, -0.02f}).require_grad();
    const bp::Tensor x = bp::Tensor::from_vector<float>(d, {4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
    const bp::Tensor labels = bp::Tensor::from_vector<int64_t>(d, {4}, {0, 1, 1, 0});
    const bp::Tensor loss = bp::nn::cross_entropy(bp::relu(bp::add(bp::matmul(x, w), b)), labels);
    const bp::Gradients g = loss.backward();
    CHECK(g.get(w)->device() == d);
    CHECK(g.get(b)->device() == d);
    std::vector<float> out = g.get(w)->to_vector<float>();
    for (float v : g.get(b)->to_vector<float>()) out.push_back(v);
    out.push_back(loss.to_vector<float>()[0]);
    return out;
  };
  const auto want = grads_on(r.backend("cpu").device());
  check_close(grads_on(r.backend("small").device()), want);
  check_close(grads_on(r.backend("opaque").device()), want);
}

TEST_CASE("placement: two threads reading a tensor while its bytes move get the same values") {
  const bp::Registry r = placement_registry();
  const bp::Device op = r.backend("opaque").device();
  for (int round = 0; round < 20; ++round) {
    std::vector<float> values(1024);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 17) - 8.0f + round;
    const bp::Tensor x = bp::Tensor::from_vector<float>(op, {1024}, values);
    std::vector<float> got[2];
    std::thread threads[2];
    for (int t = 0; t < 2; ++t) {
      threads[t] = std::thread([&, t] {
        // Each thread's first fallback op makes (or finds) x's replica on cpu.
        got[t] = (t == 0 ? bp::relu(x) : bp::abs(x)).to_vector<float>();
      });
    }
    for (auto& th : threads) th.join();
    for (std::size_t i = 0; i < values.size(); ++i) {
      CHECK(got[0][i] == std::max(values[i], 0.0f));
      CHECK(got[1][i] == std::fabs(values[i]));
    }
  }
}

TEST_CASE("placement: an error on the fallback device is typed and names both devices") {
  const bp::Registry r = placement_registry();
  const bp::Device small = r.backend("small").device();
  const bp::Tensor x = bp::Tensor::from_vector<float>(small, {2, 2}, {1, 2, 3, 4});
  const bp::Tensor bad = bp::Tensor::from_vector<int64_t>(small, {1}, {7});  // out of range
  bp::Error e = error_from([&] { bp::index_select(x, 0, bad); });
  CHECK(e.code() != bp::Errc::internal);
  BP_CHECK_CONTAINS(e.message(), "cpu:0");
  BP_CHECK_CONTAINS(e.message(), "small:0");
  // Validation comes first, as without placement.
  e = error_from([&] { bp::sqrt(bp::Tensor::from_vector<int64_t>(small, {1}, {4})); });
  CHECK(e.code() == bp::Errc::dtype_mismatch);
  // Neither device runs it: the error names both and why.
  const bp::Registry partial = placement_registry(false);
  partial.set_op_fallback("small", {bp::OpFallback::Kind::host, "opaque"});
  const bp::Tensor y = bp::Tensor::from_vector<float>(partial.backend("small").device(), {2}, {1, 2});
  e = error_from([&] { bp::sub(y, y); });
  CHECK(e.code() == bp::Errc::unsupported_op);
  BP_CHECK_CONTAINS(e.message(), "small");
  BP_CHECK_CONTAINS(e.message(), "opaque");
  BP_CHECK_CONTAINS(e.message(), "host:opaque");
}

TEST_CASE(
    "placement: axpby_ on a device without it runs in place on its fallback where y's memory is reachable, "
    "else as mul, mul, add and a copy, bit for bit as cpu's kernel") {
  const bp::Registry r = placement_registry();
  // Values whose products round: the fused kernel must round as the three ops do.
  std::vector<float> y0(1000), x0(1000);
  for (std::size_t i = 0; i < y0.size(); ++i) {
    y0[i] = 0.1f * static_cast<float>(i % 97) - 3.3f + 1e-3f * static_cast<float>(i);
    x0[i] = 1.7f - 0.013f * static_cast<float>(i % 131);
  }
  auto update = [&](const bp::Device& d) {
    const bp::Tensor y = bp::Tensor::from_vector<float>(d, {10, 100}, y0);
    const bp::Tensor x = bp::Tensor::from_vector<float>(d, {10, 100}, x0);
    bp::axpby_(y, 0.9, x, -0.1);
    bp::axpby_(y, 1.0, x, 0.3);
    return y.to_vector<float>();
  };
  const std::vector<float> fused = update(r.backend("cpu").device());
  std::vector<float> want(y0.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    // volatile: each product rounded to float, never fused into a multiply-add.
    const volatile float a = 0.9f * y0[i], b = -0.1f * x0[i];
    const volatile float y1 = a + b;
    const volatile float c = 1.0f * y1, e = 0.3f * x0[i];
    want[i] = c + e;
  }
  CHECK(std::memcmp(fused.data(), want.data(), want.size() * sizeof(float)) == 0);
  for (const char* backend : {"small", "opaque"}) {
    CAPTURE(backend);
    CHECK_FALSE(r.backend(backend).device().supports(bp::Op::axpby, bp::DType::f32));
    r.backend(backend).reset_op_fallback_stats();
    const std::vector<float> composed = update(r.backend(backend).device());
    CHECK(std::memcmp(composed.data(), fused.data(), fused.size() * sizeof(float)) == 0);
    const auto stats = r.backend(backend).op_fallback_stats();
    const bp::OpFallbackStats* axpby = find_stats(stats, bp::Op::axpby, bp::DType::f32);
    if (std::string(backend) == "small") {
      // host_visible: cpu imports y's memory and updates it there, one call
      // per update, nothing copied.
      REQUIRE(axpby != nullptr);
      CHECK(axpby->calls == 2);
      CHECK(axpby->bytes_moved() == 0);
      CHECK(find_stats(stats, bp::Op::add, bp::DType::f32) == nullptr);
    } else {
      // Not host_visible: cpu would update a copy, so it is composed on
      // opaque (which runs add and mul itself).
      CHECK(axpby == nullptr);
    }
  }
}

TEST_CASE(
    "placement: axpby_ on a tensor whose bytes live on the fallback device updates them there, and a "
    "copy of them elsewhere is not read stale") {
  const bp::Registry r = placement_registry();
  const bp::Device opaque = r.backend("opaque").device();
  const bp::Tensor t = bp::Tensor::from_vector<float>(opaque, {4}, {0, 1, 2, 3});
  const bp::Tensor y = bp::exp(t);  // opaque lacks exp: y's bytes are on cpu, y belongs to opaque
  const bp::Tensor x = bp::Tensor::from_vector<float>(opaque, {4}, {10, 20, 30, 40});
  // opaque runs add: y's bytes are copied to opaque (a replica) for it.
  const std::vector<float> before = bp::add(y, y).to_vector<float>();
  r.backend("opaque").reset_op_fallback_stats();
  bp::axpby_(y, 0.5, x, 2.0);  // on cpu, in y's own memory: no copy either way
  const auto stats = r.backend("opaque").op_fallback_stats();
  const bp::OpFallbackStats* axpby = find_stats(stats, bp::Op::axpby, bp::DType::f32);
  REQUIRE(axpby != nullptr);
  CHECK(axpby->calls == 1);
  CHECK(axpby->bytes_from_host == 0);
  const std::vector<float> y_now = y.to_vector<float>();
  const std::vector<float> xs{10, 20, 30, 40};
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(y_now[i] == doctest::Approx(0.5f * std::exp(static_cast<float>(i)) + 2.0f * xs[i]));
  }
  // The replica on opaque was dropped: add sees the update.
  const std::vector<float> after = bp::add(y, y).to_vector<float>();
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(after[i] == doctest::Approx(2 * y_now[i]));
    CHECK(after[i] != doctest::Approx(before[i]));
  }
}

TEST_CASE(
    "placement: ops find an operand's import without the lock, and it stays valid while the fallback "
    "target changes under running ops") {
  const bp::Registry r = placement_registry(true, true);
  const bp::Device small = r.backend("small").device();
  const bp::OpFallback to_cpu{bp::OpFallback::Kind::host, "cpu"}, to_cpu2{bp::OpFallback::Kind::host, "cpu2"};
  std::vector<float> v(4096);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 13) - 6.0f;
  const bp::Tensor x = bp::Tensor::from_vector<float>(small, {64, 64}, v);

  // One thread: each target imports x's memory once; a write in place
  // through one import is what the other reads (the same bytes).
  std::vector<float> twice(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) twice[i] = 2 * v[i];
  CHECK(bp::add(x, x).to_vector<float>() == twice);
  r.set_op_fallback("small", to_cpu2);
  CHECK(bp::add(x, x).to_vector<float>() == twice);
  const bp::Tensor zero = bp::zeros(small, {64, 64});
  bp::axpby_(x, 2.0, zero, 0.0);  // on cpu2, through its import of x's memory
  const auto after_axpby = r.backend("small").op_fallback_stats();
  const bp::OpFallbackStats* axpby = find_stats(after_axpby, bp::Op::axpby, bp::DType::f32);
  REQUIRE(axpby != nullptr);
  CHECK(axpby->calls == 1);
  std::vector<float> four(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) four[i] = 4 * v[i];
  r.set_op_fallback("small", to_cpu);
  CHECK(bp::add(x, x).to_vector<float>() == four);
  std::vector<float> sym(v.size());  // x's transpose (a view of the import) plus x
  for (std::size_t i = 0; i < 64; ++i)
    for (std::size_t j = 0; j < 64; ++j) sym[i * 64 + j] = twice[j * 64 + i] + twice[i * 64 + j];
  CHECK(bp::add(bp::transpose(x, 0, 1), x).to_vector<float>() == sym);
  uint64_t moved = 0;
  for (const auto& s : r.backend("small").op_fallback_stats()) moved += s.bytes_moved();
  CHECK(moved == 0);

  // Ops on x in one thread while another switches the target (and so x's
  // import) again and again: every result right, no import freed under an op
  // (AddressSanitizer), no race (ThreadSanitizer).
  std::vector<float> relu_x(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) relu_x[i] = std::max(2 * v[i], 0.0f);
  std::atomic<bool> done{false};
  std::atomic<int> wrong{0}, user_ops{0};
  std::thread user([&] {
    while (!done.load()) {
      if (bp::add(x, x).to_vector<float>() != four) wrong.fetch_add(1);
      user_ops.fetch_add(1);
    }
  });
  for (int i = 0; i < 300 || user_ops.load() < 300; ++i) {
    r.set_op_fallback("small", i % 2 == 0 ? to_cpu2 : to_cpu);
    if (bp::relu(x).to_vector<float>() != relu_x) wrong.fetch_add(1);
  }
  done.store(true);
  user.join();
  CHECK(wrong.load() == 0);
}
