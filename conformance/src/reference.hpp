// The conformance suite's reference: every op of ops.hpp on host tensors,
// written from the math with NumPy semantics, independent of any kernel and
// of the core's own shape logic. Floats are computed in double and rounded
// once to the result dtype; integers in 64-bit two's complement, wrapped to
// the result's width. Callers pass only valid requests (error cases are
// checked against the device, not here).
#ifndef BACKPLANE_CONFORMANCE_REFERENCE_HPP_
#define BACKPLANE_CONFORMANCE_REFERENCE_HPP_

#include "suite.hpp"

#include <cstdint>
#include <optional>
#include <vector>

namespace backplane::conformance::ref {

// NumPy broadcasting of two shapes; nullopt when they do not broadcast.
std::optional<std::vector<int64_t>> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

// `t` read as if it had `shape` (t's shape must broadcast to it).
HostTensor expand(const HostTensor& t, const std::vector<int64_t>& shape);

enum class Binary { add, sub, mul, div, pow, maximum, minimum };
enum class Compare { eq, ne, lt, le, gt, ge };
enum class Reduce { sum, mean, max, min, argmax, argmin };

HostTensor binary(Binary op, const HostTensor& a, const HostTensor& b);
HostTensor compare(Compare op, const HostTensor& a, const HostTensor& b);
HostTensor where(const HostTensor& cond, const HostTensor& a, const HostTensor& b);
// A UNARY op of abi.h's table by its bp_op (clamp: see clamp below); an op
// with no reference here throws std::logic_error naming it.
HostTensor unary(int32_t op, const HostTensor& t);
HostTensor clamp(const HostTensor& t, double lo, double hi);

// A reduction's value and, per output element, the scale its rounding error
// grows with: sum |x| over the reduced elements (divided by n for mean).
struct Reduced {
  HostTensor value;
  std::vector<double> scale;
};
// axis nullopt: over all axes (a 0-d result; argmax/argmin index the
// flattened tensor). Negative axes count from the end.
Reduced reduce(Reduce op, const HostTensor& t, std::optional<int64_t> axis, bool keepdim);

// [..., M, K] x [..., K, N] with broadcast batch dims; scale[i] is
// sum_k |a_ik * b_kj| for output element i; k is K.
struct MatmulResult {
  HostTensor value;
  std::vector<double> scale;
  int64_t k = 0;
};
MatmulResult matmul(const HostTensor& a, const HostTensor& b);

HostTensor softmax(const HostTensor& t, int64_t axis, bool log);

HostTensor reshape(const HostTensor& t, std::vector<int64_t> shape);  // one extent may be -1
HostTensor permute(const HostTensor& t, const std::vector<int64_t>& dims);
HostTensor transpose(const HostTensor& t, int64_t dim0, int64_t dim1);
HostTensor slice(const HostTensor& t, int64_t axis, int64_t start, int64_t end, int64_t step);
HostTensor cat(const std::vector<HostTensor>& tensors, int64_t axis);
HostTensor index_select(const HostTensor& t, int64_t axis, const std::vector<int64_t>& index);
HostTensor gather(const HostTensor& t, int64_t axis, const HostTensor& index);
HostTensor cast(const HostTensor& t, DType dtype);
HostTensor arange(double start, double end, double step, DType dtype);

}  // namespace backplane::conformance::ref

#endif  // BACKPLANE_CONFORMANCE_REFERENCE_HPP_
