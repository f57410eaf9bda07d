// Capability flags that decide something in the core: dtype flags (create,
// move, import), 'matmul', 'remote' (no DLPack export), an unavailable
// backend, device memory, and the training requirements a device must meet.
#include <backplane/abi.h>  // the plugin-side names these tests check against
#include <backplane/dlpack.hpp>

#include <dlpack/dlpack.h>

#include "test_support.hpp"

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

using namespace backplane;
using namespace bptest;

namespace {

Registry& registry() {
  static Registry r = load(config_json({
      backend_json("f32_only", "f32_only"),
      backend_json("good_c", "good_c"),
      backend_json("memory", "core_memory"),
      backend_json("refuses", "core_import_refuses"),
      backend_json("gaps", "core_training_gaps"),
      backend_json("local_gaps", "core_training_gaps", false, "\"collective_fallback\": \"local\""),
      backend_json("remote", "core_remote"),
  }));
  return r;
}
Device device_of(std::string_view backend) { return registry().backend(backend).device(0); }

struct Producer {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  int deletes = 0;
  std::function<void()> on_delete;  // what the producer does to its memory when deleted
};
void count_delete(DLManagedTensor* self) {
  auto* p = static_cast<Producer*>(self->manager_ctx);
  ++p->deletes;
  if (p->on_delete) p->on_delete();
}
std::unique_ptr<Producer> produce(void* data, std::vector<int64_t> shape, DLDataType dtype,
                                  DLDevice where = {kDLCPU, 0}) {
  auto p = std::make_unique<Producer>();
  p->shape = std::move(shape);
  DLTensor& t = p->managed.dl_tensor;
  t.data = data;
  t.device = where;
  t.ndim = static_cast<int>(p->shape.size());
  t.dtype = dtype;
  t.shape = p->shape.data();
  p->managed.manager_ctx = p.get();
  p->managed.deleter = &count_delete;
  return p;
}

// The message names the flag, the backend and the device.
void expect_dtype_refusal(const Error& e, std::string_view flag, std::string_view backend,
                          std::string_view device) {
  CHECK(e.code() == Errc::capability_missing);
  BP_CHECK_CONTAINS(e.message(), "'" + std::string(flag) + "'");
  BP_CHECK_CONTAINS(e.message(), "\"" + std::string(backend) + "\"");
  BP_CHECK_CONTAINS(e.message(), std::string(device));
}

}  // namespace

TEST_CASE("capabilities: names are abi.h's, one flag per dtype") {
  CHECK(to_string(Capability::collective) == "collective");
  CHECK(to_string(Capability::matmul) == "matmul");
  CHECK(to_string(Capability::bool_) == "bool");
  CHECK(to_string(Capability::i64) == "i64");
  CHECK(capability_from_string("f64") == Capability::f64);
  CHECK(capability_from_string("bool") == Capability::bool_);
  CHECK_FALSE(capability_from_string("int64").has_value());  // 1.x's name: i64 now
  for (DType d : {DType::f32, DType::f64, DType::i32, DType::i64, DType::bool_, DType::f16, DType::bf16,
                  DType::u8, DType::i8}) {
    CAPTURE(d);
    CHECK(static_cast<uint64_t>(capability_for(d)) == BP_CAP_DTYPE(static_cast<int32_t>(d)));
    CHECK(to_string(capability_for(d)) == to_string(d));
  }
  CHECK(static_cast<uint64_t>(capability_for(static_cast<DType>(99))) == 0);
  // Bit order; unknown bits kept but never named.
  const Capabilities caps(BP_CAP_F64 | BP_CAP_MATMUL | BP_CAP_COLLECTIVE | (UINT64_C(1) << 12));
  CHECK(caps.names() == std::vector<std::string>{"collective", "matmul", "f64"});
  CHECK(caps.to_string() == "collective, matmul, f64");
  CHECK(Capabilities().to_string() == "none");
}

TEST_CASE("capabilities: a device without a dtype's flag refuses to create a tensor of it") {
  const Device d = device_of("f32_only");
  REQUIRE_FALSE(d.capabilities().has(Capability::f64));
  expect_dtype_refusal(error_from([&] {
                         Tensor::from_vector<double>(d, {2}, {1.0, 2.0});
                       }),
                       "f64", "f32_only", "f32_only:0");
  expect_dtype_refusal(error_from([&] { Tensor::empty(d, {3}, DType::f64); }), "f64", "f32_only",
                       "f32_only:0");
  // Creation ops are refused by the flag before supports_op is asked (the
  // fixture would say yes to it).
  expect_dtype_refusal(error_from([&] { zeros(d, {3}, DType::f64); }), "f64", "f32_only", "f32_only:0");
  expect_dtype_refusal(error_from([&] { Tensor::from_vector<int64_t>(d, {1}, {7}); }), "i64", "f32_only",
                       "f32_only:0");
  // An empty tensor is refused too: the device still cannot hold the dtype.
  expect_dtype_refusal(error_from([&] { Tensor::empty(d, {0}, DType::f64); }), "f64", "f32_only",
                       "f32_only:0");
  // f32, which it flags, works.
  const Tensor t = Tensor::from_vector<float>(d, {2}, {1.5f, 2.5f});
  CHECK(add(t, t).to_vector<float>() == std::vector<float>{3.0f, 5.0f});
}

TEST_CASE("capabilities: from_dlpack refuses a dtype the device does not flag, and deletes once") {
  std::vector<double> data{1.0, 2.0};
  auto p = produce(data.data(), {2}, DLDataType{kDLFloat, 64, 1});
  const Error e = error_from([&] { from_dlpack(&p->managed, device_of("f32_only")); });
  expect_dtype_refusal(e, "f64", "f32_only", "f32_only:0");
  BP_CHECK_CONTAINS(e.message(), "from_dlpack");
  CHECK(p->deletes == 1);
}

TEST_CASE("capabilities: to() refuses a device without the tensor's dtype flag") {
  const Tensor f32 = Tensor::from_vector<float>(device_of("memory"), {2}, {1.0f, 2.0f});
  // Between two f32 devices: fine, values intact.
  CHECK(f32.to(device_of("f32_only")).to_vector<float>() == std::vector<float>{1.0f, 2.0f});
  const Tensor f64 = Tensor::from_vector<double>(device_of("gaps"), {2}, {1.0, 2.0});
  const Error e = error_from([&] { f64.to(device_of("f32_only")); });
  expect_dtype_refusal(e, "f64", "f32_only", "f32_only:0");
  BP_CHECK_CONTAINS(e.message(), "to");
}

TEST_CASE("capabilities: matmul on a device without 'matmul' is capability_missing before supports_op") {
  // f32_only answers yes to every supports_op question; the flag decides first.
  const Device d = device_of("f32_only");
  REQUIRE_FALSE(d.capabilities().has(Capability::matmul));
  CHECK_FALSE(d.supports(backplane::Op::matmul, DType::f32));  // the flag decides, as for the op
  CHECK_FALSE(d.supports(backplane::Op::add, DType::f64));     // no f64 flag: no f64 op
  CHECK(d.supports(backplane::Op::add, DType::f32));
  const Tensor a = Tensor::from_vector<float>(d, {2, 2}, {1, 2, 3, 4});
  const Error e = error_from([&] { matmul(a, a); });
  CHECK(e.code() == Errc::capability_missing);
  BP_CHECK_CONTAINS(e.message(), "'matmul'");
  BP_CHECK_CONTAINS(e.message(), "f32_only:0");
  BP_CHECK_CONTAINS(e.message(), "\"f32_only\"");
}

TEST_CASE("capabilities: a failing supports_op status is a no, logged once at debug") {
  LogCapture logs(LogLevel::debug);
  const Device d = device_of("gaps");
  CHECK_FALSE(d.supports(backplane::Op::softmax, DType::f32));
  CHECK_FALSE(d.supports(backplane::Op::softmax, DType::f32));  // cached
  CHECK(d.supports(backplane::Op::add, DType::f32));
  const auto lines = logs.at(LogLevel::debug, "softmax table is corrupt");
  CHECK(lines.size() == 1);
  if (!lines.empty()) BP_CHECK_CONTAINS(lines[0], "softmax");
  const Tensor x = Tensor::from_vector<float>(d, {2}, {1.0f, 2.0f});
  CHECK(error_from([&] { softmax(x, 0); }).code() == Errc::unsupported_op);
}

TEST_CASE("capabilities: a remote device refuses DLPack export and is never offered imported memory") {
  const Device d = device_of("remote");
  const Tensor t = Tensor::from_vector<float>(d, {2}, {1.0f, 2.0f});
  const Error e = error_from([&] { to_dlpack(t); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "remote");
  BP_CHECK_CONTAINS(e.message(), "to()");

  LogCapture logs;
  std::vector<float> data{3.0f, 4.0f};
  auto p = produce(data.data(), {2}, DLDataType{kDLFloat, 32, 1});
  const Tensor back = from_dlpack(&p->managed, d);  // copied in: the fixture's buffer_import never runs
  CHECK(p->deletes == 1);
  CHECK(back.to_vector<float>() == std::vector<float>{3.0f, 4.0f});
  CHECK(logs.at(LogLevel::error, "must never be called").empty());
}

TEST_CASE("capabilities: an import refused as unsupported copies host memory and deletes once") {
  const Device d = device_of("refuses");
  std::vector<float> data{1.0f, 2.0f, 3.0f};
  auto p = produce(data.data(), {3}, DLDataType{kDLFloat, 32, 1});
  // The producer scribbles over its memory when deleted, as freeing it would:
  // the copy must have been taken before the deleter ran.
  p->on_delete = [&] { std::fill(data.begin(), data.end(), -1.0f); };
  const Tensor t = from_dlpack(&p->managed, d);
  // The fixture never called release (a refusal leaves the memory with the
  // host): the host copied it and then ran the deleter itself, exactly once.
  CHECK(p->deletes == 1);
  CHECK(data == std::vector<float>{-1.0f, -1.0f, -1.0f});
  CHECK(t.to_vector<float>() == std::vector<float>{1.0f, 2.0f, 3.0f});
  data[0] = 100.0f;  // not seen: it is a copy
  CHECK(t.to_vector<float>() == std::vector<float>{1.0f, 2.0f, 3.0f});
  CHECK(p->deletes == 1);

  // CUDA memory cannot be copied by the host: refused, deleted once.
  auto q = produce(data.data(), {3}, DLDataType{kDLFloat, 32, 1}, {kDLCUDA, 0});
  const Error e = error_from([&] { from_dlpack(&q->managed, d); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "dl_tensor.device");
  BP_CHECK_CONTAINS(e.message(), "kDLCUDA");
  CHECK(q->deletes == 1);
}

TEST_CASE("capabilities: Device::memory reports free and total bytes, or nullopt without device_memory") {
  const Backend b = registry().backend("memory");
  REQUIRE(b.device_count() == 2);
  const std::optional<MemoryInfo> m0 = b.device(0).memory();
  REQUIRE(m0.has_value());
  CHECK(m0->total_bytes == (UINT64_C(4) << 30));
  CHECK(m0->free_bytes == (UINT64_C(3) << 30));
  const std::optional<MemoryInfo> m1 = b.device(1).memory();
  REQUIRE(m1.has_value());
  CHECK(m1->total_bytes == (UINT64_C(2) << 30));
  CHECK(m1->free_bytes == (UINT64_C(1) << 30));
  CHECK_FALSE(device_of("good_c").memory().has_value());
}

TEST_CASE("unavailable: a backend whose devices cannot be reached is kept with zero devices and the reason") {
  const Registry r =
      load(config_json({backend_json("gpu", "unavailable"), backend_json("good_c", "good_c")}));
  const Backend b = r.backend("gpu");
  CHECK(b.status() == Backend::Status::unavailable);
  CHECK_FALSE(b.loaded());
  CHECK(b.device_count() == 0);
  CHECK(b.devices().empty());
  CHECK(b.error_code() == std::optional<Errc>(Errc::backend_unavailable));
  BP_CHECK_CONTAINS(b.error(), "driver not found: libfixture_driver.so.1");
  CHECK(b.version() == "1.2.3");  // the plugin loaded and answered
  const Error e = error_from([&] { b.device(0); });
  CHECK(e.code() == Errc::backend_unavailable);
  BP_CHECK_CONTAINS(e.message(), "\"gpu\" is unavailable");
  BP_CHECK_CONTAINS(e.message(), "driver not found");
  // The others are unaffected, and the default skips it.
  expect_adds(r.backend("good_c").device(0));
  CHECK(r.default_backend().name() == "good_c");
}

TEST_CASE("unavailable: a required unavailable backend fails from_config naming it and the reason") {
  const std::string json =
      config_json({backend_json("gpu", "unavailable", true), backend_json("good_c", "good_c")});
  const Error e = error_from([&] { load(json, RequiredPolicy::throw_on_failure); });
  CHECK(e.code() == Errc::backend_unavailable);
  BP_CHECK_CONTAINS(e.message(), "\"gpu\" is unavailable");
  BP_CHECK_CONTAINS(e.message(), "driver not found: libfixture_driver.so.1");
  // Not required: loads.
  CHECK_NOTHROW(
      load(config_json({backend_json("gpu", "unavailable", false)}), RequiredPolicy::throw_on_failure));
}

TEST_CASE("requirements: the training list covers the forward, backward and evaluation ops") {
  const TrainingRequirements req = training_requirements(DType::f32);
  auto has = [&](Op op, DType dtype) {
    for (const OpRequirement& r : req.ops)
      if (r.op == op && r.dtype == dtype) return true;
    return false;
  };
  for (Op op : {Op::matmul, Op::add, Op::relu, Op::log_softmax, Op::gather, Op::mean, Op::sum, Op::copy,
                Op::fill, Op::rand_uniform, Op::cast, Op::argmax}) {
    CAPTURE(op);
    CHECK(has(op, DType::f32));
  }
  CHECK(has(Op::arange, DType::i64));
  CHECK(has(Op::cast, DType::bool_));
  for (std::size_t i = 0; i < req.ops.size(); ++i)
    for (std::size_t j = i + 1; j < req.ops.size(); ++j)
      CHECK_FALSE((req.ops[i].op == req.ops[j].op && req.ops[i].dtype == req.ops[j].dtype));
  const auto caps = req.capabilities;
  for (Capability c : {Capability::f32, Capability::i64, Capability::bool_, Capability::matmul})
    CHECK(std::find(caps.begin(), caps.end(), c) != caps.end());
}

TEST_CASE("requirements: a device without training's flags is refused, naming every missing flag") {
  // good_c: f32 only, no matmul.
  const Error e = error_from([] { require_training_support(device_of("good_c"), DType::f32); });
  CHECK(e.code() == Errc::capability_missing);
  for (const char* flag : {"matmul", "i64", "bool", "f64"}) BP_CHECK_CONTAINS(e.message(), flag);
  BP_CHECK_CONTAINS(e.message(), "good_c:0");
}

TEST_CASE("requirements: a device missing ops is refused with every missing (op, dtype) at once") {
  const Error e = error_from([] { require_training_support(device_of("gaps"), DType::f32); });
  CHECK(e.code() == Errc::unsupported_op);
  for (const char* missing :
       {"matmul on f32", "log_softmax on f32", "gather on f32", "mean on f32", "rand_uniform on f32",
        "arange on i64", "eq on i64", "cast on bool", "sum on f64"})
    BP_CHECK_CONTAINS(e.message(), missing);
  // What it has is not listed.
  CHECK(e.message().find("add on f32") == std::string::npos);
  CHECK(e.message().find("fill on f32") == std::string::npos);
  CHECK(e.message().find("missing capabilities") == std::string::npos);
}

TEST_CASE("requirements: more than one rank needs 'collective' unless the backend's fallback covers it") {
  const Error e = error_from([] { require_training_support(device_of("gaps"), DType::f32, 2); });
  CHECK(e.code() == Errc::capability_missing);
  BP_CHECK_CONTAINS(e.message(), "collective");
  BP_CHECK_CONTAINS(e.message(), "collective_fallback");
  BP_CHECK_CONTAINS(e.message(), "log_softmax on f32");  // and the ops, in the same message
  // With collective_fallback "local" the ranks train without it: only the ops are missing.
  const Error local = error_from([] { require_training_support(device_of("local_gaps"), DType::f32, 2); });
  CHECK(local.code() == Errc::unsupported_op);
  CHECK(local.message().find("missing capabilities") == std::string::npos);
}

TEST_CASE("requirements: plain SGD does not need sqrt, Adam and the both-optimizers list do") {
  auto has_sqrt = [](const TrainingRequirements& req) {
    return std::any_of(req.ops.begin(), req.ops.end(),
                       [](const OpRequirement& r) { return r.op == Op::sqrt; });
  };
  CHECK_FALSE(has_sqrt(training_requirements(TrainingSetup{DType::f32, TrainingOptimizer::sgd})));
  CHECK(has_sqrt(training_requirements(TrainingSetup{DType::f32, TrainingOptimizer::adam})));
  CHECK(has_sqrt(training_requirements(DType::f32)));
  // gaps lacks sqrt: named for Adam only.
  const TrainingSupport sgd = training_support(device_of("gaps"), {DType::f32, TrainingOptimizer::sgd});
  CHECK_FALSE(sgd.ok());
  CHECK(sgd.message.find("sqrt") == std::string::npos);
  const TrainingSupport adam = training_support(device_of("gaps"), {DType::f32, TrainingOptimizer::adam});
  BP_CHECK_CONTAINS(adam.message, "sqrt on f32 (Adam)");
}

TEST_CASE("requirements: the ops on a dtype whose flag is missing are named with the flag, at once") {
  // good_c: f32 only, no matmul.
  const TrainingSupport s = training_support(device_of("good_c"), {DType::f32, TrainingOptimizer::sgd});
  CHECK_FALSE(s.ok());
  CHECK(s.error_code == Errc::capability_missing);
  CHECK(s.fallback_device.empty());
  CHECK_FALSE(s.falls_back());
  for (const char* part :
       {"missing capabilities: i64, bool, f64, matmul", "arange on i64", "eq on i64", "cast on bool",
        "sum on f64", "matmul on f32 (nn::Linear; no 'matmul' flag",
        "gather on f32 (nn::cross_entropy; no 'i64' flag", "\"op_fallback\": \"host:<backend>\""})
    BP_CHECK_CONTAINS(s.message, part);
  const Error e = error_from([] { require_training_support(device_of("good_c"), DType::f32); });
  CHECK(e.code() == Errc::capability_missing);
  CHECK(e.message() == training_support(device_of("good_c"), {DType::f32}).message);
}

TEST_CASE(
    "requirements: with no other backend in the config, the refusal says what to add, not host:<backend>") {
  const Registry alone = load(config_json({backend_json("good_c", "good_c")}));
  const TrainingSupport s = training_support(alone.backend("good_c").device(0), {DType::f32});
  CHECK_FALSE(s.ok());
  BP_CHECK_CONTAINS(s.message, "or add a backend that runs them (\"cpu\", library \"backplane_cpu\") to ");
  BP_CHECK_CONTAINS(s.message, "and set \"op_fallback\": \"host:cpu\" at backends[0]");
  CHECK(s.message.find("host:<backend>") == std::string::npos);
}

TEST_CASE("requirements: one rank needs no 'collective', whatever the collective_fallback") {
  const TrainingSupport one = training_support(device_of("gaps"), {DType::f32, TrainingOptimizer::any, 1});
  CHECK(std::find(one.missing_capabilities.begin(), one.missing_capabilities.end(), Capability::collective) ==
        one.missing_capabilities.end());
  CHECK(one.message.find("collective") == std::string::npos);
  const TrainingSupport two = training_support(device_of("gaps"), {DType::f32, TrainingOptimizer::any, 2});
  CHECK(std::find(two.missing_capabilities.begin(), two.missing_capabilities.end(), Capability::collective) !=
        two.missing_capabilities.end());
}

TEST_CASE("requirements: with op_fallback, what the fallback device covers is reported, not refused") {
  const Registry r = load(config_json(
      {backend_json("cpu", "backplane_cpu", true),
       backend_json(
           "small", "backplane_cpu", false,
           "\"options\": {\"ops\": [\"fill\", \"copy\", \"matmul\"], \"dtypes\": [\"f32\"], "
           "\"collective\": false}, \"op_fallback\": \"host:cpu\", \"collective_fallback\": \"host:cpu\""),
       backend_json(
           "half", "backplane_cpu", false,
           "\"options\": {\"ops\": [\"fill\", \"copy\", \"add\"], \"dtypes\": [\"f32\", \"i64\"]}")}));
  const Device small = r.backend("small").device(0);
  const TrainingSetup setup{DType::f32, TrainingOptimizer::sgd, 2};
  const TrainingSupport s = training_support(small, setup);
  INFO(s.message);
  CHECK(s.ok());
  CHECK(s.message.empty());
  CHECK(s.falls_back());
  CHECK(s.fallback_device == "cpu:0");
  for (Capability c : {Capability::i64, Capability::bool_, Capability::f64})
    CHECK(std::find(s.fallback_capabilities.begin(), s.fallback_capabilities.end(), c) !=
          s.fallback_capabilities.end());
  auto falls = [&](Op op, DType d) {
    return std::any_of(s.fallback_ops.begin(), s.fallback_ops.end(),
                       [&](const OpRequirement& o) { return o.op == op && o.dtype == d; });
  };
  CHECK(falls(Op::add, DType::f32));
  CHECK(falls(Op::relu, DType::f32));
  CHECK(falls(Op::arange, DType::i64));
  CHECK_FALSE(falls(Op::matmul, DType::f32));  // the device runs it
  CHECK_FALSE(falls(Op::fill, DType::f32));
  CHECK_FALSE(falls(Op::sqrt, DType::f32));  // SGD
  const std::string line = s.fallback_summary();
  BP_CHECK_CONTAINS(line, "will run on cpu:0 for small:0: ");
  BP_CHECK_CONTAINS(line, "add/f32");
  BP_CHECK_CONTAINS(line, "cast/bool");
  CHECK(line.find("cast/f32") == std::string::npos);  // a cast is filed under its source dtype
  BP_CHECK_CONTAINS(line, "held there: i64, bool, f64 tensors");
  CHECK_NOTHROW(require_training_support(small, setup));

  // A fallback that lacks what the device lacks: only that is refused, and the message says so.
  r.set_op_fallback("small", OpFallback{OpFallback::Kind::host, "half"});
  const TrainingSupport h = training_support(small, {DType::f32, TrainingOptimizer::sgd, 1});
  CHECK_FALSE(h.ok());
  CHECK(h.fallback_device == "half:0");
  CHECK(h.error_code == Errc::capability_missing);  // bool and f64: neither device holds them
  BP_CHECK_CONTAINS(h.message, "missing capabilities: bool, f64");
  BP_CHECK_CONTAINS(h.message, "relu on f32");
  BP_CHECK_CONTAINS(h.message, "op_fallback \"host:half\"");
  BP_CHECK_CONTAINS(h.message, "which lacks these too");
  CHECK(h.message.find("add on f32") == std::string::npos);  // half runs it
  CHECK(std::find(h.fallback_capabilities.begin(), h.fallback_capabilities.end(), Capability::i64) !=
        h.fallback_capabilities.end());

  // Off: everything the device lacks is missing again.
  r.set_op_fallback("small", OpFallback{});
  const TrainingSupport off = training_support(small, {DType::f32, TrainingOptimizer::sgd, 1});
  CHECK_FALSE(off.falls_back());
  CHECK(off.fallback_device.empty());
  BP_CHECK_CONTAINS(off.message, "add on f32");
  BP_CHECK_CONTAINS(off.message, "missing capabilities: i64, bool, f64");
}

TEST_CASE("requirements: the cpu plugin meets everything training needs, on one rank and on many") {
  const Registry r = load(config_json({backend_json("cpu", "backplane_cpu", true)}));
  const Device cpu = r.backend("cpu").device(0);
  CHECK_NOTHROW(require_training_support(cpu, DType::f32));
  CHECK_NOTHROW(require_training_support(cpu, DType::f32, 4));
  CHECK_NOTHROW(require_training_support(cpu, DType::f64));
  CHECK(error_from([] { require_training_support(Device(), DType::f32); }).code() == Errc::invalid_argument);
}
