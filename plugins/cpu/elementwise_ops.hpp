// The cpu plugin's ABI 1.1 elementwise and creation ops (BP_OP_POW through
// BP_OP_RANDN): which dtypes each takes, and the dispatch from (op, dtypes) to the
// kernels of elementwise.hpp. cpu_plugin.cpp validates the operands first.
//
// dtypes: pow maximum minimum neg abs relu clamp arange: f32 f64 i32 i64.
// exp log sqrt tanh sigmoid sin cos rand_uniform randn: f32 f64. Comparisons: inputs
// f32 f64 i32 i64 bool u8 i8, output bool. where: any dtype (a, b, output), cond bool.
// cast: between any two of f32 f64 i32 i64 bool u8 i8. fill: f32 f64 i32 i64 bool u8 i8.
#ifndef BACKPLANE_PLUGINS_CPU_ELEMENTWISE_OPS_HPP_
#define BACKPLANE_PLUGINS_CPU_ELEMENTWISE_OPS_HPP_

#include <cstdint>

namespace backplane::cpu {

// True for the ops handled here.
bool is_elementwise_op(int32_t op) noexcept;

// "pow", "eq", ...; nullptr for an op not handled here.
const char* elementwise_op_name(int32_t op) noexcept;

// Number of inputs (0 to 3); every op here has one output.
int elementwise_arity(int32_t op) noexcept;

// The dtypes op takes, for messages: "f32, f64", ...
const char* elementwise_dtypes(int32_t op) noexcept;

// For device attributes: "vector_math" (which exp, log, ... the kernels call) and
// "rng" (the generator behind rand_uniform and randn, so values can be reproduced).
const char* elementwise_vector_math() noexcept;
const char* elementwise_rng() noexcept;

// supports_op's answer for an op handled here. For comparisons `dtype` is the inputs'
// (their output is bool), for where that of a and b, for cast either side's: each
// answer is true exactly when the op runs with `dtype` in that place.
bool elementwise_supports(int32_t op, int32_t dtype) noexcept;

// Whether the op runs with this output dtype and inputs[0]'s dtype (for ops without
// inputs, pass the output's twice).
bool elementwise_supports(int32_t op, int32_t out_dtype, int32_t in_dtype) noexcept;

// The dtype inputs[index] must have, given the output's and inputs[0]'s.
int32_t elementwise_input_dtype(int32_t op, int index, int32_t out_dtype, int32_t in0_dtype) noexcept;

struct ElementwiseOperand {
  const void* data;        // element [0, ..., 0]
  const int64_t* strides;  // in elements, ndim of them
};

// One validated call. Every operand has `shape` (ndim <= kMaxDims, no zero extent, 0-d
// allowed); inputs are in ABI order (where: cond, a, b). An input overlaps the output
// only when it is the very same elements, of the same element size.
struct ElementwiseCall {
  int32_t op;
  int32_t out_dtype;
  int32_t in_dtype;  // inputs[0]'s (the output's for ops without inputs)
  int32_t ndim;
  const int64_t* shape;
  void* out;
  const int64_t* out_strides;
  ElementwiseOperand inputs[3];
  double scalar0;
  double scalar1;
  uint64_t seed;
  int threads;
};

enum class ElementwiseResult {
  ok,
  unsupported,        // op or dtypes not implemented: nothing was written
  negative_exponent,  // integer pow with an exponent < 0: nothing was written
};

ElementwiseResult run_elementwise(const ElementwiseCall& call);

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_ELEMENTWISE_OPS_HPP_
