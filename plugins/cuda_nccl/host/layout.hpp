// Host-computable layouts the cuda plugin hands to its kernels, kept free of
// CUDA so that the CPU tests check them without a GPU:
//  - IndexMap: the strided/broadcast index map of N operands that share one
//    shape (coalesced with the SDK's rules), evaluated the same way on the
//    host (tests) and on the device (kernels include this header);
//  - launch geometry of the grid-stride and row kernels;
//  - GemmPlan: how a (batched) row-major matmul of strided views maps onto one
//    column-major cublasGemmStridedBatchedEx call;
//  - the bit pattern a fill writes, and the slot where kernels report
//    data-dependent errors (an index out of range) to the host.
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_HOST_LAYOUT_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_HOST_LAYOUT_HPP_

#include <cstdint>
#include <string>

#if defined(__CUDACC__)
#define BP_CUDA_HD __host__ __device__ __forceinline__
#else
#define BP_CUDA_HD inline
#endif

namespace backplane::cuda {

// The most dimensions an IndexMap holds: the host's Shape::kMaxRank, so every
// view the host sends fits (coalescing only lowers ndim).
inline constexpr int kMaxMapDims = 8;

// N operands over one shape. Passed to kernels by value (a few hundred bytes).
template <int N>
struct IndexMap {
  int32_t ndim = 1;
  int64_t shape[kMaxMapDims] = {1};
  int64_t strides[N][kMaxMapDims] = {};
};

// Element offsets of each operand for the row-major linear index `linear` of
// the shared shape.
template <int N>
BP_CUDA_HD void map_offsets(const IndexMap<N>& m, int64_t linear, int64_t (&offset)[N]) {
  if (m.ndim == 1) {  // the common case after coalescing: no division
    for (int k = 0; k < N; ++k) offset[k] = linear * m.strides[k][0];
    return;
  }
  for (int k = 0; k < N; ++k) offset[k] = 0;
  for (int d = m.ndim - 1; d >= 0; --d) {
    const int64_t extent = m.shape[d];
    const int64_t i = linear % extent;
    linear /= extent;
    for (int k = 0; k < N; ++k) offset[k] += i * m.strides[k][d];
  }
}

// The map of operands whose strides (in elements) are `strides[k]`, over
// `shape` (ndim <= kMaxMapDims, no negative extent: the host validated it).
// Dimensions of extent 1 are dropped and neighbours where every operand is
// dense across the pair are merged, as the SDK's coalesce() does.
template <int N>
IndexMap<N> make_index_map(int32_t ndim, const int64_t* shape, const int64_t* const (&strides)[N]);

// ---- launch geometry --------------------------------------------------------

struct Launch {
  uint32_t blocks = 0;  // 0: nothing to launch
  uint32_t threads = 0;
};

// Threads per block of every 1-D and row kernel (the reductions' CUB
// BlockReduce is compiled for this size).
inline constexpr uint32_t kBlockThreads = 256;

// A grid-stride kernel over n elements: enough blocks to fill the device
// (`sm_count` multiprocessors, a few blocks each) and no more than the work.
Launch launch_1d(int64_t n, int sm_count);

// One block per row, rows visited grid-stride when there are more rows than
// the grid holds.
Launch launch_rows(int64_t rows, int sm_count);

// ---- matmul -----------------------------------------------------------------

// One operand of a (batched) matrix product as cuBLAS reads it.
struct GemmOperand {
  bool transpose = false;  // cuBLAS op T
  int64_t ld = 1;
  int64_t batch_stride = 0;  // elements; 0 broadcasts one matrix
  bool needs_copy = false;   // its layout is not BLAS-compatible: copy it dense first
};

// out[b] = a[b] @ b[b] (row-major, [M,K] x [K,N]) as the column-major call
// C^T = B^T A^T: cuBLAS's m = N, n = M, k = K, its A is our b, its B our a.
struct GemmPlan {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  GemmOperand a;  // cuBLAS's A: our right operand
  GemmOperand b;  // cuBLAS's B: our left operand
  int64_t ldc = 1;
  int64_t stride_c = 0;
  bool out_needs_copy = false;  // the output is not dense row-major: compute into scratch
};

// A strided matrix view: extents and strides of the last two dims, plus the
// batch dims (already broadcast to the output's batch shape by the host).
struct MatrixView {
  int32_t ndim = 2;  // >= 2
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;
};

// Plans out = left @ right. An operand that cannot be read in place (its last
// two dims have no unit stride, or its batch dims do not collapse into one
// stride) gets needs_copy, and the plan then assumes a dense row-major copy.
GemmPlan plan_gemm(const MatrixView& left, const MatrixView& right, const MatrixView& out);

// ---- fill and errors ------------------------------------------------------------

// The bits of `value` converted to `dtype` as a cast would convert it (floats
// round to nearest, f16/bf16 to nearest even; to integers truncates toward
// zero and saturates, NaN gives 0; bool is value != 0), in the low bytes.
uint64_t scalar_bits(int32_t dtype, double value);

// IEEE binary16 / bfloat16 from a float, round to nearest even (NaN stays NaN),
// and back: backplane_common/half.hpp's, for the .cu files to call.
uint16_t float_to_half_bits(float value) noexcept;
uint16_t float_to_bf16_bits(float value) noexcept;
float half_bits_to_float(uint16_t bits) noexcept;
float bf16_bits_to_float(uint16_t bits) noexcept;

// What a kernel found that only the data could tell. Lives in mapped pinned
// host memory: a kernel claims it (the first error wins), the host reads it
// after the stream synchronised and turns it into INVALID_ARGUMENT.
enum DataError : int32_t {
  kDataOk = 0,
  kIndexOutOfRange = 1,  // value: the index, bound: the axis extent
  kIntegerDivByZero = 2,
  kNegativeIntegerPower = 3,  // value: the exponent
};
struct ErrorSlot {
  int32_t kind;  // DataError
  int32_t op;    // bp_op of the kernel that claimed the slot
  int64_t value;
  int64_t bound;
};

// The message of a claimed slot: what, which op, and what to do.
std::string describe_data_error(const ErrorSlot& slot);

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_HOST_LAYOUT_HPP_
