// matmul of the cpu engine: [...,M,K] x [...,K,N] -> [...,M,N] through OpenBLAS
// (gemm.hpp), batch dims arriving broadcast by the host.
#include <atomic>
#include <backplane/plugin.hpp>

#include "gemm.hpp"
#include "op_dtypes.hpp"
#include "ops.hpp"

namespace backplane::cpu {
namespace {

// OpenBLAS keeps one process-wide thread count; it follows the "threads" option of
// the instance that calls. Set only when it changes: the call takes a lock inside.
void use_blas_threads(int threads) {
  static std::atomic<int> current{0};
  if (current.exchange(threads, std::memory_order_relaxed) != threads) openblas_set_num_threads(threads);
}

}  // namespace

void run_matmul(const OpCall& call) {
  expect_arity(call, 2);
  const int32_t dtype = call.output().dtype;
  plugin::dispatch<FloatDTypes>(dtype, call.name(), [&]<class T>() {
    const TensorView out = output_view(call, dtype);
    const TensorView a = input_view(call, 0, dtype);
    const TensorView b = input_view(call, 1, dtype);
    const int32_t r = out.ndim - 2;  // the last two dims are the matrices; any before them, batch dims
    if (r < 0)
      plugin::fail(BP_STATUS_INVALID_ARGUMENT,
                   "cpu: matmul: the output " + out.shape_string() + " is not [...,M,N]");
    if (!gemm_fits_blas(a.shape[r], b.shape[r + 1], a.shape[r + 1]))
      plugin::fail(BP_STATUS_UNSUPPORTED, "cpu: matmul: a dimension of " + a.shape_string() + " x " +
                                              b.shape_string() +
                                              " exceeds OpenBLAS's 32-bit limit; split the product");
    if (out.numel == 0) return;
    use_blas_threads(call.threads);
    const MatrixView<const T> ma{a.as<const T>(), a.shape[r], a.shape[r + 1], a.strides[r], a.strides[r + 1]};
    const MatrixView<const T> mb{b.as<const T>(), b.shape[r], b.shape[r + 1], b.strides[r], b.strides[r + 1]};
    const MatrixView<T> mc{out.as<T>(), out.shape[r], out.shape[r + 1], out.strides[r], out.strides[r + 1]};
    if (r == 0)
      gemm<T>(ma, mb, mc);
    else
      gemm_batched<T>(ma, a.strides, mb, b.strides, mc, out.strides, r, out.shape);
  });
}

}  // namespace backplane::cpu
