// The cuda plugin's kernel launches: what the host-side op code (ops.cpp,
// matmul.cpp, collectives.cpp; compiled by g++) calls into the .cu files
// (compiled by nvcc). Arguments are plain structs from host/layout.hpp and raw
// device pointers the caller validated. Each launch enqueues on ctx.stream and
// returns; the caller checks cudaGetLastError. A dtype or op outside the
// family's set is a programming error here (supports_op refused it earlier):
// the launch then does nothing and returns false.
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_KERNELS_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_KERNELS_HPP_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "host/layout.hpp"

namespace backplane::cuda {

struct KernelContext {
  cudaStream_t stream = nullptr;
  int sm_count = 1;
  ErrorSlot* slot = nullptr;  // device-visible address of the device's error slot
  int32_t op = 0;             // bp_op, recorded with a data error
};

// Elementwise (kernels_elementwise.cu). Operand 0 of each map is the output.
// add sub mul div pow maximum minimum: f32 f64 i32 i64 f16 bf16.
bool launch_binary(const KernelContext& ctx, int32_t dtype, const IndexMap<3>& map, int64_t n, void* out,
                   const void* a, const void* b);
// eq ne lt le gt ge: every dtype; the output is bool.
bool launch_compare(const KernelContext& ctx, int32_t dtype, const IndexMap<3>& map, int64_t n, void* out,
                    const void* a, const void* b);
// where: map operands out, cond, a, b; elements moved as raw bytes of `size`.
bool launch_where(const KernelContext& ctx, int32_t element_size, const IndexMap<4>& map, int64_t n,
                  void* out, const void* cond, const void* a, const void* b);
// neg abs relu clamp (f32 f64 i32 i64 f16 bf16); exp log sqrt tanh sigmoid sin
// cos (floats). clamp's bounds are bits of the dtype (scalar_bits).
bool launch_unary(const KernelContext& ctx, int32_t dtype, const IndexMap<2>& map, int64_t n, void* out,
                  const void* in, uint64_t lo_bits, uint64_t hi_bits);

// axpby in place: y = alpha * y + beta * x, both contiguous, n elements (floats;
// the scalars are bits of the dtype, scalar_bits).
bool launch_axpby(const KernelContext& ctx, int32_t dtype, int64_t n, void* y, const void* x,
                  uint64_t alpha_bits, uint64_t beta_bits);

// Data movement and creation (kernels_data.cu).
bool launch_copy(const KernelContext& ctx, int32_t element_size, const IndexMap<2>& map, int64_t n, void* out,
                 const void* in);
bool launch_cast(const KernelContext& ctx, int32_t from, int32_t to, const IndexMap<2>& map, int64_t n,
                 void* out, const void* in);
// Contiguous output of n elements.
bool launch_fill(const KernelContext& ctx, int32_t element_size, uint64_t bits, int64_t n, void* out);
bool launch_arange(const KernelContext& ctx, int32_t dtype, int64_t n, void* out, double start, double step);
// rand_uniform (a = low, b = high) and randn (a = mean, b = std): element i
// draws Philox4x32-10 counter i under key `seed`.
bool launch_random(const KernelContext& ctx, int32_t dtype, bool normal, int64_t n, void* out, uint64_t seed,
                   double a, double b);
// index_select / gather: map operands out, x (its axis stride zeroed), index;
// x's element is at x_offset + index * axis_stride; an index outside
// [0, extent) claims the error slot and writes nothing.
bool launch_take(const KernelContext& ctx, int32_t element_size, const IndexMap<3>& map, int64_t n, void* out,
                 const void* x, const int64_t* index, int64_t axis_stride, int64_t extent);
// data[i] /= divisor for integer dtypes (a mean after an integer sum), truncating.
bool launch_divide_int(const KernelContext& ctx, int32_t dtype, int64_t n, void* data, int64_t divisor);

// Reductions over the middle axis of a contiguous [outer, n, inner] input
// (kernels_reduce.cu). sum mean max min: arithmetic dtypes (mean: floats);
// the output is [outer, inner] of the input's dtype.
bool launch_reduce(const KernelContext& ctx, int32_t op, int32_t dtype, int64_t outer, int64_t n,
                   int64_t inner, void* out, const void* in);
// argmax / argmin: the output is i64.
bool launch_arg_reduce(const KernelContext& ctx, bool max, int32_t dtype, int64_t outer, int64_t n,
                       int64_t inner, int64_t* out, const void* in);
// softmax / log_softmax along the middle axis; the output is contiguous like the input.
bool launch_softmax(const KernelContext& ctx, bool log, int32_t dtype, int64_t outer, int64_t n,
                    int64_t inner, void* out, const void* in);

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_KERNELS_HPP_
