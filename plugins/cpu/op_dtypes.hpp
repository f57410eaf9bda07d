// Which dtypes each op of the cpu plugin takes: one SDK DTypes set per family.
// supports_op answers from these sets and the kernels dispatch over the very same
// aliases, so the two cannot disagree. The dtype is the one supports_op is asked
// with (abi.h): the data operand's (where: a's; comparisons, argmax/argmin, take:
// the input's), a creation op's output's, and each side of a cast.
#ifndef BACKPLANE_PLUGINS_CPU_OP_DTYPES_HPP_
#define BACKPLANE_PLUGINS_CPU_OP_DTYPES_HPP_

#include <backplane/abi.h>
#include <backplane/plugin/dtype.hpp>

#include <cstdint>
#include <type_traits>

namespace backplane::cpu {

using plugin::DTypes;

// What the device holds: every dtype, all of which it can store, copy and cast
// (device_info's dtype flags come from this set).
using HeldDTypes = plugin::AllDTypes;
// Arithmetic: add sub mul div pow maximum minimum, neg abs relu clamp, arange,
// sum max min argmax argmin.
using ArithmeticDTypes = plugin::ArithmeticDTypes;
// Floats: exp log sqrt tanh sigmoid sin cos, rand_uniform randn, mean, softmax,
// log_softmax, matmul.
using FloatDTypes = plugin::FloatDTypes;
// Numbers the kernels compute with (the 16-bit floats are stored, not computed
// with): comparisons (inputs), cast (both sides), fill.
using NumericDTypes =
    DTypes<BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_BOOL, BP_DTYPE_U8, BP_DTYPE_I8>;
// Ops that only move elements: copy, where, index_select, gather.
using MovedDTypes = plugin::AllDTypes;

// The dtype of an element type of ArithmeticDTypes or FloatDTypes (each maps
// to exactly one there). A kernel typed by dispatch passes it to its views as
// a constant, so their checks fold (dispatch chose T because the dtype is it).
template <class T>
inline constexpr int32_t arithmetic_dtype = std::is_same_v<T, float>     ? BP_DTYPE_F32
                                            : std::is_same_v<T, double>  ? BP_DTYPE_F64
                                            : std::is_same_v<T, int32_t> ? BP_DTYPE_I32
                                            : std::is_same_v<T, int64_t> ? BP_DTYPE_I64
                                                                         : BP_DTYPE_INVALID;

// supports_op's answer. op and dtype are the host's raw values: unknown ones
// answer false.
inline bool op_supports(int32_t op, int32_t dtype) noexcept {
  return plugin::family_supports<ArithmeticDTypes, FloatDTypes, NumericDTypes, MovedDTypes>(op, dtype);
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_OP_DTYPES_HPP_
