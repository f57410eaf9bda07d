// Elementwise ops: binary arithmetic and comparisons (NumPy broadcasting,
// broadcast operands described with stride 0, never materialised), where
// with three-way broadcasting, unary math, clamp and cast. Inputs may be
// strided; outputs are contiguous.
#include "autograd/autograd.hpp"
#include "tensor/op_common.hpp"
#include "tensor/placement.hpp"

#include <cmath>
#include <optional>

namespace backplane {
namespace {

using detail::TensorImpl;

// binary() for operands of different shapes: the NumPy broadcast of both,
// the operands described as broadcast views (stride 0), never materialised.
// Out of line, so the same-shape path builds no Shape at all.
[[gnu::noinline]] Tensor binary_broadcast(int32_t op, const TensorImpl& x, const TensorImpl& y,
                                          bool comparison, const char* api) {
  const Shape out_shape = detail::broadcast_for(api, x.shape, y.shape);
  const TensorImpl* operands[2] = {&x, &y};
  const DType out_dtype = comparison ? DType::bool_ : x.dtype;
  const detail::Placement p(op, x.dtype, out_dtype, api, operands, 2);

  auto out = p.allocate(out_shape, out_dtype);
  if (out_shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  bp_tensor in[2] = {detail::describe(p[0]), detail::describe(p[1])};
  // Operands already of the output's shape pass their own strides.
  std::optional<Shape> xs, ys;
  if (!(x.shape == out_shape)) {
    xs.emplace(detail::broadcast_strides(x, out_shape));
    in[0].ndim = out_shape.rank();
    in[0].shape = out->shape.data();
    in[0].strides = xs->data();
  }
  if (!(y.shape == out_shape)) {
    ys.emplace(detail::broadcast_strides(y, out_shape));
    in[1].ndim = out_shape.rank();
    in[1].shape = out->shape.data();
    in[1].strides = ys->data();
  }
  const bp_tensor o = detail::describe(*out);
  p.execute(op, in, 2, &o);
  return detail::Access::make_tensor(std::move(out));
}

// The per-op hot path (a 16-element add should cost < 100 ns over the
// kernel): no allocation besides the output, no string unless it throws, and
// no Shape built or copied when the operands have one shape.
Tensor binary(int32_t op, const Tensor& a, const Tensor& b) {
  const char* api = detail::op_name(op);
  const bool comparison = bp_op_info_of(op)->kind == BP_OP_KIND_COMPARE;
  const TensorImpl& x = detail::operand(a, api, "left");
  const TensorImpl& y = detail::operand(b, api, "right");
  detail::same_device(x, y, api);
  detail::same_dtype(x, y, api);
  detail::require_op_dtype(op, x.dtype, api, "the operands");
  if (!(x.shape == y.shape)) [[unlikely]]
    return binary_broadcast(op, x, y, comparison, api);
  const TensorImpl* operands[2] = {&x, &y};
  const DType out_dtype = comparison ? DType::bool_ : x.dtype;
  const detail::Placement p(op, x.dtype, out_dtype, api, operands, 2);

  auto out = p.allocate(x.shape, out_dtype);
  if (x.shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  const bp_tensor in[2] = {detail::describe(p[0]), detail::describe(p[1])};
  const bp_tensor o = detail::describe(*out);
  p.execute(op, in, 2, &o);
  return detail::Access::make_tensor(std::move(out));
}

// inputs[0] has the output's shape and dtype; any strides.
Tensor unary(int32_t op, const Tensor& t, const bp_op_attrs* attrs = nullptr) {
  const char* api = detail::op_name(op);
  const TensorImpl& x = detail::operand(t, api, "the");
  detail::require_op_dtype(op, x.dtype, api, "the input");
  const TensorImpl* operands[1] = {&x};
  const detail::Placement p(op, x.dtype, x.dtype, api, operands, 1);
  auto out = p.allocate(x.shape, x.dtype);
  if (x.shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  const bp_tensor in = detail::describe(p[0]);
  const bp_tensor o = detail::describe(*out);
  p.execute(op, &in, 1, &o, attrs);
  return detail::Access::make_tensor(std::move(out));
}

// The differentiable ops: the op, then a node when an input requires grad
// (the only autodiff cost otherwise is that test).
Tensor tracked_binary(int32_t op, const Tensor& a, const Tensor& b) {
  Tensor out = binary(op, a, b);
  if (detail::any_requires_grad(a, b)) [[unlikely]]
    detail::record_binary(op, a, b, out);
  return out;
}

Tensor tracked_unary(int32_t op, const Tensor& t) {
  Tensor out = unary(op, t);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_unary(op, t, out);
  return out;
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  Shape out = a.rank() >= b.rank() ? a : b;
  for (int i = 0; i < rank; ++i) {
    const int ia = i - (rank - a.rank());
    const int ib = i - (rank - b.rank());
    const int64_t da = ia < 0 ? 1 : a[ia];
    const int64_t db = ib < 0 ? 1 : b[ib];
    if (da != db && da != 1 && db != 1) {
      throw Error(Errc::shape_mismatch, "shapes " + a.to_string() + " and " + b.to_string() +
                                            " cannot be broadcast together (dimension " + std::to_string(i) +
                                            ": " + std::to_string(da) + " vs " + std::to_string(db) + ")");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return tracked_binary(BP_OP_ADD, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return tracked_binary(BP_OP_SUB, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return tracked_binary(BP_OP_MUL, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return tracked_binary(BP_OP_DIV, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return tracked_binary(BP_OP_POW, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return tracked_binary(BP_OP_MAXIMUM, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return tracked_binary(BP_OP_MINIMUM, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary(BP_OP_EQ, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(BP_OP_NE, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(BP_OP_LT, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(BP_OP_LE, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(BP_OP_GT, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(BP_OP_GE, a, b); }

static Tensor where_forward(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const TensorImpl& c = detail::operand(cond, "where", "cond");
  const TensorImpl& x = detail::operand(a, "where", "a");
  const TensorImpl& y = detail::operand(b, "where", "b");
  detail::same_device(c, x, "where");
  detail::same_device(x, y, "where");
  detail::require_dtype(c.dtype == DType::bool_, c.dtype, "where", "cond",
                        "a bool cond (make one with a comparison such as gt)");
  detail::same_dtype(x, y, "where");
  const Shape out_shape =
      detail::broadcast_for("where", detail::broadcast_for("where", c.shape, x.shape), y.shape);
  // The value operands first: they name the dtype the op is asked about.
  const TensorImpl* ops[3] = {&x, &y, &c};
  const detail::Placement p(BP_OP_WHERE, x.dtype, x.dtype, "where", ops, 3);

  auto out = p.allocate(out_shape, x.dtype);
  if (out_shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  Shape strides[3];
  bp_tensor in[3];
  for (int i = 0; i < 3; ++i) {
    const TensorImpl& operand = p[(i + 2) % 3];  // the plugin takes (cond, a, b)
    in[i] = detail::describe(operand);
    strides[i] = detail::broadcast_strides(operand, out_shape);
    in[i].ndim = out_shape.rank();
    in[i].shape = out->shape.data();
    in[i].strides = strides[i].data();
  }
  const bp_tensor o = detail::describe(*out);
  p.execute(BP_OP_WHERE, in, 3, &o);
  return detail::Access::make_tensor(std::move(out));
}

Tensor neg(const Tensor& t) { return tracked_unary(BP_OP_NEG, t); }
Tensor abs(const Tensor& t) { return tracked_unary(BP_OP_ABS, t); }
Tensor relu(const Tensor& t) { return tracked_unary(BP_OP_RELU, t); }
Tensor exp(const Tensor& t) { return tracked_unary(BP_OP_EXP, t); }
Tensor log(const Tensor& t) { return tracked_unary(BP_OP_LOG, t); }
Tensor sqrt(const Tensor& t) { return tracked_unary(BP_OP_SQRT, t); }
Tensor tanh(const Tensor& t) { return tracked_unary(BP_OP_TANH, t); }
Tensor sigmoid(const Tensor& t) { return tracked_unary(BP_OP_SIGMOID, t); }
Tensor sin(const Tensor& t) { return tracked_unary(BP_OP_SIN, t); }
Tensor cos(const Tensor& t) { return tracked_unary(BP_OP_COS, t); }
Tensor erf(const Tensor& t) { return tracked_unary(BP_OP_ERF, t); }

namespace {

[[noreturn, gnu::cold]] void axpby_refused(const TensorImpl& y, const TensorImpl& x, const char* why) {
  if (std::string_view(why) == "shape")
    throw Error(Errc::shape_mismatch, "axpby_: x has shape " + x.shape.to_string() + " but y has shape " +
                                          y.shape.to_string() + "; they must match (no broadcasting)");
  if (std::string_view(why) == "strided")
    throw Error(Errc::invalid_argument,
                "axpby_: y must be contiguous (it is a strided view); update a contiguous tensor, or "
                "write y.copy_(add(mul(y, a), mul(x, b)))");
  throw Error(Errc::invalid_argument,
              "axpby_ is not differentiable and would change a tensor autodiff tracks; call it under a "
              "NoGradGuard (as an optimizer step does)");
}

}  // namespace

void axpby_(const Tensor& y_, double alpha, const Tensor& x_, double beta) {
  constexpr const char* api = "axpby_";
  const TensorImpl& y = detail::operand(y_, api, "y");
  const TensorImpl& x = detail::operand(x_, api, "x");
  detail::same_device(y, x, api);
  detail::same_dtype(y, x, api);
  detail::require_op_dtype(BP_OP_AXPBY, y.dtype, api, "y");
  if (!(y.shape == x.shape)) [[unlikely]]
    axpby_refused(y, x, "shape");
  if (!detail::is_contiguous(y)) [[unlikely]]
    axpby_refused(y, x, "strided");
  if (grad_enabled() && detail::any_requires_grad(y_, x_)) [[unlikely]]
    axpby_refused(y, x, "grad");
  if (y.shape.numel() == 0) return;
  const auto xc = detail::as_contiguous(detail::Access::impl(x_), api);
  const TensorImpl* operands[2] = {&y, xc.get()};
  // One call where x lies apart from y (another storage) and a device runs
  // axpby on y's own memory: y's device, or its op_fallback device when that
  // holds y's bytes or imports them (the one rule, see Placement::InPlace).
  // Otherwise the ops it stands for (each placed by the rule), then a copy_
  // into y.
  if (y.storage != xc->storage) [[likely]] {
    const detail::Placement p(detail::Placement::InPlace{}, BP_OP_AXPBY, y.dtype, api, operands, 2);
    if (p.ok()) [[likely]] {
      bp_op_attrs attrs = detail::make_attrs();
      attrs.scalar0 = alpha;
      attrs.scalar1 = beta;
      const bp_tensor in[2] = {detail::describe(p[0]), detail::describe(p[1])};
      p.execute(BP_OP_AXPBY, in, 2, &in[0], &attrs);
      y.storage->invalidate_replica();  // a copy of y on another device is stale now
      return;
    }
  }
  NoGradGuard no_grad;
  const Device device = y_.device();
  // A factor of 1 is exact: no op for it, the same bits.
  auto scaled = [&](const Tensor& t, double c) {
    return c == 1.0 ? t : mul(t, full(device, Shape{}, c, y.dtype));
  };
  y_.copy_(add(scaled(y_, alpha), scaled(detail::Access::make_tensor(xc), beta)));
}

Tensor clamp(const Tensor& t, double lo, double hi) {
  if (std::isnan(lo) || std::isnan(hi))
    throw Error(Errc::invalid_argument, "clamp: bounds must not be NaN (got lo " +
                                            detail::number_to_string(lo) + ", hi " +
                                            detail::number_to_string(hi) + ")");
  if (lo > hi)
    throw Error(Errc::invalid_argument, "clamp: lo " + detail::number_to_string(lo) + " is greater than hi " +
                                            detail::number_to_string(hi) + "; pass lo <= hi");
  if (t.defined() && detail::is_integer_dtype(detail::Access::impl(t)->dtype)) {
    // No promotion: an integer tensor takes integer bounds it can hold.
    for (const double bound : {lo, hi}) {
      if (std::isfinite(bound) && std::trunc(bound) != bound)
        throw Error(Errc::invalid_argument, "clamp: bound " + detail::number_to_string(bound) +
                                                " is not an integer, "
                                                "but the tensor is " +
                                                std::string(to_string(detail::Access::impl(t)->dtype)) +
                                                "; cast the tensor to a float dtype first");
      detail::require_representable(bound, detail::Access::impl(t)->dtype, "clamp", "bound");
    }
  }
  bp_op_attrs attrs = detail::make_attrs();
  attrs.scalar0 = lo;
  attrs.scalar1 = hi;
  Tensor out = unary(BP_OP_CLAMP, t, &attrs);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_clamp(t, lo, hi, out);
  return out;
}

static Tensor cast_forward(const Tensor& t, DType dtype) {
  const TensorImpl& x = detail::operand(t, "cast", "the");
  detail::require_known_dtype(dtype, "cast");
  if (dtype == x.dtype) return t;  // tensors are immutable through the API: sharing is safe
  // The plugin is asked about both ends of the conversion (Placement does for CAST).
  const TensorImpl* operands[1] = {&x};
  const detail::Placement p(BP_OP_CAST, x.dtype, dtype, "cast", operands, 1);
  auto out = p.allocate(x.shape, dtype);
  if (x.shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  bp_op_attrs attrs = detail::make_attrs();
  attrs.dtype = static_cast<int32_t>(dtype);
  const bp_tensor in = detail::describe(p[0]);
  const bp_tensor o = detail::describe(*out);
  p.execute(BP_OP_CAST, &in, 1, &o, &attrs);
  return detail::Access::make_tensor(std::move(out));
}

// ---- autodiff: where and cast record their node here --------------------------

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = where_forward(cond, a, b);
  if (detail::any_requires_grad(a, b)) [[unlikely]]
    detail::record_where(cond, a, b, out);
  return out;
}

Tensor cast(const Tensor& t, DType dtype) {
  Tensor out = cast_forward(t, dtype);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_cast(t, out);
  return out;
}

}  // namespace backplane
