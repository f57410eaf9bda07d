// Large cases: one per op family on a tensor over 2^31 bytes (64-bit sizes
// and offsets end to end; accumulation accuracy of long reductions). The
// inputs follow closed formulas, so each result is checked element by
// element without materialising a reference. They run only when asked
// (Options::max_bytes) and when MemAvailable covers their footprint.
#include "suite.hpp"

#include <backplane/ops.hpp>

#include <cmath>

namespace backplane::conformance {
namespace {

// [2^19 + 1, 1024] f32: 2^29 + 1024 elements, 2 GiB + 4 KiB.
constexpr int64_t kRows = (int64_t{1} << 19) + 1;
constexpr int64_t kCols = 1024;
constexpr int64_t kNumel = kRows * kCols;
constexpr uint64_t kBytes = static_cast<uint64_t>(kNumel) * sizeof(float);
constexpr uint64_t kSlack = uint64_t{256} << 20;
// The input of the matmul case: [2^20 + 8, 512] f32, 2 GiB + 16 KiB.
constexpr uint64_t kMatmulBytes = ((uint64_t{1} << 20) + 8) * 512 * sizeof(float);

const std::string kShape = "[" + std::to_string(kRows) + ", " + std::to_string(kCols) + "]";

template <class Fn>
Tensor upload_matrix(const Context& ctx, int64_t rows, int64_t cols, Fn&& value) {
  std::vector<float> host(static_cast<std::size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) host[static_cast<std::size_t>(i * cols + j)] = value(i, j);
  }
  return Tensor::from_vector(ctx.device, Shape{rows, cols}, host);  // `host` is freed on return
}

// Compares every element of `got` (shape rows x cols) with want(i, j) within
// rel * |want| + abs; names the first mismatch.
template <class Fn>
Verdict expect_matrix(const Tensor& got, int64_t rows, int64_t cols, double rel, double abs, Fn&& want) {
  if (got.shape() != Shape{rows, cols}) {
    return Verdict::fail("shape " + got.shape().to_string() + ", want " + Shape{rows, cols}.to_string());
  }
  const std::vector<float> g = got.to_vector<float>();
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double w = want(i, j), v = g[static_cast<std::size_t>(i * cols + j)];
      if (std::fabs(v - w) <= abs + rel * std::fabs(w)) continue;
      if (bad++ == 0) {
        first = "element [" + std::to_string(i) + ", " + std::to_string(j) + "]: got " + number(v) +
                ", want " + number(w);
      }
    }
  }
  if (bad > 0) return Verdict::fail(first + "; " + std::to_string(bad) + " elements differ");
  return Verdict::pass();
}

float pattern(int64_t i, int64_t j) { return static_cast<float>((i * 7 + j) % 1000); }

Verdict large_add(const Context& ctx) {
  const Tensor a = upload_matrix(ctx, kRows, kCols, pattern);
  const Tensor b =
      upload_matrix(ctx, 1, kCols, [](int64_t, int64_t j) { return static_cast<float>(j) * 0.5f; });
  const Tensor out = backplane::add(a, b);
  return expect_matrix(out, kRows, kCols, 0, 0, [](int64_t i, int64_t j) { return pattern(i, j) + 0.5 * j; });
}

Verdict large_neg(const Context& ctx) {
  const Tensor out = backplane::neg(upload_matrix(ctx, kRows, kCols, pattern));
  return expect_matrix(out, kRows, kCols, 0, 0,
                       [](int64_t i, int64_t j) { return -static_cast<double>(pattern(i, j)); });
}

// All ones: the sums are exact integers, far beyond what a float accumulator
// can count to one by one (2^24).
Verdict large_sum(const Context& ctx) {
  const Tensor a = upload_matrix(ctx, kRows, kCols, [](int64_t, int64_t) { return 1.0f; });
  const Tolerance tol = tolerance_for("sum", DType::f32);
  const double all = backplane::sum(a).to_vector<float>().at(0);
  const double n = static_cast<double>(kNumel);
  if (std::fabs(all - n) > tol.abs + tol.rel * n) {
    return Verdict::fail("sum of all " + std::to_string(kNumel) + " ones: got " + number(all) + ", want " +
                         number(n) + " (" + tol.to_string() + " of sum |x|)");
  }
  Verdict v = expect_matrix(backplane::sum(a, 1, true), kRows, 1, tol.rel, tol.abs,
                            [](int64_t, int64_t) { return 1024.0; });
  if (v.outcome != CaseResult::Outcome::pass) return Verdict::fail("sum axis 1: " + v.detail);
  v = expect_matrix(backplane::sum(a, 0, true), 1, kCols, tol.rel, tol.abs,
                    [](int64_t, int64_t) { return static_cast<double>(kRows); });
  if (v.outcome != CaseResult::Outcome::pass) return Verdict::fail("sum axis 0: " + v.detail);
  return Verdict::pass();
}

Verdict large_argmax(const Context& ctx) {
  const int64_t peak = kNumel - 5;  // past 2^31 bytes into the buffer
  const Tensor a = upload_matrix(ctx, kRows, kCols,
                                 [&](int64_t i, int64_t j) { return i * kCols + j == peak ? 2.0f : 1.0f; });
  const std::vector<int64_t> all = backplane::argmax(a).to_vector<int64_t>();
  if (all.size() != 1 || all[0] != peak) {
    return Verdict::fail("argmax of all: got " +
                         (all.empty() ? std::string("nothing") : std::to_string(all[0])) + ", want " +
                         std::to_string(peak));
  }
  const std::vector<int64_t> rows = backplane::argmax(a, 1).to_vector<int64_t>();
  for (int64_t i = 0; i < kRows; ++i) {
    const int64_t want = i == kRows - 1 ? peak % kCols : 0;
    if (rows[static_cast<std::size_t>(i)] != want) {
      return Verdict::fail("argmax axis 1, row " + std::to_string(i) + ": got " +
                           std::to_string(rows[static_cast<std::size_t>(i)]) + ", want " +
                           std::to_string(want));
    }
  }
  return Verdict::pass();
}

// [2^20 + 8, 512] x [512, 4] of small integers: every product and partial
// sum is exact in float, so the result must be exact.
Verdict large_matmul(const Context& ctx) {
  constexpr int64_t m = (int64_t{1} << 20) + 8, k = 512, n = 4;
  auto av = [](int64_t i, int64_t p) { return static_cast<float>((i + 3 * p) % 7 - 3); };
  auto bv = [](int64_t p, int64_t j) { return static_cast<float>((p + j) % 5 - 2); };
  const Tensor out = backplane::matmul(upload_matrix(ctx, m, k, av), upload_matrix(ctx, k, n, bv));
  double want[7][n];  // av depends on i only through i % 7
  for (int64_t r = 0; r < 7; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += static_cast<double>(av(r, p)) * bv(p, j);
      want[r][j] = acc;
    }
  }
  return expect_matrix(out, m, n, 0, 0, [&](int64_t i, int64_t j) { return want[i % 7][j]; });
}

// Row i is a cyclic shift (by i % 17) of one pattern: 17 reference rows.
Verdict large_softmax(const Context& ctx) {
  auto v = [](int64_t i, int64_t j) { return static_cast<float>((i + j) % 17) * 0.25f; };
  std::vector<std::vector<double>> want(17, std::vector<double>(kCols));
  for (int64_t r = 0; r < 17; ++r) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < kCols; ++j) mx = std::max(mx, static_cast<double>(v(r, j)));
    for (int64_t j = 0; j < kCols; ++j) s += std::exp(v(r, j) - mx);
    for (int64_t j = 0; j < kCols; ++j) want[r][j] = std::exp(v(r, j) - mx) / s;
  }
  const Tolerance tol = tolerance_for("softmax", DType::f32);
  const Tensor out = backplane::softmax(upload_matrix(ctx, kRows, kCols, v), 1);
  return expect_matrix(out, kRows, kCols, tol.rel, tol.abs,
                       [&](int64_t i, int64_t j) { return want[i % 17][j]; });
}

Verdict large_contiguous(const Context& ctx) {
  auto v = [](int64_t i, int64_t j) { return static_cast<float>((i * 31 + j) % 4093); };
  const Tensor t = backplane::transpose(upload_matrix(ctx, kRows, kCols, v), 0, 1);
  const Tensor out = backplane::contiguous(t);
  if (!out.is_contiguous()) return Verdict::fail("the result is not contiguous");
  return expect_matrix(out, kCols, kRows, 0, 0, [&](int64_t j, int64_t i) { return v(i, j); });
}

}  // namespace

void add_large_cases(Cases& cases) {
  auto add = [&](const char* op, int32_t code, std::string name, uint64_t bytes,
                 Verdict (*run)(const Context&)) {
    cases.push_back(Case{op, DType::f32, "large " + std::move(name), code, bytes, run});
  };
  add("add", BP_OP_ADD, kShape + " + [1024]", 3 * kBytes + kSlack, &large_add);
  add("neg", BP_OP_NEG, kShape, 3 * kBytes + kSlack, &large_neg);
  add("sum", BP_OP_SUM, "ones " + kShape + ", all and per axis", 2 * kBytes + kSlack, &large_sum);
  add("argmax", BP_OP_ARGMAX, kShape + ", peak near the end", 2 * kBytes + kSlack, &large_argmax);
  add("matmul", BP_OP_MATMUL, "[1048584, 512] x [512, 4]", 2 * kMatmulBytes + kSlack, &large_matmul);
  add("softmax", BP_OP_SOFTMAX, kShape + " axis 1", 3 * kBytes + kSlack, &large_softmax);
  add("contiguous", BP_OP_COPY, "transpose of " + kShape, 3 * kBytes + kSlack, &large_contiguous);
}

}  // namespace backplane::conformance
