// Shared by the op front-end (core/ops_*.cpp): operand and dtype checks, axis
// normalisation, the support check and the execute call. Messages are built
// only on the failure path, so a successful op allocates nothing here.
#ifndef BACKPLANE_CORE_OP_COMMON_HPP_
#define BACKPLANE_CORE_OP_COMMON_HPP_

#include "tensor/tensor_impl.hpp"
#include "trace/recorder.hpp"

#include <backplane/error.hpp>
#include <backplane/ops.hpp>
#include <backplane/tensor.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::detail {

// abi.h's name of a bp_op ("add", "log_softmax", ...); "unknown op" for any
// other value.
inline const char* op_name(int32_t op) noexcept {
  const char* name = bp_op_name(op);  // abi.h's table: the one name of each op
  return name != nullptr ? name : "unknown op";
}

// The dtype classes of ops.hpp.
inline bool is_float(DType d) noexcept { return d == DType::f32 || d == DType::f64; }
inline bool is_arithmetic(DType d) noexcept {
  return d == DType::f32 || d == DType::f64 || d == DType::i32 || d == DType::i64;
}
inline bool is_known(DType d) noexcept { return dtype_size(d) != 0; }

// The throwing halves of the checks below: cold, out of line, so the checks
// inline into every op as a compare and a branch.
[[noreturn, gnu::cold]] void undefined_operand(const char* api, const char* which);
[[noreturn, gnu::cold]] void device_mismatch(const TensorImpl& a, const TensorImpl& b, const char* api);
[[noreturn, gnu::cold]] void dtype_mismatch(const TensorImpl& a, const TensorImpl& b, const char* api);
[[noreturn, gnu::cold]] void dtype_not_accepted(DType d, const char* api, const char* which,
                                                const char* allowed);

// The impl of an operand; Errc::invalid_argument when it is undefined.
// `api` is the public function's name, `which` names the operand ("left").
inline const TensorImpl& operand(const Tensor& t, const char* api, const char* which) {
  if (!t.defined()) [[unlikely]]
    undefined_operand(api, which);
  return *detail::Access::impl(t);
}
// The loaded backend behind `device`; throws for an invalid device or a
// backend that failed to load.
const std::shared_ptr<BackendImpl>& usable(const Device& device, const char* api);

// Errc::device_mismatch naming both devices.
// Compares the devices the tensors belong to (Storage::home), not where
// their bytes are: placement moves bytes, never a tensor's device.
inline void same_device(const TensorImpl& a, const TensorImpl& b, const char* api) {
  if (a.storage->home_backend() == b.storage->home_backend() &&
      a.storage->home_index() == b.storage->home_index()) [[likely]]
    return;
  device_mismatch(a, b, api);
}
// Errc::dtype_mismatch naming both dtypes.
inline void same_dtype(const TensorImpl& a, const TensorImpl& b, const char* api) {
  if (a.dtype == b.dtype) [[likely]]
    return;
  dtype_mismatch(a, b, api);
}
// Errc::dtype_mismatch unless `ok`: "<api>: dtype <d> of <which> is not accepted; <api> takes <allowed> ...".
inline void require_dtype(bool ok, DType d, const char* api, const char* which, const char* allowed) {
  if (ok) [[likely]]
    return;
  dtype_not_accepted(d, api, which, allowed);
}
// The dtype check of abi.h's op table: the dtype `op` computes on must be in
// its class. The front-end computes on f32, f64, i32 and i64, so FLOATING is
// f32 or f64 here and ARITHMETIC all four; NUMERIC and MOVING take any dtype.
inline void require_op_dtype(int32_t op, DType d, const char* api, const char* which) {
  switch (bp_op_info_of(op)->dtypes) {
    case BP_OP_DTYPES_FLOATING:
      return require_dtype(is_float(d), d, api, which, "f32 or f64");
    case BP_OP_DTYPES_ARITHMETIC:
      return require_dtype(is_arithmetic(d), d, api, which, "f32, f64, i32 or i64");
    default:
      return;
  }
}
// Errc::invalid_argument for a dtype value this core does not know.
void require_known_dtype(DType d, const char* api);

// Axis in [-rank, rank) -> [0, rank); Errc::invalid_argument naming the axis,
// the rank and the valid range otherwise.
int normalize_axis(int64_t axis, int rank, const char* api, const char* what = "axis");

// The NumPy broadcast of two shapes; Errc::shape_mismatch prefixed with api.
Shape broadcast_for(const char* api, const Shape& a, const Shape& b);
// Strides that read `t` as if it had shape `out` (NumPy broadcasting): 0 on
// the dimensions t lacks or has as 1.
Shape broadcast_strides(const TensorImpl& t, const Shape& out);

// Zeroed attributes with struct_size set.
constexpr bp_op_attrs make_attrs() noexcept {
  bp_op_attrs a{};
  a.struct_size = BP_OP_ATTRS_STRUCT_SIZE;
  return a;
}
// A non-NULL execute status: throws unless its code is OK.
[[gnu::cold]] void execute_failed(BackendImpl& backend, int32_t device, int32_t op, bp_status* st);
// Errc::internal: the front-end built a call whose input count is not the
// op table's (a core bug; the plugin would read past its inputs).
[[noreturn, gnu::cold]] void arity_mismatch(int32_t op, int32_t num_inputs);
// Runs one op with one output; a failure status becomes backplane::Error
// naming the op and device, an exception escaping the plugin Errc::internal
// naming the entry (call_entry: nothing on the success path). attrs may be
// null (no attributes).
// With a trace recording, the op is recorded as a span (traced_execute);
// `fallback_for` is the interned label of the device the op ran for when it
// fell back (trace::detail::device_label), 0 otherwise.
[[gnu::noinline]] void traced_execute(BackendImpl& backend, bp_execute_args& args, uint32_t fallback_for);
inline void execute(BackendImpl& backend, int32_t device, int32_t op, const bp_tensor* inputs,
                    int32_t num_inputs, const bp_tensor* output, const bp_op_attrs* attrs = nullptr,
                    uint32_t fallback_for = 0) {
  static constexpr bp_op_attrs kNoAttrs = make_attrs();
  if (num_inputs != bp_op_info_of(op)->inputs) [[unlikely]]
    arity_mismatch(op, num_inputs);
  bp_execute_args args{};
  args.struct_size = BP_EXECUTE_ARGS_STRUCT_SIZE;
  args.device = device;
  args.op = op;
  args.inputs = inputs;
  args.num_inputs = num_inputs;
  args.num_outputs = 1;
  args.outputs = output;
  args.attrs = attrs != nullptr ? attrs : &kNoAttrs;
  args.plugin = backend.plugin;
  if (trace::detail::active()) [[unlikely]] {
    traced_execute(backend, args, fallback_for);
    return;
  }
  bp_status* st = call_entry(backend, "execute", Errc::internal, backend.api.execute, &args);
  if (st != nullptr) [[unlikely]]
    execute_failed(backend, device, op, st);
}

// A contiguous copy of x on its device (BP_OP_COPY); `api` names the caller
// for an unsupported_op error.
std::shared_ptr<TensorImpl> copy_contiguous(const TensorImpl& x, const char* api);
// x itself when contiguous with row-major strides; a re-strided view when it
// is contiguous in memory; otherwise a contiguous copy.
std::shared_ptr<TensorImpl> as_contiguous(const std::shared_ptr<TensorImpl>& x, const char* api);

// Copies x's elements into out: both contiguous with the same byte size,
// on any two devices (memcpy between host-visible ones, buffer_read/write
// otherwise). Synchronises both devices first. `what` prefixes errors (see
// copy_bytes).
void copy_dense(const TensorImpl& x, const TensorImpl& out, std::string_view what);

// Throws e again with " (context)" appended: how a caller adds what only it
// knows to an error from below, on the failure path alone.
[[noreturn]] [[gnu::cold]] void rethrow_with_context(const Error& e, std::string_view context);

// "[2, -1, 3]" for a user-given shape or dim list.
std::string list_to_string(const std::vector<int64_t>& v);
// A double for a message: "2.5", "1e+300", "nan".
std::string number_to_string(double v);

// Errc::invalid_argument unless `value` converts to dtype without UB: finite
// and in range for integer dtypes (fractions truncate toward zero).
void require_representable(double value, DType dtype, const char* api, const char* what);
// True for the integer dtypes (i32, i64, u8, i8).
bool is_integer_dtype(DType dtype) noexcept;

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_OP_COMMON_HPP_
