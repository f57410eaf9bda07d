// Which dtypes each op of the cuda plugin takes: one set per op family, read
// by supports_op (in the front library, which answers without loading the
// engine) and by the launches' dtype dispatch (ops.hpp, in the engine).
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_OP_DTYPES_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_OP_DTYPES_HPP_

#include <backplane/plugin.hpp>

#include <cstdint>

namespace backplane::cuda {

using plugin::DTypes;

// Arithmetic: add sub mul div pow maximum minimum, neg abs relu clamp, arange,
// sum max min argmax argmin. The 16-bit floats compute in f32.
using ArithmeticDTypes =
    DTypes<BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_F16, BP_DTYPE_BF16>;
// Floats: exp log sqrt tanh sigmoid sin cos, rand_uniform randn, mean,
// softmax log_softmax, matmul (f16/bf16 through cuBLAS with f32 accumulation).
using FloatDTypes = DTypes<BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16>;
// Every dtype: comparisons, cast, fill, copy, where, index_select, gather.
using AllDTypes = plugin::AllDTypes;

// supports_op's answer (unknown ops and dtypes: false).
inline bool op_supports(int32_t op, int32_t dtype) noexcept {
  return plugin::family_supports<ArithmeticDTypes, FloatDTypes, AllDTypes, AllDTypes>(op, dtype);
}

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_OP_DTYPES_HPP_
