// Dtypes for C++ plugins: the C++ type of each bp_dtype, names for messages,
// and dispatch from a runtime dtype to a typed kernel.
//
//   using Arith = plugin::DTypes<BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I32, BP_DTYPE_I64>;
//   plugin::dispatch<Arith>(dtype, "add", [&]<class T>() { add_kernel<T>(...); });
//
// dispatch fails with BP_STATUS_UNSUPPORTED naming the dtype, the op and the
// dtypes the set holds when `dtype` is not in it; `contains<Set>(dtype)` is
// the same test for supports_op, so the two can never disagree.
#ifndef BACKPLANE_PLUGIN_DTYPE_HPP_
#define BACKPLANE_PLUGIN_DTYPE_HPP_

#include <backplane/abi.h>
#include <backplane/plugin/status.hpp>

#include <cstdint>
#include <string>

namespace backplane::plugin {

// Storage types for the 16-bit floats: bits only; kernels convert.
struct f16_bits {
  uint16_t bits;
};
struct bf16_bits {
  uint16_t bits;
};

template <int32_t D>
struct cpp_type;  // undefined for BP_DTYPE_INVALID and unknown values
template <>
struct cpp_type<BP_DTYPE_F32> {
  using type = float;
};
template <>
struct cpp_type<BP_DTYPE_F64> {
  using type = double;
};
template <>
struct cpp_type<BP_DTYPE_I32> {
  using type = int32_t;
};
template <>
struct cpp_type<BP_DTYPE_I64> {
  using type = int64_t;
};
template <>
struct cpp_type<BP_DTYPE_BOOL> {
  using type = uint8_t;
};  // one byte, 0 or 1
template <>
struct cpp_type<BP_DTYPE_F16> {
  using type = f16_bits;
};
template <>
struct cpp_type<BP_DTYPE_BF16> {
  using type = bf16_bits;
};
template <>
struct cpp_type<BP_DTYPE_U8> {
  using type = uint8_t;
};
template <>
struct cpp_type<BP_DTYPE_I8> {
  using type = int8_t;
};
template <int32_t D>
using cpp_type_t = typename cpp_type<D>::type;

// "f32", ...; "dtype 12" for a value this header does not know.
inline std::string dtype_name(int32_t dtype) {
  const char* name = bp_dtype_name(dtype);
  return name != nullptr ? std::string(name) : "dtype " + std::to_string(dtype);
}
// "add", ...; "op 99" for a value this header does not know.
inline std::string op_name(int32_t op) {
  const char* name = bp_op_name(op);
  return name != nullptr ? std::string(name) : "op " + std::to_string(op);
}
inline std::string reduce_op_name(int32_t op) {
  const char* name = bp_reduce_op_name(op);
  return name != nullptr ? std::string(name) : "reduce op " + std::to_string(op);
}

// A compile-time set of dtypes.
template <int32_t... Ds>
struct DTypes {
  static constexpr bool contains(int32_t dtype) noexcept { return ((dtype == Ds) || ...); }
  // "f32, f64"
  static std::string names() {
    std::string out;
    ((out += (out.empty() ? "" : ", ") + dtype_name(Ds)), ...);
    return out;
  }
  // The BP_CAP_* dtype flags of the set, for device_info.
  static constexpr uint64_t capabilities() noexcept { return (uint64_t{0} | ... | BP_CAP_DTYPE(Ds)); }
};

using FloatDTypes = DTypes<BP_DTYPE_F32, BP_DTYPE_F64>;
using ArithmeticDTypes = DTypes<BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I32, BP_DTYPE_I64>;
using AllDTypes = DTypes<BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_BOOL, BP_DTYPE_F16,
                         BP_DTYPE_BF16, BP_DTYPE_U8, BP_DTYPE_I8>;

template <class Set>
constexpr bool contains(int32_t dtype) noexcept {
  return Set::contains(dtype);
}

// The dtype families of abi.h's ops (BP_OP_TABLE's dtype class): a plugin
// keeps one dtype set per family and answers supports_op with
// `op_family(op)`, so no plugin repeats the op lists.
//   arithmetic  numbers (add, neg, relu, sum, argmax, arange, ...)
//   floating    floating point only (exp, sqrt, sigmoid, mean, softmax,
//               rand_uniform, matmul, ...)
//   numeric     numbers and bool: comparisons (their inputs), cast (each
//               side), fill
//   moving      any dtype: copy, where, index_select, gather
//   none        an op this header does not know
enum class OpFamily { none, arithmetic, floating, numeric, moving };

inline OpFamily op_family(int32_t op) noexcept {
  switch (bp_op_info_of(op)->dtypes) {
    case BP_OP_DTYPES_ARITHMETIC:
      return OpFamily::arithmetic;
    case BP_OP_DTYPES_FLOATING:
      return OpFamily::floating;
    case BP_OP_DTYPES_NUMERIC:
      return OpFamily::numeric;
    case BP_OP_DTYPES_MOVING:
      return OpFamily::moving;
    default:
      return OpFamily::none;
  }
}

// supports_op's answer for a plugin whose families take these dtype sets.
template <class Arithmetic, class Floating, class Numeric, class Moving>
inline bool family_supports(int32_t op, int32_t dtype) noexcept {
  switch (op_family(op)) {
    case OpFamily::arithmetic:
      return Arithmetic::contains(dtype);
    case OpFamily::floating:
      return Floating::contains(dtype);
    case OpFamily::numeric:
      return Numeric::contains(dtype);
    case OpFamily::moving:
      return Moving::contains(dtype);
    case OpFamily::none:
      break;
  }
  return false;
}

namespace detail {
// Out of line and cold: the message is built only when a dtype is refused.
template <class Set>
[[noreturn, gnu::cold, gnu::noinline]] void unsupported_dtype(int32_t dtype, const char* what) {
  fail(BP_STATUS_UNSUPPORTED,
       std::string(what) + ": dtype " + dtype_name(dtype) + " is not supported (" + Set::names() + ")");
}

template <class Set, class Fn, int32_t D, int32_t... Rest>
decltype(auto) dispatch_in(int32_t dtype, const char* what, Fn& fn, DTypes<D, Rest...>*) {
  if (dtype == D) return fn.template operator()<cpp_type_t<D>>();
  if constexpr (sizeof...(Rest) > 0) {
    return dispatch_in<Set>(dtype, what, fn, static_cast<DTypes<Rest...>*>(nullptr));
  } else {
    unsupported_dtype<Set>(dtype, what);
  }
}
}  // namespace detail

// Calls fn.template operator()<T>() with T = cpp_type_t<dtype> when dtype is
// in Set; otherwise fails with BP_STATUS_UNSUPPORTED. `what` names the op.
template <class Set, class Fn>
decltype(auto) dispatch(int32_t dtype, const char* what, Fn&& fn) {
  if (!Set::contains(dtype)) [[unlikely]]
    detail::unsupported_dtype<Set>(dtype, what);
  return detail::dispatch_in<Set>(dtype, what, fn, static_cast<Set*>(nullptr));
}

}  // namespace backplane::plugin

#endif  // BACKPLANE_PLUGIN_DTYPE_HPP_
