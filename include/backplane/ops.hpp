// Ops on tensors. The core validates devices, dtypes, shapes (NumPy
// broadcasting) and axes before anything reaches a plugin; a device that
// cannot run an op on a dtype gives Errc::unsupported_op naming op, dtype
// and backend.
//
// dtype rules (no implicit promotion anywhere):
//  - binary arithmetic (add sub mul div pow maximum minimum): both operands
//    one dtype, f32/f64/i32/i64; the result has it. Integer div truncates
//    toward zero; integer division by zero is an error, not a trap; integer
//    overflow wraps. pow on integers requires a non-negative exponent.
//  - comparisons (eq ne lt le gt ge): one dtype (any numeric or bool); the
//    result is bool. where(cond, a, b): cond bool, a and b one dtype.
//  - unary math (exp log sqrt tanh sigmoid sin cos erf): f32/f64. neg, abs,
//    relu, clamp: f32/f64/i32/i64.
//  - reductions: sum/max/min on f32/f64/i32/i64 keep the dtype (sum of
//    integers wraps); mean on f32/f64; argmax/argmin give i64.
//  - matmul, softmax, log_softmax: f32/f64.
//  - shape ops (reshape, permute, transpose, slice, cat, index_select,
//    gather) and cast, copy: every dtype. Indices are i64.
// Errors: Errc::dtype_mismatch, shape_mismatch, invalid_argument (bad axis,
// bad slice, bad reshape, bad scalar: clamp lo > hi, arange step 0, a value
// an integer dtype cannot hold), device_mismatch, unsupported_op.
// Axes may be negative (counted from the end), as in NumPy.
//
// Thread-safety: every function may be called from many threads at once,
// also with the same input tensors: an op reads its inputs and returns new
// tensors (axpby_ alone writes one of its own, y, as Tensor::copy_ does). Calls on one device are ordered as
// they enter its plugin. An input must not be overwritten (Tensor::copy_) or re-marked (require_grad,
// set_distributed_params) by another thread while an op reads it. Autodiff
// recording follows the calling thread's grad mode (<backplane/autograd.hpp>).
#ifndef BACKPLANE_OPS_HPP_
#define BACKPLANE_OPS_HPP_

#include <backplane/export.hpp>

#include <backplane/tensor.hpp>

#include <cstdint>
#include <vector>

namespace backplane {

// ---- creation --------------------------------------------------------------
BACKPLANE_API Tensor zeros(const Device& device, const Shape& shape, DType dtype = DType::f32);
BACKPLANE_API Tensor ones(const Device& device, const Shape& shape, DType dtype = DType::f32);
BACKPLANE_API Tensor full(const Device& device, const Shape& shape, double value, DType dtype = DType::f32);
// [start, end) in steps of step (non-zero): ceil((end - start) / step) elements.
BACKPLANE_API Tensor arange(const Device& device, double start, double end, double step = 1.0,
                            DType dtype = DType::f32);
// Uniform on [low, high) and normal(mean, stddev), f32/f64. The same seed on
// the same backend gives the same values.
BACKPLANE_API Tensor rand_uniform(const Device& device, const Shape& shape, uint64_t seed, double low = 0.0,
                                  double high = 1.0, DType dtype = DType::f32);
BACKPLANE_API Tensor randn(const Device& device, const Shape& shape, uint64_t seed, double mean = 0.0,
                           double stddev = 1.0, DType dtype = DType::f32);

// ---- elementwise binary, with broadcasting -----------------------------------
BACKPLANE_API Tensor add(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor sub(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor mul(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor div(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor pow(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor maximum(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor minimum(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor eq(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor ne(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor lt(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor le(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor gt(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor ge(const Tensor& a, const Tensor& b);
// cond ? a : b, all three broadcast together.
BACKPLANE_API Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// ---- elementwise unary -------------------------------------------------------
BACKPLANE_API Tensor neg(const Tensor& t);
BACKPLANE_API Tensor abs(const Tensor& t);
BACKPLANE_API Tensor exp(const Tensor& t);
BACKPLANE_API Tensor log(const Tensor& t);
BACKPLANE_API Tensor sqrt(const Tensor& t);
BACKPLANE_API Tensor tanh(const Tensor& t);
BACKPLANE_API Tensor sigmoid(const Tensor& t);
BACKPLANE_API Tensor relu(const Tensor& t);
BACKPLANE_API Tensor sin(const Tensor& t);
BACKPLANE_API Tensor cos(const Tensor& t);
// The Gauss error function, 2/sqrt(pi) * integral from 0 to x of exp(-s^2) ds.
BACKPLANE_API Tensor erf(const Tensor& t);
// Elementwise min(max(t, lo), hi); lo <= hi (Errc::invalid_argument otherwise).
BACKPLANE_API Tensor clamp(const Tensor& t, double lo, double hi);

// ---- in-place update -----------------------------------------------------------
// y = alpha * y + beta * x, in y (f32/f64; x of y's shape, dtype and device; y
// contiguous). Rounds as y.copy_(add(mul(y, alpha), mul(x, beta))) does, bit
// for bit. Where y's device lacks the fused op (abi.h's axpby), it runs on
// the backend's op_fallback device when that device reaches y's own memory
// (it holds y's bytes, or both are host_visible); otherwise, or when x
// shares y's storage, it is those three ops and the copy. Not differentiable: call it under a NoGradGuard,
// as the optimizers do (Errc::invalid_argument otherwise). x and y must not
// be two tensors over one memory that backplane sees as two storages (two
// DLPack imports of overlapping bytes): as with any in-place op, the result
// would then depend on the order of the elementwise writes.
BACKPLANE_API void axpby_(const Tensor& y, double alpha, const Tensor& x, double beta);

// ---- reductions --------------------------------------------------------------
// Over one axis (keepdim keeps it with extent 1) or over all axes (a 0-d result).
BACKPLANE_API Tensor sum(const Tensor& t, int64_t axis, bool keepdim = false);
BACKPLANE_API Tensor sum(const Tensor& t);
BACKPLANE_API Tensor mean(const Tensor& t, int64_t axis, bool keepdim = false);
BACKPLANE_API Tensor mean(const Tensor& t);
BACKPLANE_API Tensor max(const Tensor& t, int64_t axis, bool keepdim = false);
BACKPLANE_API Tensor max(const Tensor& t);
BACKPLANE_API Tensor min(const Tensor& t, int64_t axis, bool keepdim = false);
BACKPLANE_API Tensor min(const Tensor& t);
// i64 indices; over all axes, the index into the flattened (row-major) tensor.
BACKPLANE_API Tensor argmax(const Tensor& t, int64_t axis, bool keepdim = false);
BACKPLANE_API Tensor argmax(const Tensor& t);
BACKPLANE_API Tensor argmin(const Tensor& t, int64_t axis, bool keepdim = false);
BACKPLANE_API Tensor argmin(const Tensor& t);

// ---- linear algebra ----------------------------------------------------------
// [M,K] x [K,N] -> [M,N]; with more dims, the leading (batch) dims broadcast:
// [B,M,K] x [K,N] -> [B,M,N]. 1-D operands are not promoted (shape_mismatch).
BACKPLANE_API Tensor matmul(const Tensor& a, const Tensor& b);

// ---- softmax -----------------------------------------------------------------
// Numerically stable (the max along the axis is subtracted first).
BACKPLANE_API Tensor softmax(const Tensor& t, int64_t axis);
BACKPLANE_API Tensor log_softmax(const Tensor& t, int64_t axis);

// ---- shape -------------------------------------------------------------------
// Same elements, new shape (one extent may be -1). A view (no copy) when t is
// contiguous; otherwise a contiguous copy.
BACKPLANE_API Tensor reshape(const Tensor& t, const std::vector<int64_t>& shape);
// Views (no copy): reorder dims; swap two dims.
BACKPLANE_API Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
BACKPLANE_API Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1);
// A view of [start, end) with step > 0 along axis; start/end are clamped to
// the extent and may be negative (counted from the end), as in Python.
BACKPLANE_API Tensor slice(const Tensor& t, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
// Joins tensors of one dtype and device whose shapes differ only along axis.
BACKPLANE_API Tensor cat(const std::vector<Tensor>& tensors, int64_t axis);
// index: i64, 1-D. The result has extent index.numel() along axis.
BACKPLANE_API Tensor index_select(const Tensor& t, int64_t axis, const Tensor& index);
// index: i64, same rank as t, extents <= t's except along axis; result has index's shape.
BACKPLANE_API Tensor gather(const Tensor& t, int64_t axis, const Tensor& index);

// ---- dtype and placement -----------------------------------------------------
// Converts to dtype (float -> int truncates toward zero; to bool is x != 0);
// t itself when it already has dtype.
BACKPLANE_API Tensor cast(const Tensor& t, DType dtype);
// A contiguous copy of `t` on the same device.
BACKPLANE_API Tensor contiguous(const Tensor& t);
// A copy of `t` on `device` (any backend). Through host memory when the two
// backends differ; the same tensor (no copy) when device is t's.
BACKPLANE_API Tensor to(const Tensor& t, const Device& device);

// The shape two operands broadcast to (NumPy rules); throws
// Errc::shape_mismatch naming both shapes when they do not.
BACKPLANE_API Shape broadcast_shapes(const Shape& a, const Shape& b);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& t) { return neg(t); }

}  // namespace backplane

#endif  // BACKPLANE_OPS_HPP_
