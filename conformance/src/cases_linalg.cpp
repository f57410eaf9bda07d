// Cases of matmul (2-D, batched, broadcast batch dims, K = 0, strided
// operands, NaN/Inf) and of softmax / log_softmax (every axis, size-1 and
// empty axes, large magnitudes, -inf masks, NaN rows).
#include "reference.hpp"
#include "suite.hpp"

#include <backplane/ops.hpp>

#include <cmath>
#include <limits>

namespace backplane::conformance {
namespace {

using Dims = std::vector<int64_t>;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const std::vector<DType> kFloat = {DType::f32, DType::f64};

Verdict run_matmul(const Context& ctx, const Operand& a, const Operand& b) {
  const ref::MatmulResult want = ref::matmul(a.logical(), b.logical());
  Tolerance tol = tolerance_for("matmul", a.base.dtype);
  tol.rel *= std::sqrt(static_cast<double>(std::max<int64_t>(want.k, 1)));
  return check(ctx, backplane::matmul(a.on(ctx.device), b.on(ctx.device)), want.value, tol, &want.scale);
}

void add_matmul_cases(Cases& cases) {
  const std::vector<std::pair<Dims, Dims>> shapes = {
      {{2, 3}, {3, 4}},       {{1, 1}, {1, 1}},          {{5, 0}, {0, 3}},     {{0, 4}, {4, 3}},
      {{4, 3}, {3, 0}},       {{64, 128}, {128, 96}},    {{33, 70}, {70, 17}}, {{3, 4, 5}, {5, 2}},
      {{3, 4, 5}, {3, 5, 2}}, {{2, 1, 4, 5}, {3, 5, 6}}, {{4, 5}, {2, 5, 3}},  {{1, 4, 5}, {3, 5, 2}},
  };
  for (const DType dtype : kFloat) {
    auto add = [&](std::string name, Operand a, Operand b) {
      cases.push_back(Case{"matmul", dtype, std::move(name), BP_OP_MATMUL, 0,
                           [a, b](const Context& ctx) { return run_matmul(ctx, a, b); }});
    };
    Rng rng(seed_of("matmul" + std::string(to_string(dtype))));
    for (const auto& [sa, sb] : shapes) {
      std::string tag = sa.size() > 2 || sb.size() > 2 ? "batched " : "";
      if (sa[sa.size() - 1] == 0) tag = "K = 0 ";
      add(tag + shape_text(sa) + " x " + shape_text(sb), plain(random_host(rng, dtype, sa, -1, 1)),
          plain(random_host(rng, dtype, sb, -1, 1)));
    }
    const Operand at = transposed(random_host(rng, dtype, {6, 4}, -1, 1), 0, 1);  // [4, 6]
    const Operand bt = transposed(random_host(rng, dtype, {5, 6}, -1, 1), 0, 1);  // [6, 5]
    const Operand a = plain(random_host(rng, dtype, {4, 6}, -1, 1));
    const Operand b = plain(random_host(rng, dtype, {6, 5}, -1, 1));
    add("strided a " + at.describe() + " x " + b.describe(), at, b);
    add("strided b " + a.describe() + " x " + bt.describe(), a, bt);
    add("strided both " + at.describe() + " x " + bt.describe(), at, bt);
    const Operand ap = permuted(random_host(rng, dtype, {4, 3, 2}, -1, 1), {1, 0, 2});  // [3, 4, 2]
    add("strided batched " + ap.describe() + " x [2, 5]", ap, plain(random_host(rng, dtype, {2, 5}, -1, 1)));
    const Operand as = sliced(random_host(rng, dtype, {4, 12}, -1, 1), 1, 0, 12, 2);  // [4, 6]
    add("strided sliced " + as.describe() + " x " + b.describe(), as, b);
    add("nan_inf", plain(make_host(dtype, {3, 3}, {1, kNaN, 2, kInf, 1, 2, 1, 2, 3})),
        plain(make_host(dtype, {3, 2}, {1, -1, 2, 0.5, -1, 3})));

    const HostTensor m23 = random_host(rng, dtype, {2, 3}, -1, 1);
    const HostTensor m43 = random_host(rng, dtype, {4, 3}, -1, 1);
    const HostTensor v3 = random_host(rng, dtype, {3}, -1, 1);
    cases.push_back(
        Case{"matmul", dtype, "error: inner dims differ [2, 3] x [4, 3]", BP_OP_MATMUL, 0,
             [m23, m43](const Context& ctx) {
               return expect_error(
                   [&] { (void)backplane::matmul(upload(ctx.device, m23), upload(ctx.device, m43)); },
                   {Errc::shape_mismatch});
             }});
    cases.push_back(Case{
        "matmul", dtype, "error: 1-D operand [2, 3] x [3]", BP_OP_MATMUL, 0, [m23, v3](const Context& ctx) {
          return expect_error(
              [&] { (void)backplane::matmul(upload(ctx.device, m23), upload(ctx.device, v3)); },
              {Errc::shape_mismatch});
        }});
  }
}

void add_softmax_cases(Cases& cases) {
  struct Spec {
    const char* tag;
    Dims shape;
    int64_t axis;
  };
  const std::vector<Spec> specs = {
      {"", {3, 5}, 1},
      {"", {3, 5}, 0},
      {"", {3, 5}, -1},
      {"", {2, 3, 4}, 1},
      {"", {7}, 0},
      {"size-1 ", {1, 1}, 0},
      {"size-1 axis ", {4, 1}, 1},
      {"empty ", {0, 5}, 1},
      {"empty axis ", {3, 0}, 1},
      {"long ", {300, 257}, 1},
      {"long ", {300, 257}, 0},
  };
  for (const bool log : {false, true}) {
    const char* name = bp_op_name(log ? BP_OP_LOG_SOFTMAX : BP_OP_SOFTMAX);
    const int32_t code = log ? BP_OP_LOG_SOFTMAX : BP_OP_SOFTMAX;
    for (const DType dtype : kFloat) {
      auto add = [&](std::string case_name, Operand t, int64_t axis) {
        cases.push_back(Case{
            name, dtype, std::move(case_name), code, 0, [name, log, t, axis](const Context& ctx) {
              const Tensor x = t.on(ctx.device);
              const Tensor got = log ? backplane::log_softmax(x, axis) : backplane::softmax(x, axis);
              return check(ctx, got, ref::softmax(t.logical(), axis, log), tolerance_for(name, t.base.dtype));
            }});
      };
      Rng rng(seed_of(std::string(name) + std::string(to_string(dtype))));
      for (const Spec& s : specs) {
        add(std::string(s.tag) + shape_text(s.shape) + " axis " + std::to_string(s.axis),
            plain(random_host(rng, dtype, s.shape, -5, 5)), s.axis);
      }
      const Operand t = transposed(random_host(rng, dtype, {6, 4}, -5, 5), 0, 1);
      add("strided " + t.describe() + " axis 1", t, 1);
      add("strided " + t.describe() + " axis 0", t, 0);
      // Stability: exp(1000) overflows; the max must be subtracted first.
      add("large magnitudes (stability)",
          plain(make_host(dtype, {3, 4}, {1000, 999, 998, 990, -1000, -999, -998, -990, 88, 89, 90, 100})),
          1);
      add("-inf masks", plain(make_host(dtype, {2, 4}, {0, -kInf, 1, -kInf, -kInf, 2, -kInf, -kInf})), 1);
      add("nan row", plain(make_host(dtype, {2, 3}, {1, kNaN, 2, 1, 2, 3})), 1);
      const HostTensor bad = random_host(rng, dtype, {2, 3}, -1, 1);
      cases.push_back(Case{name, dtype, "error: axis 2 of [2, 3]", code, 0, [log, bad](const Context& ctx) {
                             return expect_error(
                                 [&] {
                                   const Tensor x = upload(ctx.device, bad);
                                   (void)(log ? backplane::log_softmax(x, 2) : backplane::softmax(x, 2));
                                 },
                                 {Errc::invalid_argument});
                           }});
    }
  }
}

}  // namespace

void add_linalg_cases(Cases& cases) {
  add_matmul_cases(cases);
  add_softmax_cases(cases);
}

}  // namespace backplane::conformance
