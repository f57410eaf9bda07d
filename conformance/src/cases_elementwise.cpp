// Cases of the elementwise ops: binary arithmetic, comparisons, where, and
// the unary ops, on every dtype their rules allow, over broadcasting shapes,
// scalars, empties, size-1 dims, strided operands, NaN/Inf and integer edges.
#include "reference.hpp"
#include "suite.hpp"

#include <backplane/ops.hpp>

#include <cmath>
#include <cstdio>
#include <limits>

namespace backplane::conformance {
namespace {

using Dims = std::vector<int64_t>;
using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);
using UnaryFn = Tensor (*)(const Tensor&);

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const std::vector<DType> kArith = {DType::f32, DType::f64, DType::i32, DType::i64};
const std::vector<DType> kFloat = {DType::f32, DType::f64};
const std::vector<DType> kAll = {DType::f32, DType::f64, DType::i32, DType::i64, DType::bool_};

int64_t max_of(DType d) {
  return d == DType::i32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
}
int64_t min_of(DType d) {
  return d == DType::i32 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min();
}

// ---- binary ops and comparisons ------------------------------------------------

struct BinaryOp {
  int32_t code;  // the op's name is abi.h's: name()
  BinaryFn fn;
  bool comparison;
  ref::Binary arith;
  ref::Compare cmp;
  const char* name() const { return bp_op_name(code); }
};

const std::vector<BinaryOp>& binary_ops() {
  static const std::vector<BinaryOp> ops = {
      {BP_OP_ADD, &backplane::add, false, ref::Binary::add, ref::Compare::eq},
      {BP_OP_SUB, &backplane::sub, false, ref::Binary::sub, ref::Compare::eq},
      {BP_OP_MUL, &backplane::mul, false, ref::Binary::mul, ref::Compare::eq},
      {BP_OP_DIV, &backplane::div, false, ref::Binary::div, ref::Compare::eq},
      {BP_OP_POW, &backplane::pow, false, ref::Binary::pow, ref::Compare::eq},
      {BP_OP_MAXIMUM, &backplane::maximum, false, ref::Binary::maximum, ref::Compare::eq},
      {BP_OP_MINIMUM, &backplane::minimum, false, ref::Binary::minimum, ref::Compare::eq},
      {BP_OP_EQ, &backplane::eq, true, ref::Binary::add, ref::Compare::eq},
      {BP_OP_NE, &backplane::ne, true, ref::Binary::add, ref::Compare::ne},
      {BP_OP_LT, &backplane::lt, true, ref::Binary::add, ref::Compare::lt},
      {BP_OP_LE, &backplane::le, true, ref::Binary::add, ref::Compare::le},
      {BP_OP_GT, &backplane::gt, true, ref::Binary::add, ref::Compare::gt},
      {BP_OP_GE, &backplane::ge, true, ref::Binary::add, ref::Compare::ge},
  };
  return ops;
}

// Inputs that keep each op inside its domain: divisors away from zero,
// non-negative integer exponents, small value sets for comparisons (so
// equal pairs occur).
HostTensor binary_input(Rng& rng, const BinaryOp& op, DType dtype, Dims shape, int which) {
  const std::string name = op.name();
  if (op.comparison) {
    if (!is_float(dtype)) return random_host(rng, dtype, std::move(shape), -3, 3);
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    std::vector<double> v(static_cast<std::size_t>(n));
    for (double& x : v) x = rng.pick({-2.0, -0.5, 0.0, 0.5, 1.0, 3.0});
    return make_host(dtype, std::move(shape), v);
  }
  if (name == "div" && which == 1) {
    if (!is_float(dtype)) {
      HostTensor t = random_host(rng, dtype, shape, 1, 9);
      for (int64_t& x : t.i) x = (rng.next() & 1) ? x : -x;
      return t;
    }
    HostTensor t = random_host(rng, dtype, shape, 0.5, 10);
    for (double& x : t.f) x = (rng.next() & 1) ? x : -x;
    return t;
  }
  if (name == "pow") {
    if (which == 0)
      return is_float(dtype) ? random_host(rng, dtype, shape, 0.5, 4) : random_host(rng, dtype, shape, -4, 4);
    return is_float(dtype) ? random_host(rng, dtype, shape, -3, 3) : random_host(rng, dtype, shape, 0, 6);
  }
  return is_float(dtype) ? random_host(rng, dtype, shape, -10, 10)
                         : random_host(rng, dtype, shape, -1000, 1000);
}

HostTensor binary_reference(const BinaryOp& op, const HostTensor& a, const HostTensor& b) {
  return op.comparison ? ref::compare(op.cmp, a, b) : ref::binary(op.arith, a, b);
}

Verdict run_binary(const Context& ctx, const BinaryOp& op, const Operand& a, const Operand& b,
                   bool use_operator) {
  const HostTensor want = binary_reference(op, a.logical(), b.logical());
  const Tensor x = a.on(ctx.device), y = b.on(ctx.device);
  Tensor got;
  if (use_operator) {
    const std::string n = op.name();
    got = n == "add" ? x + y : n == "sub" ? x - y : n == "mul" ? x * y : x / y;
  } else {
    got = op.fn(x, y);
  }
  return check(ctx, got, want, tolerance_for(op.name(), a.base.dtype));
}

struct ShapePair {
  const char* tag;
  Dims a, b;
};

const std::vector<ShapePair> kBroadcastShapes = {
    {"same", {2, 3}, {2, 3}},
    {"trailing", {2, 3}, {3}},
    {"trailing 1s", {2, 1}, {1, 3}},
    {"middle 1s", {4, 1, 5}, {3, 1}},
    {"leading dims", {5, 1, 1}, {1, 4, 6}},
    {"leading dims", {3}, {2, 2, 3}},
    {"scalar with tensor", {}, {2, 2}},
    {"tensor with scalar", {2, 2}, {}},
    {"scalar with scalar", {}, {}},
    {"size-1", {1}, {7}},
    {"size-1", {1, 1}, {1, 1}},
    {"empty", {0, 3}, {3}},
    {"empty", {3, 0}, {1}},
    {"empty", {2, 0}, {2, 1}},
    {"long rows", {300, 257}, {257}},
    {"long cols", {300, 257}, {300, 1}},
    {"contiguous", {70001}, {70001}},
};

void add_binary_cases(Cases& cases) {
  for (const BinaryOp& op : binary_ops()) {
    const std::vector<DType>& dtypes = op.comparison ? kAll : kArith;
    for (const DType dtype : dtypes) {
      auto add = [&](std::string name, std::function<Verdict(const Context&)> run) {
        cases.push_back(Case{op.name(), dtype, std::move(name), op.code, 0, std::move(run)});
      };
      for (const ShapePair& s : kBroadcastShapes) {
        const std::string name = std::string(s.tag) + " " + shape_text(s.a) + " x " + shape_text(s.b);
        Rng rng(seed_of(std::string(op.name()) + name + std::string(to_string(dtype))));
        const Operand a = plain(binary_input(rng, op, dtype, s.a, 0));
        const Operand b = plain(binary_input(rng, op, dtype, s.b, 1));
        add(name, [&op, a, b](const Context& ctx) { return run_binary(ctx, op, a, b, false); });
      }
      {
        Rng rng(seed_of(std::string(op.name()) + "strided" + std::string(to_string(dtype))));
        const Operand at = transposed(binary_input(rng, op, dtype, {5, 4}, 0), 0, 1);
        const Operand b = plain(binary_input(rng, op, dtype, {4, 5}, 1));
        add("strided (transposed a) " + at.describe() + " x " + b.describe(),
            [&op, at, b](const Context& ctx) { return run_binary(ctx, op, at, b, false); });
        const Operand as = sliced(binary_input(rng, op, dtype, {4, 10}, 0), 1, 1, 10, 2);
        const Operand bs = plain(binary_input(rng, op, dtype, {5}, 1));
        add("strided (sliced a) " + as.describe() + " x " + bs.describe(),
            [&op, as, bs](const Context& ctx) { return run_binary(ctx, op, as, bs, false); });
        const Operand ap = permuted(binary_input(rng, op, dtype, {2, 3, 4}, 0), {2, 0, 1});
        const Operand bp = transposed(binary_input(rng, op, dtype, {3, 2}, 1), 0, 1);
        add("strided (both) " + ap.describe() + " x " + bp.describe(),
            [&op, ap, bp](const Context& ctx) { return run_binary(ctx, op, ap, bp, false); });
      }
      const std::string n = op.name();
      if (n == "add" || n == "sub" || n == "mul" || n == "div") {
        Rng rng(seed_of(n + "operator" + std::string(to_string(dtype))));
        const Operand a = plain(binary_input(rng, op, dtype, {3, 4}, 0));
        const Operand b = plain(binary_input(rng, op, dtype, {4}, 1));
        add("operator " + std::string(n == "add"   ? "+"
                                      : n == "sub" ? "-"
                                      : n == "mul" ? "*"
                                                   : "/"),
            [&op, a, b](const Context& ctx) { return run_binary(ctx, op, a, b, true); });
      }
      if (is_float(dtype)) {
        const Operand a =
            plain(make_host(dtype, {12}, {kNaN, 1, kInf, -kInf, kInf, 0, kNaN, -0.0, 2, -kInf, 5, -5}));
        const Operand b =
            plain(make_host(dtype, {12}, {2, kNaN, kInf, kInf, -kInf, 0, kNaN, 3, kInf, 2, 0, 0}));
        add("nan_inf", [&op, a, b](const Context& ctx) { return run_binary(ctx, op, a, b, false); });
      } else if (dtype != DType::bool_) {
        const int64_t hi = max_of(dtype), lo = min_of(dtype);
        const bool pow = n == "pow";
        const Operand a = plain(make_host_int(dtype, {8},
                                              pow ? std::vector<int64_t>{0, 1, -1, 2, -3, 0, 7, -2}
                                                  : std::vector<int64_t>{hi, lo, lo, -7, 7, -7, 0, hi}));
        const Operand b = plain(make_host_int(dtype, {8},
                                              pow ? std::vector<int64_t>{0, 5, 3, 10, 3, 3, 0, 7}
                                                  : std::vector<int64_t>{1, -1, 1, 2, -2, -2, 5, hi}));
        add(pow ? "int_edges (0^0, negative bases)" : "int_edges (wraps, truncation, MIN / -1)",
            [&op, a, b](const Context& ctx) { return run_binary(ctx, op, a, b, false); });
        if (n == "div") {
          const HostTensor x = make_host_int(dtype, {3}, {1, 2, 3});
          const HostTensor y = make_host_int(dtype, {3}, {1, 0, 1});
          add("int division by zero is an error", [x, y](const Context& ctx) {
            return expect_error(
                [&] { (void)download(backplane::div(upload(ctx.device, x), upload(ctx.device, y))); }, {});
          });
        }
      }
    }
    // Validation by the core, once per op on its first dtype.
    const DType d0 = (op.comparison ? kAll : kArith).front();
    cases.push_back(
        Case{op.name(), d0, "error: dtype_mismatch (f32 with f64)", op.code, 0, [&op](const Context& ctx) {
               const Tensor a = upload(ctx.device, make_host(DType::f32, {2}, {1, 2}));
               const Tensor b = upload(ctx.device, make_host(DType::f64, {2}, {1, 2}));
               return expect_error([&] { (void)op.fn(a, b); }, {Errc::dtype_mismatch});
             }});
    cases.push_back(
        Case{op.name(), d0, "error: shape_mismatch ([2, 3] with [4])", op.code, 0, [&op](const Context& ctx) {
               const Tensor a = upload(ctx.device, make_host(DType::f32, {2, 3}, {1, 2, 3, 4, 5, 6}));
               const Tensor b = upload(ctx.device, make_host(DType::f32, {4}, {1, 2, 3, 4}));
               return expect_error([&] { (void)op.fn(a, b); }, {Errc::shape_mismatch});
             }});
  }
}

// ---- where ---------------------------------------------------------------------------

struct WhereShapes {
  const char* tag;
  Dims cond, a, b;
};

void add_where_cases(Cases& cases) {
  const std::vector<WhereShapes> shapes = {
      {"same", {2, 3}, {2, 3}, {2, 3}},      {"broadcast", {2, 1}, {3}, {}},
      {"scalar cond", {}, {2, 2}, {2, 2}},   {"broadcast", {4, 1, 5}, {3, 1}, {5}},
      {"all scalars", {}, {}, {}},           {"empty", {0, 3}, {3}, {1}},
      {"long", {300, 257}, {257}, {300, 1}},
  };
  for (const DType dtype : kAll) {
    auto add = [&](std::string name, std::function<Verdict(const Context&)> run) {
      cases.push_back(Case{"where", dtype, std::move(name), BP_OP_WHERE, 0, std::move(run)});
    };
    auto run = [](const Operand& c, const Operand& a, const Operand& b) {
      return [c, a, b](const Context& ctx) {
        const HostTensor want = ref::where(c.logical(), a.logical(), b.logical());
        return check(ctx, backplane::where(c.on(ctx.device), a.on(ctx.device), b.on(ctx.device)), want,
                     Tolerance{});
      };
    };
    for (const WhereShapes& s : shapes) {
      Rng rng(seed_of("where" + std::string(s.tag) + shape_text(s.cond) + std::string(to_string(dtype))));
      const Operand c = plain(random_host(rng, DType::bool_, s.cond, 0, 1));
      const Operand a = plain(random_host(rng, dtype, s.a, -100, 100));
      const Operand b = plain(random_host(rng, dtype, s.b, -100, 100));
      add(std::string(s.tag) + " " + shape_text(s.cond) + ", " + shape_text(s.a) + ", " + shape_text(s.b),
          run(c, a, b));
    }
    Rng rng(seed_of("where strided" + std::string(to_string(dtype))));
    const Operand c = transposed(random_host(rng, DType::bool_, {5, 4}, 0, 1), 0, 1);
    const Operand a = sliced(random_host(rng, dtype, {4, 10}, -100, 100), 1, 0, 10, 2);
    const Operand b = plain(random_host(rng, dtype, {4, 5}, -100, 100));
    add("strided " + c.describe() + ", " + a.describe() + ", " + b.describe(), run(c, a, b));
    if (is_float(dtype)) {
      const Operand cn = plain(make_host(DType::bool_, {5}, {1, 0, 1, 0, 1}));
      const Operand an = plain(make_host(dtype, {5}, {kNaN, 1, kInf, 2, -kInf}));
      const Operand bn = plain(make_host(dtype, {5}, {0, kNaN, 3, -kInf, kNaN}));
      add("nan_inf selected through", run(cn, an, bn));
    }
  }
  cases.push_back(Case{"where", DType::f32, "error: cond not bool", BP_OP_WHERE, 0, [](const Context& ctx) {
                         const Tensor c = upload(ctx.device, make_host(DType::f32, {2}, {1, 0}));
                         const Tensor a = upload(ctx.device, make_host(DType::f32, {2}, {1, 2}));
                         return expect_error([&] { (void)backplane::where(c, a, a); },
                                             {Errc::dtype_mismatch});
                       }});
  cases.push_back(
      Case{"where", DType::f32, "error: a and b of different dtypes", BP_OP_WHERE, 0, [](const Context& ctx) {
             const Tensor c = upload(ctx.device, make_host(DType::bool_, {2}, {1, 0}));
             const Tensor a = upload(ctx.device, make_host(DType::f32, {2}, {1, 2}));
             const Tensor b = upload(ctx.device, make_host(DType::f64, {2}, {1, 2}));
             return expect_error([&] { (void)backplane::where(c, a, b); }, {Errc::dtype_mismatch});
           }});
}

// ---- unary ---------------------------------------------------------------------------

struct UnaryOp {
  int32_t code;  // the op's name is abi.h's: name()
  UnaryFn fn;
  bool ints;      // also on i32/i64
  double lo, hi;  // float input domain
  const char* name() const { return bp_op_name(code); }
};

const std::vector<UnaryOp>& unary_ops() {
  static const std::vector<UnaryOp> ops = {
      {BP_OP_NEG, &backplane::neg, true, -20, 20},          {BP_OP_ABS, &backplane::abs, true, -20, 20},
      {BP_OP_EXP, &backplane::exp, false, -20, 20},         {BP_OP_LOG, &backplane::log, false, 0.01, 100},
      {BP_OP_SQRT, &backplane::sqrt, false, 0.0, 100},      {BP_OP_TANH, &backplane::tanh, false, -20, 20},
      {BP_OP_SIGMOID, &backplane::sigmoid, false, -20, 20}, {BP_OP_RELU, &backplane::relu, true, -20, 20},
      {BP_OP_SIN, &backplane::sin, false, -20, 20},         {BP_OP_COS, &backplane::cos, false, -20, 20},
      {BP_OP_ERF, &backplane::erf, false, -5, 5},
  };
  return ops;
}

// The shared shapes of the unary cases: each case maps an Operand to a result.
std::vector<std::pair<std::string, Operand>> unary_operands(const std::string& op, DType dtype, double lo,
                                                            double hi) {
  const std::vector<std::pair<const char*, Dims>> shapes = {
      {"", {2, 3}}, {"scalar ", {}}, {"empty ", {0, 4}}, {"size-1 ", {1, 1, 5}}, {"long ", {300, 257}},
  };
  std::vector<std::pair<std::string, Operand>> out;
  Rng rng(seed_of("unary" + op + std::string(to_string(dtype))));
  for (const auto& [tag, shape] : shapes) {
    out.emplace_back(std::string(tag) + shape_text(shape), plain(random_host(rng, dtype, shape, lo, hi)));
  }
  Operand t = transposed(random_host(rng, dtype, {7, 5}, lo, hi), 0, 1);
  out.emplace_back("strided " + t.describe(), t);
  Operand s = sliced(random_host(rng, dtype, {3, 20}, lo, hi), 1, 2, 20, 3);
  out.emplace_back("strided " + s.describe(), s);
  if (is_float(dtype)) {
    out.emplace_back("nan_inf",
                     plain(make_host(dtype, {9}, {kNaN, kInf, -kInf, 0.0, -0.0, -1, 1, 0.5, 100})));
  }
  return out;
}

void add_unary_cases(Cases& cases) {
  for (const UnaryOp& op : unary_ops()) {
    for (const DType dtype : op.ints ? kArith : kFloat) {
      const double lo = is_float(dtype) ? op.lo : -1000, hi = is_float(dtype) ? op.hi : 1000;
      for (const auto& [name, operand_ref] : unary_operands(op.name(), dtype, lo, hi)) {
        const Operand operand = operand_ref;
        cases.push_back(Case{op.name(), dtype, name, op.code, 0, [&op, operand](const Context& ctx) {
                               const HostTensor want = ref::unary(op.code, operand.logical());
                               return check(ctx, op.fn(operand.on(ctx.device)), want,
                                            tolerance_for(op.name(), operand.base.dtype));
                             }});
      }
      if (!is_float(dtype)) {
        const Operand edges = plain(make_host_int(dtype, {5}, {min_of(dtype), max_of(dtype), -1, 0, 1}));
        cases.push_back(
            Case{op.name(), dtype, "int_edges (MIN wraps)", op.code, 0, [&op, edges](const Context& ctx) {
                   return check(ctx, op.fn(edges.on(ctx.device)), ref::unary(op.code, edges.logical()),
                                Tolerance{});
                 }});
      }
      if (std::string(op.name()) == "neg") {
        Rng rng(seed_of("neg operator" + std::string(to_string(dtype))));
        const Operand t = plain(random_host(rng, dtype, {3, 4}, lo, hi));
        cases.push_back(Case{"neg", dtype, "operator -", op.code, 0, [&op, t](const Context& ctx) {
                               return check(ctx, -t.on(ctx.device), ref::unary(op.code, t.logical()),
                                            Tolerance{});
                             }});
      }
    }
  }
}

void add_clamp_cases(Cases& cases) {
  for (const DType dtype : kArith) {
    const bool f = is_float(dtype);
    const double lo = f ? -2.5 : -3, hi = f ? 3.0 : 5;
    auto add = [&](std::string name, Operand t, double l, double h) {
      cases.push_back(Case{"clamp", dtype, std::move(name), BP_OP_CLAMP, 0, [t, l, h](const Context& ctx) {
                             return check(ctx, backplane::clamp(t.on(ctx.device), l, h),
                                          ref::clamp(t.logical(), l, h), Tolerance{});
                           }});
    };
    for (const auto& [name, operand] : unary_operands("clamp", dtype, -5, 5)) {
      add(name + " to [" + number(lo) + ", " + number(hi) + "]", operand, lo, hi);
    }
    Rng rng(seed_of("clamp equal" + std::string(to_string(dtype))));
    add("lo == hi", plain(random_host(rng, dtype, {4, 3}, -5, 5)), 1, 1);
    if (!f) {
      add("int_edges", plain(make_host_int(dtype, {5}, {min_of(dtype), max_of(dtype), -1, 0, 1})), -3, 5);
    }
    const HostTensor t = make_host(dtype, {2}, {1, 2});
    cases.push_back(Case{"clamp", dtype, "error: lo > hi", BP_OP_CLAMP, 0, [t](const Context& ctx) {
                           return expect_error([&] { (void)backplane::clamp(upload(ctx.device, t), 2, 1); },
                                               {Errc::invalid_argument});
                         }});
  }
}

// ---- axpby_ (in place) ----------------------------------------------------------------

// y = alpha * y + beta * x, in y. The reference sums the two products in
// double; the tolerance is arithmetic's, scaled by |alpha y| + |beta x| (a
// near-cancelling sum keeps the products' rounding).
void add_axpby_cases(Cases& cases) {
  struct Coeffs {
    double alpha, beta;
  };
  const std::vector<Coeffs> coeffs = {{0.9, 1.0}, {1.0, -0.1}, {0.0, 2.0}, {-1.5, 0.25}};
  for (const DType dtype : kFloat) {
    Rng rng(seed_of("axpby" + std::string(to_string(dtype))));
    // `x_is_y`: x is y itself (the host runs the three ops instead).
    auto add = [&](std::string name, HostTensor y, Operand x, Coeffs c, bool x_is_y = false) {
      name += " alpha " + number(c.alpha) + " beta " + number(c.beta);
      cases.push_back(
          Case{"axpby", dtype, std::move(name), BP_OP_AXPBY, 0, [y, x, c, x_is_y](const Context& ctx) {
                 const Tensor yt = upload(ctx.device, y);
                 const Tensor flat = reshape(yt, {y.numel()});  // sees the update: in place
                 axpby_(yt, c.alpha, x_is_y ? yt : x.on(ctx.device), c.beta);
                 const HostTensor xv = x_is_y ? y : x.logical();
                 std::vector<double> want(y.f.size()), scale(y.f.size());
                 for (std::size_t k = 0; k < want.size(); ++k) {
                   want[k] = c.alpha * y.f[k] + c.beta * xv.f[k];
                   scale[k] = std::fabs(c.alpha * y.f[k]) + std::fabs(c.beta * xv.f[k]);
                 }
                 return check(ctx, flat, make_host(y.dtype, {y.numel()}, want),
                              tolerance_for("axpby", y.dtype), &scale);
               }});
    };
    for (const Coeffs& c : coeffs) {
      for (const Dims& shape : std::vector<Dims>{{2, 3}, {}, {0, 4}, {300, 257}}) {
        const HostTensor y = random_host(rng, dtype, shape, -10, 10);
        const HostTensor x = random_host(rng, dtype, shape, -10, 10);
        add(shape_text(shape), y, plain(x), c);
      }
    }
    const Coeffs c{0.9, -0.5};
    const HostTensor y_of_strided = random_host(rng, dtype, {7, 5}, -3, 3);
    const Operand strided_x = transposed(random_host(rng, dtype, {5, 7}, -3, 3), 0, 1);
    add("strided x " + strided_x.describe(), y_of_strided, strided_x, c);
    const HostTensor y_alone = random_host(rng, dtype, {4, 3}, -3, 3);
    add("x is y [4, 3]", y_alone, plain(y_alone), c, true);
    add("nan_inf", make_host(dtype, {6}, {kNaN, kInf, -kInf, 0.0, -0.0, 1}),
        plain(make_host(dtype, {6}, {1, 1, 2, kNaN, kInf, -kInf})), {0.5, 2.0});
    const HostTensor y = random_host(rng, dtype, {2, 3}, -1, 1);
    cases.push_back(
        Case{"axpby", dtype, "error: x of another shape", BP_OP_AXPBY, 0, [y](const Context& ctx) {
               return expect_error(
                   [&] { axpby_(upload(ctx.device, y), 1, transpose(upload(ctx.device, y), 0, 1), 1); },
                   {Errc::shape_mismatch});
             }});
    cases.push_back(
        Case{"axpby", dtype, "error: y strided", BP_OP_AXPBY, 0, [y](const Context& ctx) {
               const Tensor t = upload(ctx.device, make_host(y.dtype, {3, 3}, std::vector<double>(9, 1)));
               return expect_error([&] { axpby_(transpose(t, 0, 1), 1, t, 1); }, {Errc::invalid_argument});
             }});
    cases.push_back(Case{"axpby", dtype, "error: y requires grad", BP_OP_AXPBY, 0, [y](const Context& ctx) {
                           const Tensor t = upload(ctx.device, y);
                           t.require_grad();
                           return expect_error([&] { axpby_(t, 1, upload(ctx.device, y), 1); },
                                               {Errc::invalid_argument});
                         }});
  }
  const HostTensor ints = make_host_int(DType::i32, {3}, {1, 2, 3});
  cases.push_back(Case{"axpby", DType::i32, "error: i32 (axpby is for floats)", BP_OP_INVALID, 0,
                       [ints](const Context& ctx) {
                         const Tensor t = upload(ctx.device, ints);
                         return expect_error([&] { axpby_(t, 1, t, 1); }, {Errc::dtype_mismatch});
                       }});
}

}  // namespace

void add_elementwise_cases(Cases& cases) {
  add_binary_cases(cases);
  add_where_cases(cases);
  add_unary_cases(cases);
  add_clamp_cases(cases);
  add_axpby_cases(cases);
}

}  // namespace backplane::conformance
