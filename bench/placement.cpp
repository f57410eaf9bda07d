// Op placement's cost on the training step: the digits MLP step (64-128-10,
// batch 32, cross-entropy, SGD with momentum) on a partial backend -- the cpu
// plugin restricted to fill, copy and matmul on f32, with op_fallback
// "host:cpu" -- against the same step on the whole cpu plugin, interleaved
// in one run. Both are host_visible, so placement copies nothing (imports
// only): the ratio is the price of the slow path (the decision, replicas,
// the report's counters). Target <= 1.15x. Both backends flush subnormal
// floats ("flush_denormals"): the step trains on one fixed batch, so after a
// few hundred steps the momentum buffers are subnormal, and on x86 the
// microcode assists that costs would be timed instead of placement (and
// unevenly: the partial backend composes axpby from three ops).
//
//   bench_placement [steps]       (default 400 per measurement)
//   bench_placement --steps N native|placed
//                                 only N steps of one side, untimed, for counting
//                                 instructions under valgrind (docs/benchmarks.md)
#include "bench_util.hpp"

#include <backplane/backplane.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace bp = backplane;

namespace {

struct Step {
  bp::nn::Linear l1, l2;
  bp::nn::SGD opt;
  bp::Tensor x, y;

  explicit Step(const bp::Device& d)
      : l1(d, 64, 128, 1), l2(d, 128, 10, 2), opt(params(), 0.1, 0.9), x(input(d)), y(labels(d)) {}

  std::vector<bp::Tensor> params() const {
    std::vector<bp::Tensor> p = l1.parameters();
    for (const bp::Tensor& t : l2.parameters()) p.push_back(t);
    return p;
  }
  static bp::Tensor input(const bp::Device& d) {
    std::vector<float> v(32 * 64);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919) % 17) / 16.0f;
    return bp::Tensor::from_vector<float>(d, {32, 64}, v);
  }
  static bp::Tensor labels(const bp::Device& d) {
    std::vector<int64_t> v(32);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i % 10);
    return bp::Tensor::from_vector<int64_t>(d, {32}, v);
  }
  float run() {
    const bp::Tensor loss = bp::nn::cross_entropy(l2(bp::relu(l1(x))), y);
    opt.step(loss.backward());
    return loss.to_vector<float>()[0];
  }
};

}  // namespace

int main(int argc, char** argv) {
  // `--steps N native|placed`: N steps of one side and nothing else (the
  // difference between two N, divided by theirs, is the count per step).
  const bool count_only = argc > 1 && std::string(argv[1]) == "--steps";
  const long count_steps = count_only && argc > 3 ? std::atol(argv[2]) : -1;
  const std::string count_side = count_only && argc > 3 ? argv[3] : "";
  if (count_only && (count_steps < 0 || (count_side != "native" && count_side != "placed"))) {
    std::fprintf(stderr, "usage: bench_placement [steps] | bench_placement --steps N native|placed\n");
    return 2;
  }
  const int steps = argc > 1 && !count_only ? std::atoi(argv[1]) : 400;
  const std::string lib = std::string(BP_BENCH_PLUGIN_DIR) + "/libbackplane_cpu.so";
  const std::string json =
      R"({"schema_version": 1, "backends": [
    {"name": "cpu", "library": ")" +
      lib + R"(", "options": {"threads": 1, "flush_denormals": true}},
    {"name": "small", "library": ")" +
      lib +
      R"(", "options": {"threads": 1, "flush_denormals": true, "ops": ["fill", "copy", "matmul"], "dtypes": ["f32"]},
     "op_fallback": "host:cpu"}]})";
  const bp::Registry registry = bp::Registry::from_json(json, ".", "bench_placement");
  bp::set_log_level(bp::LogLevel::warning);  // the first fallback of each op is logged at info
  Step native(registry.backend("cpu").device());
  Step placed(registry.backend("small").device());
  if (count_only) {
    Step& side = count_side == "native" ? native : placed;
    for (long i = 0; i < count_steps; ++i) side.run();
    return 0;
  }

  // Same seeds, same data: the two must compute the same losses.
  for (int i = 0; i < 20; ++i) {
    const float a = native.run(), b = placed.run();
    if (std::abs(a - b) > 1e-5f * std::max(1.0f, std::abs(a))) {
      std::fprintf(stderr, "bench_placement: losses differ at step %d: %.7g (cpu) vs %.7g (placed)\n", i, a,
                   b);
      return 1;
    }
  }
  std::vector<double> ratio, native_us, placed_us;
  for (int round = 0; round < 7; ++round) {
    const double n = bench::ns_per_call([&] { native.run(); }, steps, 1);
    const double p = bench::ns_per_call([&] { placed.run(); }, steps, 1);
    native_us.push_back(n / 1e3);
    placed_us.push_back(p / 1e3);
    ratio.push_back(p / n);
  }
  const auto stats = registry.backend("small").op_fallback_stats();
  uint64_t calls = 0, bytes = 0;
  for (const auto& s : stats) calls += s.calls, bytes += s.bytes_moved();
  std::printf(
      "training step, MLP 64-128-10, batch 32, SGD momentum, 1 thread (median of 7 rounds of %d steps)\n",
      steps);
  std::printf("  cpu (native)                         %8.1f us/step\n", bench::median(native_us));
  std::printf("  small (fill/copy/matmul) + host:cpu  %8.1f us/step\n", bench::median(placed_us));
  std::printf("  placed / native                      %8.3fx   (target <= 1.15)\n", bench::median(ratio));
  std::printf("  fallback: %zu (op, dtype) pairs, %llu calls, %llu bytes moved\n", stats.size(),
              static_cast<unsigned long long>(calls), static_cast<unsigned long long>(bytes));
  return 0;
}
