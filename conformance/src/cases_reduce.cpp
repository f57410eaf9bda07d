// Cases of the reductions (sum mean max min argmax argmin): one axis with
// and without keepdim, negative axes, all axes, size-1 and empty axes,
// strided inputs, NaN/Inf, ties, and integer sums that wrap.
#include "reference.hpp"
#include "suite.hpp"

#include <backplane/ops.hpp>

#include <limits>
#include <optional>

namespace backplane::conformance {
namespace {

using Dims = std::vector<int64_t>;
using AxisFn = Tensor (*)(const Tensor&, int64_t, bool);
using AllFn = Tensor (*)(const Tensor&);

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct ReduceOp {
  int32_t code;  // the op's name is abi.h's: name()
  ref::Reduce ref;
  AxisFn axis_fn;
  AllFn all_fn;
  bool ints;  // also on i32/i64 (mean is float-only)
  const char* name() const { return bp_op_name(code); }
};

const std::vector<ReduceOp>& reduce_ops() {
  static const std::vector<ReduceOp> ops = {
      {BP_OP_SUM, ref::Reduce::sum, static_cast<AxisFn>(&backplane::sum), static_cast<AllFn>(&backplane::sum),
       true},
      {BP_OP_MEAN, ref::Reduce::mean, static_cast<AxisFn>(&backplane::mean),
       static_cast<AllFn>(&backplane::mean), false},
      {BP_OP_MAX, ref::Reduce::max, static_cast<AxisFn>(&backplane::max), static_cast<AllFn>(&backplane::max),
       true},
      {BP_OP_MIN, ref::Reduce::min, static_cast<AxisFn>(&backplane::min), static_cast<AllFn>(&backplane::min),
       true},
      {BP_OP_ARGMAX, ref::Reduce::argmax, static_cast<AxisFn>(&backplane::argmax),
       static_cast<AllFn>(&backplane::argmax), true},
      {BP_OP_ARGMIN, ref::Reduce::argmin, static_cast<AxisFn>(&backplane::argmin),
       static_cast<AllFn>(&backplane::argmin), true},
  };
  return ops;
}

// One reduction case: an input, and an axis (nullopt: all axes).
struct Spec {
  std::string name;
  Operand input;
  std::optional<int64_t> axis;
  bool keepdim = false;
};

Verdict run_reduce(const Context& ctx, const ReduceOp& op, const Spec& s) {
  const ref::Reduced want = ref::reduce(op.ref, s.input.logical(), s.axis, s.keepdim);
  const Tensor t = s.input.on(ctx.device);
  const Tensor got = s.axis ? op.axis_fn(t, *s.axis, s.keepdim) : op.all_fn(t);
  return check(ctx, got, want.value, tolerance_for(op.name(), s.input.base.dtype), &want.scale);
}

std::string axis_name(const Dims& shape, std::optional<int64_t> axis, bool keepdim) {
  if (!axis) return "all " + shape_text(shape);
  return shape_text(shape) + " axis " + std::to_string(*axis) + (keepdim ? " keepdim" : "");
}

std::vector<Spec> specs(const ReduceOp& op, DType dtype) {
  const bool f = is_float(dtype);
  const double lo = f ? -10 : -100, hi = f ? 10 : 100;
  Rng rng(seed_of(std::string("reduce") + op.name() + std::string(to_string(dtype))));
  std::vector<Spec> out;
  auto add = [&](const Dims& shape, std::optional<int64_t> axis, bool keepdim, const char* tag = "") {
    out.push_back(Spec{std::string(tag) + axis_name(shape, axis, keepdim),
                       plain(random_host(rng, dtype, shape, lo, hi)), axis, keepdim});
  };
  add({3, 4}, 0, false);
  add({3, 4}, 1, true);
  add({3, 4}, -1, false);
  add({2, 3, 4}, 1, false);
  add({2, 3, 4}, -3, true);
  add({2, 3, 4}, 2, true);
  add({5}, 0, false);
  add({5}, 0, true);
  add({1, 1}, 0, false, "size-1 ");
  add({4, 1}, 1, false, "size-1 axis ");
  add({300, 257}, 0, false, "long ");
  add({300, 257}, 1, false, "long ");
  add({70001}, 0, false, "long ");
  add({3, 4}, std::nullopt, false);
  add({2, 3, 4}, std::nullopt, false);
  add({}, std::nullopt, false, "scalar ");
  add({1}, std::nullopt, false, "size-1 ");
  add({300, 257}, std::nullopt, false, "long ");
  add({70001}, std::nullopt, false, "long ");
  add({0, 3}, 1, false, "empty (non-reduced) ");
  const bool needs_elements = op.ref != ref::Reduce::sum && op.ref != ref::Reduce::mean;
  if (!needs_elements) {  // an empty reduced axis: sum 0, mean NaN; the others are errors (below)
    add({0, 3}, 0, false, "empty axis ");
    add({0, 3}, std::nullopt, false, "empty ");
  }
  for (const std::optional<int64_t> axis :
       {std::optional<int64_t>(0), std::optional<int64_t>(1), std::optional<int64_t>()}) {
    Operand t = transposed(random_host(rng, dtype, {7, 5}, lo, hi), 0, 1);
    out.push_back(
        Spec{"strided " + t.describe() + (axis ? " axis " + std::to_string(*axis) : " all"), t, axis, false});
  }
  Operand s = sliced(random_host(rng, dtype, {4, 30}, lo, hi), 1, 1, 30, 4);
  out.push_back(Spec{"strided " + s.describe() + " axis 1", s, 1, false});
  // Ties: the first index wins for argmax/argmin.
  {
    std::vector<double> v(12);
    for (double& x : v) x = rng.pick({1.0, 2.0, 3.0});
    const Operand t = plain(make_host(dtype, {3, 4}, v));
    out.push_back(Spec{"ties [3, 4] axis 1", t, 1, false});
    out.push_back(Spec{"ties [3, 4] axis 0", t, 0, false});
    out.push_back(Spec{"ties all [3, 4]", t, std::nullopt, false});
  }
  if (f) {
    const Operand t = plain(make_host(dtype, {4, 4},
                                      {1, kNaN, 3, 2,      //
                                       kInf, 1, 2, 3,      //
                                       -kInf, kInf, 0, 1,  //
                                       2, -kInf, 5, -1}));
    out.push_back(Spec{"nan_inf [4, 4] axis 1", t, 1, false});
    out.push_back(Spec{"nan_inf [4, 4] axis 0", t, 0, false});
    out.push_back(Spec{"nan_inf all [4, 4]", t, std::nullopt, false});
    const Operand no_nan = plain(make_host(dtype, {2, 3}, {kInf, 1, 2, 3, -kInf, 4}));
    out.push_back(Spec{"inf [2, 3] axis 1", no_nan, 1, false});
  } else if (op.ref == ref::Reduce::sum) {
    const int64_t big =
        dtype == DType::i32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
    const Operand t = plain(make_host_int(dtype, {2, 4}, {big, big, 5, -3, big, 1, 0, 0}));
    out.push_back(Spec{"int overflow wraps [2, 4] axis 1", t, 1, false});
    out.push_back(Spec{"int overflow wraps all [2, 4]", t, std::nullopt, false});
  }
  return out;
}

}  // namespace

void add_reduction_cases(Cases& cases) {
  for (const ReduceOp& op : reduce_ops()) {
    const std::vector<DType> dtypes = op.ints
                                          ? std::vector<DType>{DType::f32, DType::f64, DType::i32, DType::i64}
                                          : std::vector<DType>{DType::f32, DType::f64};
    for (const DType dtype : dtypes) {
      for (Spec& s : specs(op, dtype)) {
        std::string name = s.name;
        cases.push_back(Case{op.name(), dtype, std::move(name), op.code, 0,
                             [&op, s = std::move(s)](const Context& ctx) { return run_reduce(ctx, op, s); }});
      }
      const bool needs_elements = op.ref != ref::Reduce::sum && op.ref != ref::Reduce::mean;
      const HostTensor empty = make_host(dtype, {0, 3}, {});
      const HostTensor t = make_host(dtype, {3, 4}, std::vector<double>(12, 1.0));
      if (needs_elements) {
        cases.push_back(Case{op.name(), dtype, "error: empty axis [0, 3] axis 0", op.code, 0,
                             [&op, empty](const Context& ctx) {
                               return expect_error(
                                   [&] { (void)download(op.axis_fn(upload(ctx.device, empty), 0, false)); },
                                   {Errc::invalid_argument});
                             }});
        cases.push_back(Case{
            op.name(), dtype, "error: all of empty [0, 3]", op.code, 0, [&op, empty](const Context& ctx) {
              return expect_error([&] { (void)download(op.all_fn(upload(ctx.device, empty))); },
                                  {Errc::invalid_argument});
            }});
      }
      cases.push_back(
          Case{op.name(), dtype, "error: axis 2 of [3, 4]", op.code, 0, [&op, t](const Context& ctx) {
                 return expect_error([&] { (void)op.axis_fn(upload(ctx.device, t), 2, false); },
                                     {Errc::invalid_argument});
               }});
    }
  }
}

}  // namespace backplane::conformance
