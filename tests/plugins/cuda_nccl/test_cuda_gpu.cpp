// The cuda backend through the core's API. Without a GPU (CI) the first case
// checks that the plugin loads and reports zero devices with the reason, and
// that a required cuda backend fails naming it; every other case needs a GPU
// and exits with 77 (ctest: skipped) saying why. With a GPU they compare ops
// against the cpu backend, run the conformance suite, check that a gather
// index out of range surfaces as invalid_argument at the next sync (and the
// device keeps working), share memory through DLPack, and all-reduce over
// NCCL (2 ranks when 2 GPUs exist, else 1).
#include <doctest/doctest.h>

#include <dlpack/dlpack.h>
#include <unistd.h>
#include <backplane/backplane.hpp>
#include <backplane/conformance.hpp>
#include <backplane/dlpack.hpp>
#include <backplane/ops.hpp>
#include <backplane/process_group.hpp>
#include <backplane/rendezvous.hpp>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace backplane;

std::string config(bool required) {
  return std::string(R"({"schema_version": 1, "plugin_dirs": [")") + BP_TEST_PLUGIN_DIR +
         R"("], "default_backend": "cpu", "backends": [
           {"name": "cpu", "library": "backplane_cpu", "required": true},
           {"name": "cuda", "library": "backplane_cuda_nccl", "required": )" +
         (required ? "true" : "false") + "}]}";
}

Registry registry() { return Registry::from_json(config(false), BP_TEST_PLUGIN_DIR); }

// Exits the test process with ctest's skip code when there is no GPU.
Backend require_gpu() {
  static Registry r = registry();
  Backend cuda = r.backend("cuda");
  if (cuda.status() != Backend::Status::loaded || cuda.device_count() == 0) {
    std::cout << "SKIP: no CUDA device: " << (cuda.error().empty() ? "0 devices" : cuda.error()) << std::endl;
    std::exit(77);
  }
  return cuda;
}

std::vector<double> as_f64(const Tensor& t) {
  const Tensor c = backplane::cast(t, DType::f64);
  return c.to_vector<double>();
}

void expect_close(const Tensor& got, const Tensor& want, double rel, double abs) {
  const std::vector<double> g = as_f64(got);
  const std::vector<double> w = as_f64(want);
  REQUIRE(g.size() == w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << ", want " << w[i]);
    REQUIRE(std::fabs(g[i] - w[i]) <= abs + rel * std::fabs(w[i]));
  }
}

TEST_CASE("cuda.load: the plugin loads - without a GPU it reports 0 devices and the reason") {
  Registry r = registry();
  Backend cuda = r.backend("cuda");
  REQUIRE(cuda.status() != Backend::Status::failed);
  if (cuda.status() == Backend::Status::unavailable) {
    CHECK(cuda.device_count() == 0);
    const std::string& why = cuda.error();
    CHECK((why.find("CUDA driver not found") != std::string::npos ||
           why.find("no CUDA GPU found") != std::string::npos ||
           why.find("CUDA initialisation failed") != std::string::npos));
    // Required, the same machine fails the registry and names the reason.
    try {
      Registry::from_json(config(true), BP_TEST_PLUGIN_DIR);
      FAIL("a required but unavailable cuda backend was accepted");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("cuda") != std::string::npos);
    }
  } else {
    REQUIRE(cuda.device_count() > 0);
    const Device d = cuda.device(0);
    CHECK(d.capabilities().has(Capability::async));
    CHECK_FALSE(d.capabilities().has(Capability::host_visible));
    CHECK(d.attributes().count("compute_capability") == 1);
    CHECK(d.memory().has_value());
  }
}

TEST_CASE("cuda.ops: elementwise reductions softmax and matmul match the cpu backend") {
  const Device gpu = require_gpu().device(0);
  const Device cpu = registry().backend("cpu").device(0);
  for (const DType dt : {DType::f32, DType::f64}) {
    const Tensor a = cast(randn(cpu, Shape({64, 33}), 1), dt);
    const Tensor b = cast(randn(cpu, Shape({64, 33}), 2), dt);
    const Tensor ga = a.to(gpu);
    const Tensor gb = b.to(gpu);
    const double rel = dt == DType::f32 ? 1e-5 : 1e-12;
    expect_close(add(ga, gb), add(a, b), rel, 0);
    expect_close(mul(ga, transpose(transpose(gb, 0, 1), 0, 1)), mul(a, b), rel, 0);
    expect_close(exp(ga), exp(a), rel * 4, 1e-12);
    expect_close(sum(ga, 1, true), sum(a, 1, true), rel * 10, 1e-6);
    expect_close(sum(ga, 0, false), sum(a, 0, false), rel * 10, 1e-6);
    expect_close(softmax(ga, 1), softmax(a, 1), rel * 10, 1e-7);
    expect_close(log_softmax(ga, 0), log_softmax(a, 0), rel * 10, 1e-6);
    expect_close(matmul(ga, transpose(gb, 0, 1)), matmul(a, transpose(b, 0, 1)), rel * 10, 1e-5);
    expect_close(argmax(ga, 1, false), argmax(a, 1, false), 0, 0);
  }
  // Broadcasting, integer arithmetic and a strided copy.
  const Tensor i = arange(cpu, 0, 24, 1, DType::i64);
  const Tensor gi = i.to(gpu);
  expect_close(mul(reshape(gi, {4, 6}), reshape(gi, {4, 6})), mul(reshape(i, {4, 6}), reshape(i, {4, 6})), 0,
               0);
  expect_close(contiguous(transpose(reshape(gi, {4, 6}), 0, 1)),
               contiguous(transpose(reshape(i, {4, 6}), 0, 1)), 0, 0);
  // The same seed gives the same values on the device.
  expect_close(rand_uniform(gpu, Shape({1000}), 7), rand_uniform(gpu, Shape({1000}), 7), 0, 0);
}

TEST_CASE("cuda.conformance: the suite passes on cuda:0") {
  const Device gpu = require_gpu().device(0);
  const std::vector<conformance::CaseResult> results = conformance::run_conformance(gpu);
  int failed = 0;
  for (const auto& r : results) {
    if (r.outcome != conformance::CaseResult::Outcome::fail) continue;
    ++failed;
    MESSAGE(std::string(r.op + " " + r.dtype + " " + r.case_name + ": " + r.detail));
  }
  CHECK(failed == 0);
  CHECK(results.size() > 100);
}

TEST_CASE("cuda.errors: a gather index out of range is invalid_argument at the next sync naming gather") {
  const Device gpu = require_gpu().device(0);
  const Device cpu = registry().backend("cpu").device(0);
  const Tensor x = randn(gpu, Shape({3, 5}), 3);
  const Tensor bad = Tensor::from_vector<int64_t>(cpu, Shape({3, 1}), {0, 7, 1}).to(gpu);
  try {
    const Tensor g = gather(x, 1, bad);
    gpu.synchronize();
    FAIL("an index out of range was not reported");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(std::string(e.what()).find("gather") != std::string::npos);
    CHECK(std::string(e.what()).find("index 7") != std::string::npos);
  }
  // The context survived: the device still computes.
  const Tensor good = Tensor::from_vector<int64_t>(cpu, Shape({3, 1}), {0, 4, 1}).to(gpu);
  CHECK(gather(x, 1, good).to(cpu).numel() == 3);
}

TEST_CASE("cuda.dlpack: export and import share device memory (kDLCUDA)") {
  const Device gpu = require_gpu().device(0);
  const Tensor t = arange(gpu, 0, 10, 1, DType::f32);
  DLManagedTensor* m = to_dlpack(t);
  REQUIRE(m != nullptr);
  CHECK(m->dl_tensor.device.device_type == kDLCUDA);
  const Tensor back = from_dlpack(m, gpu);
  back.copy_(add(back, ones(gpu, Shape({10}), DType::f32)));
  gpu.synchronize();
  CHECK(t.to_vector<float>()[3] == 4.0f);  // the same memory
}

TEST_CASE("cuda.nccl: all_reduce across the ranks (2 GPUs: 2 ranks - else 1)") {
  const Backend cuda = require_gpu();
  const int ranks = cuda.device_count() >= 2 ? 2 : 1;
  const uint16_t port = static_cast<uint16_t>(20000 + getpid() % 20000);
  std::vector<std::string> errors(ranks);
  std::vector<double> results(ranks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        const Rendezvous rv(r, ranks, "127.0.0.1", port, std::chrono::seconds(60));
        const Device d = cuda.device(r);
        ProcessGroup pg = ProcessGroup::create(d, rv);
        const Tensor t = full(d, Shape({1000}), r + 1.0, DType::f32);
        const Tensor s = pg.all_reduce(t, ReduceOp::sum);
        const Tensor m = pg.all_reduce(cast(t, DType::bf16), ReduceOp::mean);
        pg.barrier();
        results[r] = s.to_vector<float>()[999] + 1000 * cast(m, DType::f32).to_vector<float>()[0];
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  const double sum = ranks == 2 ? 3.0 : 1.0;
  const double mean = ranks == 2 ? 1.5 : 1.0;
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].empty());
    CHECK(results[r] == doctest::Approx(sum + 1000 * mean));
  }
}

}  // namespace
