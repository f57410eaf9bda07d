// Throughput of the cpu backend's big ops through backplane, each next to a
// reference computed in the same run on the same pre-touched data:
//   add 16M f32            vs an OpenMP `parallel for simd` loop     (target >= 0.90)
//   matmul 1024^3 f32      vs a direct cblas_sgemm                   (target >= 0.95)
//   sum of 16M f32         vs a hand-written OpenMP reduction        (target >= 0.90)
//   softmax 4096x1024 f32  vs add over the same bytes (time ratio)   (target <= 1.5)
//     and with logits spread over 0..500 (exp underflows for most entries) vs both
//     add and ordinary logits                                        (target <= 1.5)
// Where a python3 with torch is found, PyTorch's add of 16M f32 is printed too.
// The references are written here (the OpenMP loops) or come from the system's
// OpenBLAS (cblas_sgemm); backplane is reached only through its public host API.
#include "bench_util.hpp"

#include <backplane/backplane.hpp>

#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace bp = backplane;

namespace {

// Median seconds of `reps` runs of fn (after one warm-up run).
template <class Fn>
double seconds(Fn&& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = bench::now_ns();
    fn();
    t.push_back((bench::now_ns() - t0) / 1e9);
  }
  return bench::median(t);
}

double torch_add_seconds() {
  return bench::torch_measure(
      "a=torch.rand(1<<24);b=torch.rand(1<<24);c=torch.empty(1<<24);torch.add(a,b,out=c);"
      "import statistics;print(statistics.median(timeit.repeat(lambda: "
      "torch.add(a,b,out=c),number=5,repeat=9))/5)");
}

void report(const char* what, double backplane_s, double ref_s, const char* ref_name, double target,
            bool higher) {
  const double ratio = ref_s / backplane_s;  // throughput ratio backplane / reference
  std::printf("%-26s backplane %9.3f ms   %-28s %9.3f ms   throughput ratio %.2f (target %s %.2f)\n", what,
              backplane_s * 1e3, ref_name, ref_s * 1e3, ratio, higher ? ">=" : "<=", target);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 9;
  try {
    bp::Registry reg = bp::Registry::from_json(
        R"({"schema_version": 1, "backends": [{"name": "cpu", "library": "backplane_cpu", )"
        R"("required": true}]})",
        BP_BENCH_PLUGIN_DIR, "bench");
    const bp::Device dev = reg.backend("cpu").device(0);
    std::printf("cpu backend: %s; OpenMP threads %d; median of %d runs\n", dev.name().c_str(),
                omp_get_max_threads(), reps);

    // ---- add, 16M f32 ----------------------------------------------------------
    const int64_t n = int64_t{1} << 24;
    std::vector<float> ha(n), hb(n), hc(n);
    for (int64_t i = 0; i < n; ++i) ha[i] = static_cast<float>(i % 1000) * 0.5f, hb[i] = 1.0f;
    const bp::Tensor a = bp::Tensor::from_vector(dev, {n}, ha);
    const bp::Tensor b = bp::Tensor::from_vector(dev, {n}, hb);
    float* pa = ha.data();
    float* pb = hb.data();
    float* pc = hc.data();
    const double ref_add = seconds(
        [&] {
#pragma omp parallel for simd
          for (int64_t i = 0; i < n; ++i) pc[i] = pa[i] + pb[i];
        },
        reps);
    const double bp_add = seconds([&] { bp::Tensor c = a + b; }, reps);
    report("add 16M f32", bp_add, ref_add, "OpenMP loop", 0.90, true);
    const double torch_add = torch_add_seconds();
    if (torch_add > 0) {
      std::printf(
          "%-26s PyTorch torch.add(out=) %9.3f ms   backplane/PyTorch throughput %.2f (target >= 1.00)\n", "",
          torch_add * 1e3, torch_add / bp_add);
    } else {
      std::printf("%-26s PyTorch: not measured (no python3 with torch; Debian: python3-torch)\n", "");
    }

    // ---- sum, 16M f32 ----------------------------------------------------------
    volatile float sink = 0;
    const double ref_sum = seconds(
        [&] {
          float acc = 0;
#pragma omp parallel for simd reduction(+ : acc)
          for (int64_t i = 0; i < n; ++i) acc += pa[i];
          sink = acc;
        },
        reps);
    const double ref_sum_d = seconds(
        [&] {
          double acc = 0;
#pragma omp parallel for simd reduction(+ : acc)
          for (int64_t i = 0; i < n; ++i) acc += pa[i];
          sink = static_cast<float>(acc);
        },
        reps);
    const double bp_sum = seconds([&] { sink = bp::sum(a).to_vector<float>()[0]; }, reps);
    report("sum 16M f32", bp_sum, ref_sum, "OpenMP reduction (f32 acc)", 0.90, true);
    report("", bp_sum, ref_sum_d, "OpenMP reduction (f64 acc)", 0.90, true);

    // ---- softmax rows of 4096x1024 f32 vs add over the same bytes ---------------
    // Logits as a classifier produces them (standard normal), and a wide-range
    // variant whose exp underflows for most entries (a harder case for exp).
    const bp::Tensor xs = bp::randn(dev, {4096, 1024}, 7);
    const bp::Tensor ys = bp::randn(dev, {4096, 1024}, 8);
    const bp::Tensor wide = bp::contiguous(bp::slice(bp::reshape(a, {4096, 4096}), 1, 0, 1024));  // 0..500
    const double add_same = seconds([&] { bp::Tensor c = xs + ys; }, reps);
    const double bp_softmax = seconds([&] { bp::Tensor s = bp::softmax(xs, 1); }, reps);
    const double bp_softmax_wide = seconds([&] { bp::Tensor s = bp::softmax(wide, 1); }, reps);
    std::printf(
        "%-26s backplane %9.3f ms   add over the same bytes      %9.3f ms   time ratio %.2f (target <= "
        "1.50)\n",
        "softmax 4096x1024 f32", bp_softmax * 1e3, add_same * 1e3, bp_softmax / add_same);
    std::printf(
        "%-26s backplane %9.3f ms   (logits spread over 0..500)   time ratio %.2f vs add, %.2f vs "
        "ordinary logits (target <= 1.50 each)\n",
        "", bp_softmax_wide * 1e3, bp_softmax_wide / add_same, bp_softmax_wide / bp_softmax);

    // ---- matmul 1024^3 f32 ----------------------------------------------------
    const int64_t m = 1024;
    const bp::Tensor ma = bp::rand_uniform(dev, {m, m}, 1);
    const bp::Tensor mb = bp::rand_uniform(dev, {m, m}, 2);
    std::vector<float> fa = ma.to_vector<float>(), fb = mb.to_vector<float>(), fc(m * m);
    const double ref_mm = seconds(
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1.0f, fa.data(), m, fb.data(), m,
                      0.0f, fc.data(), m);
        },
        reps);
    const double bp_mm = seconds([&] { bp::Tensor c = bp::matmul(ma, mb); }, reps);
    report("matmul 1024^3 f32", bp_mm, ref_mm, "cblas_sgemm", 0.95, true);
    std::printf("%-26s backplane %.1f GFLOP/s, cblas_sgemm %.1f GFLOP/s\n", "", 2.0 * m * m * m / bp_mm / 1e9,
                2.0 * m * m * m / ref_mm / 1e9);
    (void)sink;
  } catch (const bp::Error& e) {
    std::fprintf(stderr, "bench_ops: %s\n", e.what());
    return 1;
  }
  return 0;
}
