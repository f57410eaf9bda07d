// Ops on tensors. The core validates devices, dtypes and shapes (NumPy
// broadcasting) before anything reaches a plugin; a device that cannot run
// an op on a dtype gives Errc::unsupported_op naming op, dtype and backend.
//
// dtype rules: both operands of a binary op must have the same dtype
// (Errc::dtype_mismatch otherwise; there is no implicit promotion) and live
// on the same device (Errc::device_mismatch).
#ifndef BACKPLANE_OPS_HPP_
#define BACKPLANE_OPS_HPP_

#include <backplane/export.hpp>

#include <backplane/tensor.hpp>

namespace backplane {

// Elementwise, with broadcasting.
BACKPLANE_API Tensor add(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor sub(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor mul(const Tensor& a, const Tensor& b);
BACKPLANE_API Tensor div(const Tensor& a, const Tensor& b);

// 2-D matrix product: [M,K] x [K,N] -> [M,N].
BACKPLANE_API Tensor matmul(const Tensor& a, const Tensor& b);

// A contiguous copy of `t` on the same device.
BACKPLANE_API Tensor contiguous(const Tensor& t);

// The shape two operands broadcast to (NumPy rules); throws
// Errc::shape_mismatch naming both shapes when they do not.
BACKPLANE_API Shape broadcast_shapes(const Shape& a, const Shape& b);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }

}  // namespace backplane

#endif  // BACKPLANE_OPS_HPP_
