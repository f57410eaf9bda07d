// Creation ops: zeros/ones/full (BP_OP_FILL), arange, rand_uniform and randn.
// The plugin sees no inputs and one contiguous output; the core checks every
// scalar so a plugin never converts a value its dtype cannot hold.
#include "tensor/op_common.hpp"
#include "tensor/placement.hpp"

#include <cmath>
#include <limits>

namespace backplane {
namespace {

using detail::number_to_string;

void require_finite(double value, const char* api, const char* what) {
  if (std::isfinite(value)) return;
  throw Error(Errc::invalid_argument,
              std::string(api) + ": " + what + " must be finite, got " + number_to_string(value));
}

// Allocates a contiguous output of `shape` and runs the creation op `op`.
Tensor create(const Device& device, const Shape& shape, DType dtype, int32_t op, const bp_op_attrs& attrs,
              const char* api) {
  const auto& backend = detail::usable(device, api);
  detail::checked_numel(shape, dtype, api);
  const detail::Placement p(op, dtype, backend, device.index(), api);
  auto out = p.allocate(shape, dtype);
  if (shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  const bp_tensor o = detail::describe(*out);
  p.execute(op, nullptr, 0, &o, &attrs);
  return detail::Access::make_tensor(std::move(out));
}

}  // namespace

Tensor full(const Device& device, const Shape& shape, double value, DType dtype) {
  detail::require_known_dtype(dtype, "full");
  detail::require_representable(value, dtype, "full", "value");
  bp_op_attrs attrs = detail::make_attrs();
  attrs.scalar0 = value;
  return create(device, shape, dtype, BP_OP_FILL, attrs, "full");
}

Tensor zeros(const Device& device, const Shape& shape, DType dtype) {
  detail::require_known_dtype(dtype, "zeros");
  bp_op_attrs attrs = detail::make_attrs();
  attrs.scalar0 = 0.0;
  return create(device, shape, dtype, BP_OP_FILL, attrs, "zeros");
}

Tensor ones(const Device& device, const Shape& shape, DType dtype) {
  detail::require_known_dtype(dtype, "ones");
  bp_op_attrs attrs = detail::make_attrs();
  attrs.scalar0 = 1.0;
  return create(device, shape, dtype, BP_OP_FILL, attrs, "ones");
}

Tensor arange(const Device& device, double start, double end, double step, DType dtype) {
  detail::require_op_dtype(BP_OP_ARANGE, dtype, "arange", "the result");
  require_finite(start, "arange", "start");
  require_finite(end, "arange", "end");
  require_finite(step, "arange", "step");
  if (step == 0.0) throw Error(Errc::invalid_argument, "arange: step must be non-zero (got 0)");
  const double count = std::ceil((end - start) / step);
  // 2^62: far beyond any allocation, and exact as both double and int64.
  constexpr double kMaxCount = 4611686018427387904.0;
  if (!(count <= kMaxCount)) {
    throw Error(Errc::invalid_argument, "arange: [" + number_to_string(start) + ", " + number_to_string(end) +
                                            ") in steps of " + number_to_string(step) + " has " +
                                            number_to_string(count) +
                                            " elements, more than can be allocated; use a larger step");
  }
  const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
  if (n > 0) {
    detail::require_representable(start, dtype, "arange", "start");
    detail::require_representable(start + static_cast<double>(n - 1) * step, dtype, "arange",
                                  "the last value");
  }
  bp_op_attrs attrs = detail::make_attrs();
  attrs.scalar0 = start;
  attrs.scalar1 = step;
  return create(device, Shape{n}, dtype, BP_OP_ARANGE, attrs, "arange");
}

Tensor rand_uniform(const Device& device, const Shape& shape, uint64_t seed, double low, double high,
                    DType dtype) {
  detail::require_op_dtype(BP_OP_RAND_UNIFORM, dtype, "rand_uniform", "the result");
  require_finite(low, "rand_uniform", "low");
  require_finite(high, "rand_uniform", "high");
  if (low > high)
    throw Error(Errc::invalid_argument, "rand_uniform: low " + number_to_string(low) +
                                            " is greater than high " + number_to_string(high) +
                                            "; pass low <= high");
  bp_op_attrs attrs = detail::make_attrs();
  attrs.scalar0 = low;
  attrs.scalar1 = high;
  attrs.seed = seed;
  return create(device, shape, dtype, BP_OP_RAND_UNIFORM, attrs, "rand_uniform");
}

Tensor randn(const Device& device, const Shape& shape, uint64_t seed, double mean, double stddev,
             DType dtype) {
  detail::require_op_dtype(BP_OP_RANDN, dtype, "randn", "the result");
  require_finite(mean, "randn", "mean");
  require_finite(stddev, "randn", "stddev");
  if (stddev < 0.0)
    throw Error(Errc::invalid_argument, "randn: stddev must be >= 0, got " + number_to_string(stddev) +
                                            " (flip the sign of the result instead)");
  bp_op_attrs attrs = detail::make_attrs();
  attrs.scalar0 = mean;
  attrs.scalar1 = stddev;
  attrs.seed = seed;
  return create(device, shape, dtype, BP_OP_RANDN, attrs, "randn");
}

}  // namespace backplane
