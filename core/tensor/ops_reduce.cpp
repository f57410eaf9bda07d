// Reductions (sum, mean, max, min, argmax, argmin) over one axis or all axes,
// and softmax / log_softmax. The plugin gets contiguous inputs (the core
// copies a strided one first) and, for a reduction, an output with the
// input's rank and extent 1 on the axis; keepdim=false and all-axes results
// are reshapes of that output done here.
#include "autograd/autograd.hpp"
#include "tensor/op_common.hpp"
#include "tensor/placement.hpp"

namespace backplane {
namespace {

using detail::TensorImpl;

// What abi.h's op table and its notes say of a reduction.
struct ReduceRule {
  bool needs_values;  // max/min/argmax/argmin: an empty axis has no answer
  bool index_output;  // ARG_REDUCE: argmax/argmin write i64
};

ReduceRule rule(int32_t op) noexcept {
  const bool arg = bp_op_info_of(op)->kind == BP_OP_KIND_ARG_REDUCE;
  return {op != BP_OP_SUM && op != BP_OP_MEAN, arg};
}

const TensorImpl& checked_input(const Tensor& t, int32_t op) {
  const char* api = detail::op_name(op);
  const TensorImpl& x = detail::operand(t, api, "the");
  detail::require_op_dtype(op, x.dtype, api, "the input");
  return x;
}

// Runs `op` on the contiguous `x` described with (shape, ndim) along axis,
// into `out` described with out_shape (same ndim, extent 1 on axis).
void run_reduce(const detail::Placement& p, int32_t op, const TensorImpl& x, const Shape& in_shape,
                const TensorImpl& out, const Shape& out_shape, int axis) {
  const Shape in_strides = detail::contiguous_strides(in_shape);
  const Shape out_strides = detail::contiguous_strides(out_shape);
  bp_tensor in = detail::describe(x);
  in.ndim = in_shape.rank();
  in.shape = in_shape.data();
  in.strides = in_strides.data();
  bp_tensor o = detail::describe(out);
  o.ndim = out_shape.rank();
  o.shape = out_shape.data();
  o.strides = out_strides.data();
  bp_op_attrs attrs = detail::make_attrs();
  attrs.axis = axis;
  p.execute(op, &in, 1, &o, &attrs);
}

Tensor reduce_axis(int32_t op, const Tensor& t, int64_t axis_arg, bool keepdim) {
  const char* api = detail::op_name(op);
  const ReduceRule r = rule(op);
  const TensorImpl& x0 = checked_input(t, op);
  const int axis = detail::normalize_axis(axis_arg, x0.shape.rank(), api);
  if (r.needs_values && x0.shape[axis] == 0) {
    throw Error(Errc::invalid_argument, std::string(api) + ": axis " + std::to_string(axis_arg) + " of " +
                                            x0.shape.to_string() + " is empty, and " + api +
                                            " of no elements is undefined (sum and mean accept empty axes)");
  }
  Shape kept = x0.shape;
  kept[axis] = 1;
  // Dense first (a placed COPY when strided), then placed itself.
  const auto x = detail::as_contiguous(detail::Access::impl(t), api);
  const TensorImpl* operands[1] = {x.get()};
  const DType out_dtype = r.index_output ? DType::i64 : x0.dtype;
  const detail::Placement p(op, x0.dtype, out_dtype, api, operands, 1);
  auto out = p.allocate(kept, out_dtype);
  if (kept.numel() > 0) run_reduce(p, op, p[0], x->shape, *out, kept, axis);
  if (!keepdim) {
    std::vector<int64_t> dropped = kept.to_vector();
    dropped.erase(dropped.begin() + axis);
    out->shape = Shape(dropped);
    out->strides = detail::contiguous_strides(out->shape);
  }
  return detail::Access::make_tensor(std::move(out));
}

// Over all axes: the contiguous input read as 1-D, reduced along axis 0,
// giving a 0-d result (argmax/argmin: the flat row-major index).
Tensor reduce_all(int32_t op, const Tensor& t) {
  const char* api = detail::op_name(op);
  const ReduceRule r = rule(op);
  const TensorImpl& x0 = checked_input(t, op);
  if (r.needs_values && x0.shape.numel() == 0) {
    throw Error(Errc::invalid_argument,
                std::string(api) + ": the tensor " + x0.shape.to_string() + " is empty, and " + api +
                    " of no elements is undefined (sum and mean accept empty tensors)");
  }
  const auto x = detail::as_contiguous(detail::Access::impl(t), api);
  const TensorImpl* operands[1] = {x.get()};
  const DType out_dtype = r.index_output ? DType::i64 : x0.dtype;
  const detail::Placement p(op, x0.dtype, out_dtype, api, operands, 1);
  auto out = p.allocate(Shape{}, out_dtype);
  run_reduce(p, op, p[0], Shape{x->shape.numel()}, *out, Shape{1}, 0);
  return detail::Access::make_tensor(std::move(out));
}

Tensor softmax_like(int32_t op, const Tensor& t, int64_t axis_arg) {
  const char* api = detail::op_name(op);
  const TensorImpl& x0 = detail::operand(t, api, "the");
  detail::require_op_dtype(op, x0.dtype, api, "the input");
  const int axis = detail::normalize_axis(axis_arg, x0.shape.rank(), api);
  const auto x = detail::as_contiguous(detail::Access::impl(t), api);
  const TensorImpl* operands[1] = {x.get()};
  const detail::Placement p(op, x0.dtype, x0.dtype, api, operands, 1);
  auto out = p.allocate(x0.shape, x0.dtype);
  if (x0.shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  const bp_tensor in = detail::describe(p[0]);
  const bp_tensor o = detail::describe(*out);
  bp_op_attrs attrs = detail::make_attrs();
  attrs.axis = axis;
  p.execute(op, &in, 1, &o, &attrs);
  return detail::Access::make_tensor(std::move(out));
}

// The differentiable ops: the op, then a node when the input requires grad.
Tensor tracked_reduce(int32_t op, const Tensor& t, int64_t axis, bool keepdim) {
  Tensor out = reduce_axis(op, t, axis, keepdim);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_reduce(op, t, axis, keepdim, out);
  return out;
}

Tensor tracked_reduce_all(int32_t op, const Tensor& t) {
  Tensor out = reduce_all(op, t);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_reduce_all(op, t, out);
  return out;
}

Tensor tracked_softmax(int32_t op, const Tensor& t, int64_t axis) {
  Tensor out = softmax_like(op, t, axis);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_softmax(op, t, axis, out);
  return out;
}

}  // namespace

Tensor sum(const Tensor& t, int64_t axis, bool keepdim) {
  return tracked_reduce(BP_OP_SUM, t, axis, keepdim);
}
Tensor sum(const Tensor& t) { return tracked_reduce_all(BP_OP_SUM, t); }
Tensor mean(const Tensor& t, int64_t axis, bool keepdim) {
  return tracked_reduce(BP_OP_MEAN, t, axis, keepdim);
}
Tensor mean(const Tensor& t) { return tracked_reduce_all(BP_OP_MEAN, t); }
Tensor max(const Tensor& t, int64_t axis, bool keepdim) {
  return tracked_reduce(BP_OP_MAX, t, axis, keepdim);
}
Tensor max(const Tensor& t) { return tracked_reduce_all(BP_OP_MAX, t); }
Tensor min(const Tensor& t, int64_t axis, bool keepdim) {
  return tracked_reduce(BP_OP_MIN, t, axis, keepdim);
}
Tensor min(const Tensor& t) { return tracked_reduce_all(BP_OP_MIN, t); }
Tensor argmax(const Tensor& t, int64_t axis, bool keepdim) {
  return reduce_axis(BP_OP_ARGMAX, t, axis, keepdim);
}
Tensor argmax(const Tensor& t) { return reduce_all(BP_OP_ARGMAX, t); }
Tensor argmin(const Tensor& t, int64_t axis, bool keepdim) {
  return reduce_axis(BP_OP_ARGMIN, t, axis, keepdim);
}
Tensor argmin(const Tensor& t) { return reduce_all(BP_OP_ARGMIN, t); }

Tensor softmax(const Tensor& t, int64_t axis) { return tracked_softmax(BP_OP_SOFTMAX, t, axis); }
Tensor log_softmax(const Tensor& t, int64_t axis) { return tracked_softmax(BP_OP_LOG_SOFTMAX, t, axis); }

}  // namespace backplane
