// A regression guard for the training step, run by CI after the test suite
// (scripts/bench-guard.sh): the 1-rank step of `backplane train` (MLP
// 64-128-10, batch 32, cross-entropy, SGD lr 0.1 momentum 0.9, f32: a batch
// made with from_vector, forward, backward, the optimizer step, the loss read
// back) through the host API on the cpu backend, against the same step
// written here with cblas_sgemm and plain loops, in the same process. Both
// run on one thread (the cpu backend's "threads": 1, OpenBLAS at 1 thread).
//
// The two first train side by side on the same batches from the same weights
// and must give the same losses. Then they are timed in interleaved rounds:
// each round starts both from the initial weights and times a block of steps
// of each, in alternating order. Each block is timed twice: the CPU time the
// process used (what the step costs, whoever else runs on the machine) and
// the wall time. The figures are medians over the rounds of backplane's time
// / the reference's. It prints them; with --check-ratio R it exits 1 when the
// CPU-time ratio exceeds R (a gross regression), and never otherwise. The
// CPU-time ratio is the one checked because a shared 2-core machine takes the
// CPU away from either contender for whole milliseconds, which the wall time
// of a block counts and the CPU time does not. Timings are not tests: R sits
// far above the ratio recorded in docs/benchmarks.md.
//
//   bench_train_guard [--check-ratio R] [--rounds N] [--steps N]
//
// Exit status: 0 figures printed (and the check passed), 1 the check failed
// or the two computed different losses, 2 bad arguments or backplane failed.
#include "bench_util.hpp"

#include <backplane/backplane.hpp>

#include <cblas.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

extern "C" void openblas_set_num_threads(int);  // an OpenBLAS extension not every cblas.h declares

namespace bp = backplane;

namespace {

constexpr int kIn = 64, kHidden = 128, kClasses = 10, kBatch = 32;
constexpr float kLr = 0.1f, kMomentum = 0.9f;

// Synthetic digits-shaped data: 64 features in [0, 1], 10 classes that a
// linear rule separates, so the loss falls as on the real data.
struct Data {
  static constexpr int kRows = 1024;
  std::vector<float> x;
  std::vector<int64_t> y;
  Data() : x(static_cast<std::size_t>(kRows) * kIn), y(kRows) {
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (int r = 0; r < kRows; ++r) {
      float best = -1;
      for (int c = 0; c < kIn; ++c) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        const float v = static_cast<float>(s >> 40) / static_cast<float>(1 << 24);
        x[static_cast<std::size_t>(r) * kIn + c] = v;
        if (c % 6 == 0 && v > best) best = v, y[r] = (c / 6) % kClasses;
      }
    }
  }
  // The rows of step `step` (batches walk the data in a fixed shuffled order).
  void batch(int64_t step, float* bx, int64_t* by) const {
    const int64_t first = (step * kBatch) % kRows;
    for (int i = 0; i < kBatch; ++i) {
      const int64_t r = ((first + i) * 379) % kRows;  // 379 is prime to kRows: a permutation
      std::memcpy(bx + static_cast<std::size_t>(i) * kIn, &x[static_cast<std::size_t>(r) * kIn],
                  kIn * sizeof(float));
      by[i] = y[r];
    }
  }
};

// backplane's step, as `backplane train` runs it at one rank.
struct BackplaneStep {
  struct Model {
    bp::nn::Linear l1, l2;
    bp::nn::SGD opt;
    explicit Model(const bp::Device& dev)
        : l1(dev, kIn, kHidden, 1), l2(dev, kHidden, kClasses, 2), opt(params(), kLr, kMomentum) {}
    std::vector<bp::Tensor> params() const { return {l1.weight(), l1.bias(), l2.weight(), l2.bias()}; }
  };
  const Data& data;
  bp::Device dev;
  std::unique_ptr<Model> m;
  std::vector<float> bx = std::vector<float>(kBatch * kIn);
  std::vector<int64_t> by = std::vector<int64_t>(kBatch);
  int64_t step = 0;

  BackplaneStep(const Data& d, const bp::Device& device) : data(d), dev(device) { reset(); }
  // Back to the first step: the initial weights (the same seeds), no momentum.
  void reset() {
    m.reset();
    m = std::make_unique<Model>(dev);
    step = 0;
  }
  float run() {
    data.batch(step++, bx.data(), by.data());
    const bp::Tensor x = bp::Tensor::from_vector<float>(dev, {kBatch, kIn}, bx);
    const bp::Tensor y = bp::Tensor::from_vector<int64_t>(dev, {kBatch}, by);
    const bp::Tensor loss = bp::nn::cross_entropy(m->l2(bp::relu(m->l1(x))), y);
    m->opt.step(loss.backward());
    return loss.to_vector<float>()[0];
  }
};

// The same step with cblas_sgemm and loops over plain arrays (row-major;
// weights [in, out] as nn::Linear holds them).
struct ReferenceStep {
  const Data& data;
  std::vector<float> w1_0, b1_0, w2_0, b2_0;          // the initial parameters
  std::vector<float> w1, b1, w2, b2;                  // parameters
  std::vector<float> vw1, vb1, vw2, vb2;              // momentum buffers
  std::vector<float> gw1, gb1, gw2, gb2;              // gradients
  std::vector<float> x, pre, h, logits, dlogits, dh;  // activations
  std::vector<int64_t> y;
  int64_t step = 0;

  ReferenceStep(const Data& d, const BackplaneStep& from)
      : data(d),
        w1_0(from.m->l1.weight().to_vector<float>()),
        b1_0(from.m->l1.bias().to_vector<float>()),
        w2_0(from.m->l2.weight().to_vector<float>()),
        b2_0(from.m->l2.bias().to_vector<float>()),
        w1(w1_0),
        b1(b1_0),
        w2(w2_0),
        b2(b2_0),
        vw1(w1.size()),
        vb1(b1.size()),
        vw2(w2.size()),
        vb2(b2.size()),
        gw1(w1.size()),
        gb1(b1.size()),
        gw2(w2.size()),
        gb2(b2.size()),
        x(kBatch * kIn),
        pre(kBatch * kHidden),
        h(kBatch * kHidden),
        logits(kBatch * kClasses),
        dlogits(kBatch * kClasses),
        dh(kBatch * kHidden),
        y(kBatch) {}

  void reset() {
    w1 = w1_0, b1 = b1_0, w2 = w2_0, b2 = b2_0;
    for (std::vector<float>* v : {&vw1, &vb1, &vw2, &vb2}) std::fill(v->begin(), v->end(), 0.0f);
    step = 0;
  }

  static void sgd(std::vector<float>& p, std::vector<float>& v, const std::vector<float>& g) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      v[i] = kMomentum * v[i] + g[i];
      p[i] -= kLr * v[i];
    }
  }

  float run() {
    data.batch(step++, x.data(), y.data());
    // Forward: pre = x w1 + b1; h = relu(pre); logits = h w2 + b2.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kBatch, kHidden, kIn, 1.0f, x.data(), kIn,
                w1.data(), kHidden, 0.0f, pre.data(), kHidden);
    for (int i = 0; i < kBatch; ++i)
      for (int j = 0; j < kHidden; ++j) {
        float& p = pre[static_cast<std::size_t>(i) * kHidden + j];
        p += b1[j];
        h[static_cast<std::size_t>(i) * kHidden + j] = p > 0 ? p : 0.0f;
      }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kBatch, kClasses, kHidden, 1.0f, h.data(), kHidden,
                w2.data(), kClasses, 0.0f, logits.data(), kClasses);
    // Cross-entropy, mean over the batch; dlogits = (softmax - onehot) / batch.
    double loss = 0;
    for (int i = 0; i < kBatch; ++i) {
      float* l = &logits[static_cast<std::size_t>(i) * kClasses];
      float* d = &dlogits[static_cast<std::size_t>(i) * kClasses];
      float m = -INFINITY;
      for (int c = 0; c < kClasses; ++c) m = std::max(m, l[c] += b2[c]);
      float sum = 0;
      for (int c = 0; c < kClasses; ++c) sum += d[c] = std::exp(l[c] - m);
      const float inv = 1.0f / sum;
      loss += std::log(sum) + m - l[y[i]];
      for (int c = 0; c < kClasses; ++c) d[c] *= inv / kBatch;
      d[y[i]] -= 1.0f / kBatch;
    }
    // Backward: gw2 = h^T dlogits; gb2 = column sums; dh = dlogits w2^T masked by relu;
    // gw1 = x^T dh; gb1 = column sums.
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kHidden, kClasses, kBatch, 1.0f, h.data(), kHidden,
                dlogits.data(), kClasses, 0.0f, gw2.data(), kClasses);
    std::fill(gb2.begin(), gb2.end(), 0.0f);
    for (int i = 0; i < kBatch; ++i)
      for (int c = 0; c < kClasses; ++c) gb2[c] += dlogits[static_cast<std::size_t>(i) * kClasses + c];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kBatch, kHidden, kClasses, 1.0f, dlogits.data(),
                kClasses, w2.data(), kClasses, 0.0f, dh.data(), kHidden);
    std::fill(gb1.begin(), gb1.end(), 0.0f);
    for (int i = 0; i < kBatch; ++i)
      for (int j = 0; j < kHidden; ++j) {
        const std::size_t k = static_cast<std::size_t>(i) * kHidden + j;
        if (pre[k] <= 0) dh[k] = 0.0f;
        gb1[j] += dh[k];
      }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kIn, kHidden, kBatch, 1.0f, x.data(), kIn, dh.data(),
                kHidden, 0.0f, gw1.data(), kHidden);
    // SGD with momentum, as PyTorch's: v = momentum v + g; p -= lr v.
    sgd(w1, vw1, gw1);
    sgd(b1, vb1, gb1);
    sgd(w2, vw2, gw2);
    sgd(b2, vb2, gb2);
    return static_cast<float>(loss / kBatch);
  }
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_train_guard: %s\nusage: bench_train_guard [--check-ratio R] [--rounds N] [--steps N]\n",
               why);
  std::exit(2);
}

// CPU time of the whole process (every thread), in ns.
double cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

struct Samples {
  std::vector<double> bp, ref, ratio;
  void add(double a, double b) {
    bp.push_back(a);
    ref.push_back(b);
    ratio.push_back(a / b);
  }
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

void print(const char* clock, const Samples& s) {
  std::printf("  %-9s backplane %7.1f us/step   reference %7.1f us/step   ratio %5.2f (p10 %.2f, p90 %.2f)\n",
              clock, bench::median(s.bp) / 1e3, bench::median(s.ref) / 1e3, bench::median(s.ratio),
              percentile(s.ratio, 0.1), percentile(s.ratio, 0.9));
}

}  // namespace

int main(int argc, char** argv) {
  double limit = 0;  // 0: print only
  int rounds = 201, steps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const char* v = argv[++i];
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(x > 0)) usage(("bad value for " + a + ": " + v).c_str());
    if (a == "--check-ratio")
      limit = x;
    else if (a == "--rounds")
      rounds = std::max(3, static_cast<int>(x));
    else if (a == "--steps")
      steps = std::max(1, static_cast<int>(x));
    else
      usage(("unknown option " + a).c_str());
  }
  openblas_set_num_threads(1);

  const double t_start = bench::now_ns();
  Samples cpu, wall;
  try {
    const bp::Registry registry = bp::Registry::from_json(
        R"({"schema_version": 1, "backends": [{"name": "cpu", "library": "backplane_cpu", "required": true,
            "options": {"threads": 1}}]})",
        BP_BENCH_PLUGIN_DIR, "bench_train_guard");
    const Data data;
    BackplaneStep ours(data, registry.backend("cpu").device(0));
    ReferenceStep ref(data, ours);

    // Same weights, same batches: the same losses, or the comparison means nothing.
    for (int i = 0; i < 100; ++i) {
      const float a = ours.run(), b = ref.run();
      if (!(std::abs(a - b) <= 1e-3f * std::max(1.0f, std::abs(b)))) {
        std::fprintf(
            stderr, "bench_train_guard: the losses differ at step %d: %.7g (backplane) vs %.7g (reference)\n",
            i, a, b);
        return 1;
      }
    }
    for (int r = 0; r < rounds; ++r) {
      // Every round trains from the initial weights, as a job's first steps: a long run
      // drives the momentum of dead ReLU units into denormals, whose cost would swamp
      // what this measures (`backplane train`'s 460 steps stay far from them).
      ours.reset();
      ref.reset();
      // ns per step of a block of `steps`: {CPU, wall}.
      const auto time = [&](auto& s) {
        const double c0 = cpu_ns(), w0 = bench::now_ns();
        for (int i = 0; i < steps; ++i) s.run();
        const double w1 = bench::now_ns(), c1 = cpu_ns();
        return std::pair<double, double>{(c1 - c0) / steps, (w1 - w0) / steps};
      };
      std::pair<double, double> a, b;
      if (r % 2 == 0) {
        a = time(ours);
        b = time(ref);
      } else {
        b = time(ref);
        a = time(ours);
      }
      cpu.add(a.first, b.first);
      wall.add(a.second, b.second);
    }
  } catch (const bp::Error& e) {
    std::fprintf(stderr, "bench_train_guard: %s\n", e.what());
    return 2;
  }

  std::printf(
      "bench_train_guard: training step, MLP 64-128-10, batch 32, SGD momentum 0.9, f32, 1 thread, backplane "
      "(cpu backend, from_vector to the loss read back) / the same step on cblas_sgemm and loops; medians of "
      "%d "
      "interleaved rounds of %d steps (%.1f s)\n",
      rounds, steps, (bench::now_ns() - t_start) / 1e9);
  print("CPU time", cpu);
  print("wall time", wall);
  const double r = bench::median(cpu.ratio);
  if (limit <= 0) return 0;
  if (r > limit) {
    std::printf(
        "  FAILED: the CPU-time ratio %.2f exceeds the limit %.2f (twice the ratio in docs/benchmarks.md): "
        "the "
        "training step has regressed grossly\n",
        r, limit);
    return 1;
  }
  std::printf("  ok: the CPU-time ratio %.2f is within the limit %.2f\n", r, limit);
  return 0;
}
