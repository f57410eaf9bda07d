// matmul of the cuda plugin: one cublasGemmStridedBatchedEx call per op. The
// plan (host/layout.hpp) reads strided and transposed operands in place where
// BLAS can, and makes dense copies where it cannot (a batch that does not
// collapse to one stride). f32 computes in f32 (TF32 only with the "tf32"
// option), f64 in f64, f16/bf16 in f32 with results rounded once.
#include <cublas_v2.h>

#include <climits>
#include <string>

#include "kernels.hpp"
#include "ops.hpp"

namespace backplane::cuda {
namespace {

using plugin::fail;

struct BlasTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
  bool double_scalars;  // alpha/beta as double (f64), else float
};

BlasTypes blas_types(int32_t dtype, bool tf32) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return {CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, false};
    case BP_DTYPE_F64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, true};
    case BP_DTYPE_F16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, false};
    case BP_DTYPE_BF16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, false};
    default:
      fail(BP_STATUS_UNSUPPORTED,
           "cuda: matmul: dtype " + plugin::dtype_name(dtype) + " is not supported (f32, f64, f16, bf16)");
  }
}

MatrixView matrix_of(const TensorView& v) { return {v.ndim, v.shape, v.strides}; }

// A dense row-major copy of an operand whose layout BLAS cannot read.
const void* dense_operand(const OpCall& call, const TensorView& v, Scratch& scratch) {
  if (v.contiguous) return v.data;
  return dense(call, v, scratch);
}

}  // namespace

void run_matmul(const OpCall& call) {
  expect_arity(call, 2);
  const int32_t dtype = call.output().dtype;
  const TensorView out = operand(call, call.output(), dtype, {"outputs", 0});
  const TensorView a = operand(call, call.input(0), dtype, {"inputs", 0});
  const TensorView b = operand(call, call.input(1), dtype, {"inputs", 1});
  if (a.ndim < 2 || b.ndim < 2 || out.ndim < 2)
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cuda: matmul: operands need at least 2 dimensions (the host promotes 1-d ones)");
  if (out.numel == 0) return;
  const GemmPlan plan = plan_gemm(matrix_of(a), matrix_of(b), matrix_of(out));
  if (plan.k == 0) {  // an empty sum: zeros (cuBLAS would leave C to beta)
    Scratch s(call.device);
    void* dst = out.data;
    if (plan.out_needs_copy)
      dst = s.allocate(static_cast<uint64_t>(out.numel) * out.element_size, "matmul: output scratch");
    if (!launch_fill(call.kernels(), out.element_size, 0, out.numel, dst))
      fail(BP_STATUS_INTERNAL,
           "cuda: matmul: no fill kernel for element size " + std::to_string(out.element_size));
    call.device.check_launch("matmul: zero fill");
    if (plan.out_needs_copy) scatter_dense(call, dst, out);
    return;
  }
  const BlasTypes types = blas_types(dtype, call.device.options().tf32);
  Scratch a_copy(call.device);
  Scratch b_copy(call.device);
  Scratch c_copy(call.device);
  // cuBLAS's A is our right operand (b), its B our left (a): C^T = B^T A^T.
  const void* blas_a = plan.a.needs_copy ? dense_operand(call, b, b_copy) : b.data;
  const void* blas_b = plan.b.needs_copy ? dense_operand(call, a, a_copy) : a.data;
  void* blas_c = out.data;
  if (plan.out_needs_copy)
    blas_c = c_copy.allocate(static_cast<uint64_t>(out.numel) * out.element_size, "matmul: output scratch");

  const float alpha_f = 1.0f;
  const float beta_f = 0.0f;
  const double alpha_d = 1.0;
  const double beta_d = 0.0;
  const void* alpha = types.double_scalars ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = types.double_scalars ? static_cast<const void*>(&beta_d) : &beta_f;
  cublasHandle_t h = call.device.blas();
  const cublasStatus_t s = cublasGemmStridedBatchedEx_64(
      h, plan.a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N, plan.b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N, plan.m,
      plan.n, plan.k, alpha, blas_a, types.data, plan.a.ld, plan.a.batch_stride, blas_b, types.data,
      plan.b.ld, plan.b.batch_stride, beta, blas_c, types.data, plan.ldc, plan.stride_c, plan.batch,
      types.compute, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS)
    fail(s == CUBLAS_STATUS_ALLOC_FAILED ? BP_STATUS_OUT_OF_MEMORY : BP_STATUS_INTERNAL,
         "cuda: matmul: cublasGemmStridedBatchedEx failed: " + std::string(cublasGetStatusString(s)) +
             " (m " + std::to_string(plan.m) + ", n " + std::to_string(plan.n) + ", k " +
             std::to_string(plan.k) + ", batch " + std::to_string(plan.batch) + ")");
  call.device.check_launch("matmul");
  if (plan.out_needs_copy) scatter_dense(call, blas_c, out);
}

}  // namespace backplane::cuda
