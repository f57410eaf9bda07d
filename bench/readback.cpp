// Reading results back from a host_visible device (the cpu backend) through
// the public API, against a plain copy of the same bytes made in the same run:
//
//   Tensor::to_vector<float>()            vs  std::vector<float>(first, last)
//   read_into, fresh (untouched) memory   vs  std::memcpy into fresh memory
//   read_into, memory written before      vs  std::memcpy into that memory
//
// for a 1024x1024 f32 result (4 MiB: the cpu plugin's threaded copy) and a
// 256x256 one (256 KiB: its inline copy). Each round times every contender
// once, in an order that rotates between rounds, so the load of a shared
// machine falls on all of them alike; the figure is the median over the
// rounds. Reading back should cost one copy: target ratio <= 1.20.
//
//   bench_readback [rounds]       (default 201)
#include "bench_util.hpp"

#include <backplane/backplane.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace bp = backplane;

namespace {

// Memory as a caller would hand it to read_into: allocated, never touched.
std::unique_ptr<float[]> fresh(std::size_t n) { return std::unique_ptr<float[]>(new float[n]); }

volatile float sink = 0;  // keeps each copy observable

struct Contender {
  Contender(const char* n, std::function<double()> r) : name(n), run(std::move(r)) {}
  const char* name;
  std::function<double()> run;  // one timed call, in ns; setup and teardown outside the timer
  std::vector<double> ns;
};

void measure(const bp::Device& dev, int64_t rows, int64_t cols, int rounds) {
  const auto n = static_cast<std::size_t>(rows * cols);
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1021) * 0.25f;
  // Contiguous, on the device, holding the same values as `host`.
  const bp::Tensor t = bp::Tensor::from_vector<float>(dev, {rows, cols}, host);
  if (t.to_vector<float>() != host) {
    std::fprintf(stderr, "bench_readback: to_vector gave wrong values\n");
    std::exit(1);
  }
  const float* src = host.data();
  std::vector<float> warm(n, 1.0f);

  std::vector<Contender> c;
  c.emplace_back("std::vector<float>(first, last)", [&] {
    const double t0 = bench::now_ns();
    std::vector<float> v(src, src + n);
    const double dt = bench::now_ns() - t0;
    sink = v[n / 2];
    return dt;
  });
  c.emplace_back("Tensor::to_vector<float>()", [&] {
    const double t0 = bench::now_ns();
    std::vector<float> v = t.to_vector<float>();
    const double dt = bench::now_ns() - t0;
    sink = v[n / 2];
    return dt;
  });
  c.emplace_back("memcpy into fresh memory", [&] {
    auto d = fresh(n);
    const double t0 = bench::now_ns();
    std::memcpy(d.get(), src, n * sizeof(float));
    const double dt = bench::now_ns() - t0;
    sink = d[n / 2];
    return dt;
  });
  c.emplace_back("read_into fresh memory", [&] {
    auto d = fresh(n);
    const double t0 = bench::now_ns();
    t.read_into(bp::DType::f32, d.get(), n);
    const double dt = bench::now_ns() - t0;
    sink = d[n / 2];
    return dt;
  });
  c.emplace_back("memcpy into written memory", [&] {
    const double t0 = bench::now_ns();
    std::memcpy(warm.data(), src, n * sizeof(float));
    const double dt = bench::now_ns() - t0;
    sink = warm[n / 2];
    return dt;
  });
  c.emplace_back("read_into written memory", [&] {
    const double t0 = bench::now_ns();
    t.read_into(bp::DType::f32, warm.data(), n);
    const double dt = bench::now_ns() - t0;
    sink = warm[n / 2];
    return dt;
  });

  for (Contender& x : c) x.run();  // warm-up: first touches, the engine's threads
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < c.size(); ++k) {
      Contender& x = c[(k + static_cast<std::size_t>(r)) % c.size()];
      x.ns.push_back(x.run());
    }

  std::printf("%lldx%lld f32 (%zu KiB), median of %d rounds:\n", static_cast<long long>(rows),
              static_cast<long long>(cols), n * sizeof(float) / 1024, rounds);
  for (std::size_t k = 0; k < c.size(); k += 2) {
    const double ref = bench::median(c[k].ns), got = bench::median(c[k + 1].ns);
    std::printf("  %-28s %9.1f us   %-32s %9.1f us   ratio %.2f (target <= 1.20)\n", c[k + 1].name, got / 1e3,
                c[k].name, ref / 1e3, got / ref);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 201;
  try {
    bp::Registry reg = bp::Registry::from_json(
        R"({"schema_version": 1, "backends": [{"name": "cpu", "library": "backplane_cpu", )"
        R"("required": true}]})",
        BP_BENCH_PLUGIN_DIR, "bench");
    const bp::Device dev = reg.backend("cpu").device(0);
    std::printf("reading back from %s (%s)\n", dev.id().c_str(), dev.name().c_str());
    measure(dev, 1024, 1024, rounds);
    measure(dev, 256, 256, rounds);
  } catch (const bp::Error& e) {
    std::fprintf(stderr, "bench_readback: %s\n", e.what());
    return 1;
  }
  return 0;
}
