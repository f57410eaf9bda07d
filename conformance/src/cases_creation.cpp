// Cases of the creation ops: zeros, ones, full and arange (exact values on
// every dtype), and rand_uniform / randn (determinism per seed, range, and
// moments over 100k samples within 5 standard errors).
#include "reference.hpp"
#include "suite.hpp"

#include <backplane/ops.hpp>

#include <cmath>

namespace backplane::conformance {
namespace {

using Dims = std::vector<int64_t>;

const std::vector<DType> kAll = {DType::f32, DType::f64, DType::i32, DType::i64, DType::bool_};
const std::vector<DType> kArith = {DType::f32, DType::f64, DType::i32, DType::i64};
const std::vector<DType> kFloat = {DType::f32, DType::f64};

int64_t count(const Dims& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

void add_fill_cases(Cases& cases) {
  const std::vector<Dims> shapes = {{2, 3}, {}, {0, 5}, {70001}};
  for (const char* op : {"zeros", "ones", "full"}) {
    const std::string name = op;
    for (const DType dtype : kAll) {
      std::vector<double> values = {name == "zeros" ? 0.0 : 1.0};
      if (name == "full")
        values = is_float(dtype)         ? std::vector<double>{2.5, 0.1, -3e7}
                 : dtype == DType::bool_ ? std::vector<double>{1.0}
                                         : std::vector<double>{-7, 123456};
      for (const double value : values) {
        for (const Dims& shape : shapes) {
          const HostTensor want =
              make_host(dtype, shape, std::vector<double>(static_cast<std::size_t>(count(shape)), value));
          cases.push_back(
              Case{op, dtype,
                   (name == "full" ? "value " + number(value) + " " : std::string()) + shape_text(shape),
                   BP_OP_FILL, 0, [name, dtype, shape, value, want](const Context& ctx) {
                     const Shape s(shape);
                     const Tensor t = name == "zeros"  ? backplane::zeros(ctx.device, s, dtype)
                                      : name == "ones" ? backplane::ones(ctx.device, s, dtype)
                                                       : backplane::full(ctx.device, s, value, dtype);
                     return check(ctx, t, want, Tolerance{});
                   }});
        }
      }
    }
  }
}

void add_arange_cases(Cases& cases) {
  struct Range {
    double start, end, step;
    bool float_only;
  };
  const std::vector<Range> ranges = {
      {0, 10, 1, false}, {5, -5, -2, false}, {0, 0, 1, false},  {3, 4, 1, false},     {-3, 7, 2, false},
      {0, 5, -1, false}, {1, 2, 0.25, true}, {0, 1, 0.3, true}, {-1, 1, 0.125, true}, {0, 70001, 1, false}};
  for (const DType dtype : kArith) {
    for (const Range& r : ranges) {
      if (r.float_only && !is_float(dtype)) continue;
      const HostTensor want = ref::arange(r.start, r.end, r.step, dtype);
      cases.push_back(Case{"arange", dtype,
                           "(" + number(r.start) + ", " + number(r.end) + ", " + number(r.step) + ")",
                           BP_OP_ARANGE, 0, [r, dtype, want](const Context& ctx) {
                             return check(ctx, backplane::arange(ctx.device, r.start, r.end, r.step, dtype),
                                          want, tolerance_for("arange", dtype));
                           }});
    }
    cases.push_back(Case{"arange", dtype, "error: step 0", BP_OP_ARANGE, 0, [dtype](const Context& ctx) {
                           return expect_error([&] { (void)backplane::arange(ctx.device, 0, 5, 0, dtype); },
                                               {Errc::invalid_argument});
                         }});
  }
}

// ---- random ------------------------------------------------------------------------

constexpr int64_t kSamples = 100000;

struct RandomOp {
  int32_t code;  // the op's name is abi.h's: name()
  bool normal;
  double p0, p1;  // low/high, or mean/stddev
  const char* name() const { return bp_op_name(code); }
};

Tensor draw(const Context& ctx, const RandomOp& op, const Dims& shape, uint64_t seed, DType dtype) {
  return op.normal ? backplane::randn(ctx.device, Shape(shape), seed, op.p0, op.p1, dtype)
                   : backplane::rand_uniform(ctx.device, Shape(shape), seed, op.p0, op.p1, dtype);
}

// Shape, dtype, and every value finite (and inside [low, high) for uniform).
std::optional<std::string> basic_problems(const RandomOp& op, const Tensor& t, const Dims& shape,
                                          DType dtype) {
  if (t.dtype() != dtype)
    return "dtype " + std::string(to_string(t.dtype())) + ", want " + std::string(to_string(dtype));
  if (t.shape().to_vector() != shape)
    return "shape " + shape_text(t.shape().to_vector()) + ", want " + shape_text(shape);
  const HostTensor h = download(t);
  for (std::size_t k = 0; k < h.f.size(); ++k) {
    const double v = h.f[k];
    if (!std::isfinite(v)) return "element " + std::to_string(k) + " is " + number(v);
    if (!op.normal && !(v >= op.p0 && v < op.p1)) {
      return "element " + std::to_string(k) + " = " + number(v) + " is outside [" + number(op.p0) + ", " +
             number(op.p1) + ")";
    }
  }
  return std::nullopt;
}

// |value - want| <= 5 standard errors, or a message naming the statistic.
std::optional<std::string> within(const char* what, double value, double want, double se) {
  if (std::fabs(value - want) <= 5 * se) return std::nullopt;
  return std::string(what) + " " + number(value) + ", want " + number(want) + " +- " + number(5 * se) +
         " (5 standard errors of " + std::to_string(kSamples) + " samples)";
}

Verdict check_moments(const Context& ctx, const RandomOp& op, DType dtype) {
  const Tensor t = draw(ctx, op, {kSamples}, 20240607, dtype);
  if (auto p = basic_problems(op, t, {kSamples}, dtype)) return Verdict::fail(*p);
  const std::vector<double> v = download(t).f;
  const double n = static_cast<double>(kSamples);
  double mean = 0;
  for (const double x : v) mean += x;
  mean /= n;
  double var = 0;
  for (const double x : v) var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / (n - 1));

  if (op.normal) {
    const double mu = op.p0, sigma = op.p1;
    if (auto p = within("mean", mean, mu, sigma / std::sqrt(n))) return Verdict::fail(*p);
    if (auto p = within("stddev", sd, sigma, sigma / std::sqrt(2 * n))) return Verdict::fail(*p);
    double inside1 = 0, beyond3 = 0;
    for (const double x : v) {
      inside1 += std::fabs(x - mu) < sigma;
      beyond3 += std::fabs(x - mu) > 3 * sigma;
    }
    const double p1 = std::erf(1 / std::sqrt(2.0)), p3 = 1 - std::erf(3 / std::sqrt(2.0));
    if (auto p = within("share within 1 sigma", inside1 / n, p1, std::sqrt(p1 * (1 - p1) / n)))
      return Verdict::fail(*p);
    if (auto p = within("share beyond 3 sigma", beyond3 / n, p3, std::sqrt(p3 * (1 - p3) / n)))
      return Verdict::fail(*p);
  } else {
    const double lo = op.p0, hi = op.p1, width = hi - lo;
    const double sigma = width / std::sqrt(12.0);
    if (auto p = within("mean", mean, (lo + hi) / 2, sigma / std::sqrt(n))) return Verdict::fail(*p);
    // Uniform kurtosis 9/5: the standard error of the sample stddev is sigma * sqrt((9/5 - 1) / (4n)).
    if (auto p = within("stddev", sd, sigma, sigma * std::sqrt(0.8 / (4 * n)))) return Verdict::fail(*p);
    std::vector<double> bins(10, 0.0);
    for (const double x : v)
      bins[std::min<std::size_t>(9, static_cast<std::size_t>((x - lo) / width * 10))] += 1;
    for (std::size_t b = 0; b < bins.size(); ++b) {
      const std::string what = "share in bin " + std::to_string(b) + " of 10";
      if (auto p = within(what.c_str(), bins[b] / n, 0.1, std::sqrt(0.1 * 0.9 / n))) return Verdict::fail(*p);
    }
  }
  if (ctx.verbose) return Verdict::pass("mean " + number(mean) + ", stddev " + number(sd));
  return Verdict::pass();
}

void add_random_cases(Cases& cases) {
  const std::vector<RandomOp> ops = {{BP_OP_RAND_UNIFORM, false, -2, 3}, {BP_OP_RANDN, true, 1, 2}};
  for (const RandomOp& op : ops) {
    for (const DType dtype : kFloat) {
      auto add = [&](std::string name, std::function<Verdict(const Context&)> run) {
        cases.push_back(Case{op.name(), dtype, std::move(name), op.code, 0, std::move(run)});
      };
      add("same seed, same values", [op, dtype](const Context& ctx) {
        const HostTensor a = download(draw(ctx, op, {1000}, 42, dtype));
        const HostTensor b = download(draw(ctx, op, {1000}, 42, dtype));
        for (std::size_t k = 0; k < a.f.size(); ++k) {
          if (a.f[k] != b.f[k]) {
            return Verdict::fail("element " + std::to_string(k) + ": " + number(a.f[k]) + " then " +
                                 number(b.f[k]) + " with seed 42");
          }
        }
        return Verdict::pass();
      });
      add("another seed, other values", [op, dtype](const Context& ctx) {
        const HostTensor a = download(draw(ctx, op, {1000}, 42, dtype));
        const HostTensor b = download(draw(ctx, op, {1000}, 43, dtype));
        int equal = 0;
        for (std::size_t k = 0; k < a.f.size(); ++k) equal += a.f[k] == b.f[k];
        if (equal > 10)
          return Verdict::fail(std::to_string(equal) + " of 1000 values equal between seeds 42 and 43");
        return Verdict::pass();
      });
      for (const Dims& shape : std::vector<Dims>{{2, 3, 4}, {}, {0, 3}, {1}}) {
        add("shape " + shape_text(shape), [op, dtype, shape](const Context& ctx) {
          if (auto p = basic_problems(op, draw(ctx, op, shape, 7, dtype), shape, dtype))
            return Verdict::fail(*p);
          return Verdict::pass();
        });
      }
      add("range and moments (100k samples)",
          [op, dtype](const Context& ctx) { return check_moments(ctx, op, dtype); });
      if (!op.normal) {
        const RandomOp narrow{op.code, false, 5, 5.5};
        add("narrow range [5, 5.5) (100k samples)",
            [narrow, dtype](const Context& ctx) { return check_moments(ctx, narrow, dtype); });
        const RandomOp unit{op.code, false, 0, 1};
        add("default range [0, 1)", [unit, dtype](const Context& ctx) {
          const Tensor t = backplane::rand_uniform(ctx.device, Shape{10000}, 11, 0.0, 1.0, dtype);
          if (auto p = basic_problems(unit, t, {10000}, dtype)) return Verdict::fail(*p);
          if (dtype == DType::f32) {
            const Tensor d = backplane::rand_uniform(ctx.device, Shape{10000}, 11);
            if (auto p = basic_problems(unit, d, {10000}, dtype))
              return Verdict::fail("with default arguments: " + *p);
          }
          return Verdict::pass();
        });
      } else {
        const RandomOp standard{op.code, true, 0, 1};
        add("standard normal (100k samples)",
            [standard, dtype](const Context& ctx) { return check_moments(ctx, standard, dtype); });
      }
    }
  }
}

}  // namespace

void add_creation_cases(Cases& cases) {
  add_fill_cases(cases);
  add_arange_cases(cases);
  add_random_cases(cases);
}

}  // namespace backplane::conformance
