// Validation helpers, op names and the execute call of the op front-end.
#include "tensor/op_common.hpp"
#include "trace/trace_format.hpp"

#include "tensor/placement.hpp"

#include <array>
#include <cmath>
#include <cstdio>
#include <string_view>

namespace backplane::detail {

namespace {

std::string dtype_str(DType d) { return std::string(to_string(d)); }

}  // namespace

void undefined_operand(const char* api, const char* which) {
  throw Error(Errc::invalid_argument,
              std::string(api) + ": " + which +
                  " operand is an undefined Tensor (default-constructed or moved-from)");
}

const std::shared_ptr<BackendImpl>& usable(const Device& device, const char* api) {
  if (!device.valid())
    throw Error(Errc::invalid_argument, std::string(api) + ": invalid (default-constructed) Device");
  detail::Access::impl(device)->require_loaded();
  return detail::Access::impl(device);
}

void device_mismatch(const TensorImpl& a, const TensorImpl& b, const char* api) {
  throw Error(Errc::device_mismatch,
              std::string(api) + ": operands are on different devices (" +
                  a.storage->home_backend()->device_id(a.storage->home_index()) + " and " +
                  b.storage->home_backend()->device_id(b.storage->home_index()) +
                  "); all operands of an op must live on one device (move one with to())");
}

void dtype_mismatch(const TensorImpl& a, const TensorImpl& b, const char* api) {
  throw Error(Errc::dtype_mismatch, std::string(api) + ": operand dtypes differ (" + dtype_str(a.dtype) +
                                        " and " + dtype_str(b.dtype) +
                                        "); there is no implicit promotion: cast one operand first");
}

void dtype_not_accepted(DType d, const char* api, const char* which, const char* allowed) {
  throw Error(Errc::dtype_mismatch,
              std::string(api) + ": dtype " + dtype_str(d) + " of " + which + " is not accepted; " + api +
                  " takes " + allowed +
                  " (ops.hpp lists each op's dtype rules; cast converts between dtypes)");
}

void require_known_dtype(DType d, const char* api) {
  if (is_known(d)) return;
  throw Error(Errc::invalid_argument,
              std::string(api) + ": unknown dtype value " + std::to_string(static_cast<int32_t>(d)));
}

int normalize_axis(int64_t axis, int rank, const char* api, const char* what) {
  if (rank == 0) {
    throw Error(Errc::invalid_argument,
                std::string(api) + ": " + what + " " + std::to_string(axis) +
                    " is out of range for a tensor of rank 0 (a 0-d tensor has no axes; "
                    "reshape it to [1] first)");
  }
  if (axis >= -rank && axis < rank) return static_cast<int>(axis < 0 ? axis + rank : axis);
  throw Error(Errc::invalid_argument, std::string(api) + ": " + what + " " + std::to_string(axis) +
                                          " is out of range for a tensor of rank " + std::to_string(rank) +
                                          " (valid: " + std::to_string(-rank) + ".." +
                                          std::to_string(rank - 1) + ")");
}

Shape broadcast_for(const char* api, const Shape& a, const Shape& b) {
  try {
    return broadcast_shapes(a, b);
  } catch (const Error& e) {
    throw Error(e.code(), std::string(api) + ": " + e.message() +
                              "; each trailing dimension must match or be 1 (NumPy broadcasting)");
  }
}

Shape broadcast_strides(const TensorImpl& t, const Shape& out) {
  Shape s = out;
  const int lead = out.rank() - t.shape.rank();
  for (int i = 0; i < out.rank(); ++i) {
    const int j = i - lead;
    s[i] = (j < 0 || t.shape[j] == 1) ? 0 : t.strides[j];
  }
  return s;
}

void execute_failed(BackendImpl& backend, int32_t device, int32_t op, bp_status* st) {
  // Returns for a status object whose code is OK (check frees it); throws otherwise.
  backend.check(st, std::string("execute ") + op_name(op) + " on " + backend.device_id(device));
}

void traced_execute(BackendImpl& backend, bp_execute_args& args, uint32_t fallback_for) {
  namespace tr = trace::detail;
  tr::Span span(fallback_for != 0 ? tr::kCatFallback : tr::kCatOp, op_name(args.op));
  tr::Event& e = span.event();
  e.device = backend.trace_label(args.device);
  e.peer = fallback_for;
  e.dtype = static_cast<int16_t>(args.num_inputs > 0 ? args.inputs[0].dtype : args.outputs[0].dtype);
  for (int32_t i = 0; i < args.num_inputs; ++i) tr::add_shape(e, args.inputs[i]);
  tr::add_shape(e, args.outputs[0]);
  bp_status* st = call_entry(backend, "execute", Errc::internal, backend.api.execute, &args);
  if (st != nullptr) [[unlikely]]
    execute_failed(backend, args.device, args.op, st);
}

void arity_mismatch(int32_t op, int32_t num_inputs) {
  throw Error(Errc::internal, std::string("execute ") + op_name(op) + ": the core passed " +
                                  std::to_string(num_inputs) + " input(s) where abi.h's op table says " +
                                  std::to_string(bp_op_info_of(op)->inputs) +
                                  "; this is a bug in backplane, please report it");
}

std::shared_ptr<TensorImpl> copy_contiguous(const TensorImpl& x, const char* api) {
  const TensorImpl* operands[1] = {&x};
  const Placement p(BP_OP_COPY, x.dtype, x.dtype, api, operands, 1);
  auto out = p.allocate(x.shape, x.dtype);
  if (x.shape.numel() == 0) return out;
  const bp_tensor in = describe(p[0]);
  const bp_tensor o = describe(*out);
  p.execute(BP_OP_COPY, &in, 1, &o);
  return out;
}

std::shared_ptr<TensorImpl> as_contiguous(const std::shared_ptr<TensorImpl>& x, const char* api) {
  const Shape canonical = contiguous_strides(x->shape);
  if (x->strides == canonical) return x;
  if (is_contiguous(*x)) return make_view(x, x->shape, canonical, x->byte_offset);
  return copy_contiguous(*x, api);
}

std::string list_to_string(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(v[i]);
  }
  return out + "]";
}

std::string number_to_string(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

namespace {

// The values an integer dtype holds, as [lo, hi); is_int is false for other dtypes.
struct IntRange {
  bool is_int;
  double lo;
  double hi;  // exclusive upper bound, a power of two (exactly representable)
};

IntRange int_range(DType d) noexcept {
  switch (d) {
    case DType::i32:
      return {true, -2147483648.0, 2147483648.0};
    case DType::i64:
      return {true, -9223372036854775808.0, 9223372036854775808.0};
    case DType::u8:
      return {true, 0.0, 256.0};
    case DType::i8:
      return {true, -128.0, 128.0};
    default:
      return {false, 0.0, 0.0};
  }
}

}  // namespace

bool is_integer_dtype(DType dtype) noexcept { return int_range(dtype).is_int; }

// Errc::invalid_argument unless `value` converts to dtype without UB: finite
// and in range for integer dtypes (fractions truncate toward zero).
void require_representable(double value, DType dtype, const char* api, const char* what) {
  const IntRange r = int_range(dtype);
  if (!r.is_int) return;
  const double truncated = std::trunc(value);
  if (std::isfinite(value) && truncated >= r.lo && truncated < r.hi) return;
  throw Error(Errc::invalid_argument,
              std::string(api) + ": " + what + " " + number_to_string(value) + " cannot be represented in " +
                  std::string(to_string(dtype)) + " (valid: " + number_to_string(r.lo) + ".." +
                  number_to_string(r.hi - 1) + "); use a wider or a floating-point dtype");
}

}  // namespace backplane::detail
