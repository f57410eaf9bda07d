// Host-side layouts of the cuda plugin (layout.hpp): index maps, launch
// geometry, matmul plans, fill bits and data-error messages.
#include "layout.hpp"

#include <backplane/abi.h>
#include <backplane_common/half.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

namespace backplane::cuda {

template <int N>
IndexMap<N> make_index_map(int32_t ndim, const int64_t* shape, const int64_t* const (&strides)[N]) {
  IndexMap<N> m;
  int kept = 0;
  for (int32_t d = 0; d < ndim; ++d) {
    if (shape[d] == 1) continue;
    if (kept > 0) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k) mergeable = mergeable && m.strides[k][kept - 1] == strides[k][d] * shape[d];
      if (mergeable) {
        m.shape[kept - 1] *= shape[d];
        for (int k = 0; k < N; ++k) m.strides[k][kept - 1] = strides[k][d];
        continue;
      }
    }
    m.shape[kept] = shape[d];
    for (int k = 0; k < N; ++k) m.strides[k][kept] = strides[k][d];
    ++kept;
  }
  if (kept == 0) {  // a scalar, or every extent 1: one element at offset 0
    m.shape[0] = 1;
    for (int k = 0; k < N; ++k) m.strides[k][0] = 1;
    kept = 1;
  }
  m.ndim = kept;
  return m;
}

// The arities the kernels use.
template IndexMap<1> make_index_map<1>(int32_t, const int64_t*, const int64_t* const (&)[1]);
template IndexMap<2> make_index_map<2>(int32_t, const int64_t*, const int64_t* const (&)[2]);
template IndexMap<3> make_index_map<3>(int32_t, const int64_t*, const int64_t* const (&)[3]);
template IndexMap<4> make_index_map<4>(int32_t, const int64_t*, const int64_t* const (&)[4]);

Launch launch_1d(int64_t n, int sm_count) {
  if (n <= 0) return {};
  const int64_t needed = (n + kBlockThreads - 1) / kBlockThreads;
  // A few resident blocks per multiprocessor keep it busy; more only adds
  // scheduling (the kernels loop grid-stride).
  const int64_t fill = int64_t{std::max(sm_count, 1)} * 8;
  return {static_cast<uint32_t>(std::min(needed, fill)), kBlockThreads};
}

Launch launch_rows(int64_t rows, int sm_count) {
  if (rows <= 0) return {};
  const int64_t fill = int64_t{std::max(sm_count, 1)} * 32;
  return {static_cast<uint32_t>(std::min(rows, fill)), kBlockThreads};
}

namespace {

// How BLAS can read one [rows, cols] matrix with element strides (sr, sc):
// row-major (unit column stride) or column-major (unit row stride), and its
// leading dimension. False when neither holds.
bool blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, bool& column_major, int64_t& ld) {
  const int64_t min_row_ld = std::max<int64_t>(cols, 1);
  const int64_t min_col_ld = std::max<int64_t>(rows, 1);
  if ((cols == 1 || sc == 1) && (rows == 1 || sr >= min_row_ld)) {
    column_major = false;
    ld = rows == 1 ? min_row_ld : sr;
    return true;
  }
  if ((rows == 1 || sr == 1) && (cols == 1 || sc >= min_col_ld)) {
    column_major = true;
    ld = cols == 1 ? min_col_ld : sc;
    return true;
  }
  return false;
}

// One stride for every batch of the view, or false when its batch dims do
// not collapse into one (the linear batch index times the stride gives each
// matrix's offset). No batch dims: stride 0.
bool batch_stride(const MatrixView& v, int64_t& stride) {
  const int32_t batch_dims = v.ndim - 2;
  if (batch_dims <= 0) {
    stride = 0;
    return true;
  }
  const int64_t* const strides[1] = {v.strides};
  const IndexMap<1> m = make_index_map<1>(batch_dims, v.shape, strides);
  if (m.ndim != 1) return false;
  stride = m.shape[0] == 1 ? 0 : m.strides[0][0];
  return true;
}

// cuBLAS's view of one of our operands, which it reads transposed (C^T = B^T A^T):
// a row-major [R, C] matrix is a column-major [C, R] one (op N); a
// column-major one needs op T.
GemmOperand operand_of(const MatrixView& v) {
  const int32_t r = v.ndim - 2;
  const int32_t c = v.ndim - 1;
  GemmOperand op;
  bool column_major = false;
  int64_t ld = 0;
  int64_t stride = 0;
  if (blas_layout(v.shape[r], v.shape[c], v.strides[r], v.strides[c], column_major, ld) &&
      batch_stride(v, stride)) {
    op.transpose = column_major;
    op.ld = ld;
    op.batch_stride = stride;
    return op;
  }
  // A dense row-major copy.
  op.needs_copy = true;
  op.transpose = false;
  op.ld = std::max<int64_t>(v.shape[c], 1);
  op.batch_stride = v.shape[r] * v.shape[c];
  return op;
}

}  // namespace

GemmPlan plan_gemm(const MatrixView& left, const MatrixView& right, const MatrixView& out) {
  GemmPlan p;
  const int32_t lr = left.ndim - 2;
  p.n = left.shape[lr];               // M
  p.k = left.shape[lr + 1];           // K
  p.m = right.shape[right.ndim - 1];  // N
  for (int32_t d = 0; d < out.ndim - 2; ++d) p.batch *= out.shape[d];
  p.a = operand_of(right);
  p.b = operand_of(left);
  // The output must be row-major with unit column stride and collapse to one batch stride.
  const int32_t orow = out.ndim - 2;
  bool column_major = false;
  int64_t ld = 0;
  int64_t stride = 0;
  if (blas_layout(out.shape[orow], out.shape[orow + 1], out.strides[orow], out.strides[orow + 1],
                  column_major, ld) &&
      !column_major && batch_stride(out, stride)) {
    p.ldc = ld;
    p.stride_c = stride;
  } else {
    p.out_needs_copy = true;
    p.ldc = std::max<int64_t>(p.m, 1);
    p.stride_c = p.n * p.m;
  }
  return p;
}

namespace {

template <class I>
I saturate(double x) {
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<I>::max() / 2 + 1) * 2.0;
  return x != x    ? I{0}
         : x <= lo ? std::numeric_limits<I>::min()
         : x >= hi ? std::numeric_limits<I>::max()
                   : static_cast<I>(x);
}

template <class T>
uint64_t bits_of(T v) {
  using U =
      std::conditional_t<sizeof(T) == 1, uint8_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
  return static_cast<uint64_t>(std::bit_cast<U>(v));
}

}  // namespace

uint64_t scalar_bits(int32_t dtype, double value) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return bits_of(static_cast<float>(value));
    case BP_DTYPE_F64:
      return bits_of(value);
    case BP_DTYPE_I32:
      return bits_of(saturate<int32_t>(value));
    case BP_DTYPE_I64:
      return bits_of(saturate<int64_t>(value));
    case BP_DTYPE_BOOL:
      return value != 0.0 ? 1 : 0;
    case BP_DTYPE_F16:
      return float_to_half_bits(static_cast<float>(value));
    case BP_DTYPE_BF16:
      return float_to_bf16_bits(static_cast<float>(value));
    case BP_DTYPE_U8:
      return bits_of(saturate<uint8_t>(value));
    case BP_DTYPE_I8:
      return bits_of(saturate<int8_t>(value));
    default:
      return 0;
  }
}

uint16_t float_to_half_bits(float value) noexcept { return common::f32_to_f16(value); }
uint16_t float_to_bf16_bits(float value) noexcept { return common::f32_to_bf16(value); }
float half_bits_to_float(uint16_t bits) noexcept { return common::f16_to_f32(bits); }
float bf16_bits_to_float(uint16_t bits) noexcept { return common::bf16_to_f32(bits); }

std::string describe_data_error(const ErrorSlot& slot) {
  const char* op_name = bp_op_name(slot.op);
  const std::string op = op_name != nullptr ? op_name : "op " + std::to_string(slot.op);
  switch (slot.kind) {
    case kIndexOutOfRange:
      return op + ": index " + std::to_string(slot.value) + " is out of range for an axis of extent " +
             std::to_string(slot.bound) + " (valid: 0.." + std::to_string(slot.bound - 1) +
             "); found by the kernel on the device, reported at this synchronising call: fix the index "
             "tensor";
    case kIntegerDivByZero:
      return op +
             ": inputs[1] holds a zero, and integer division by zero has no value (found on the device, "
             "reported at this synchronising call); use a float dtype or mask the zeros";
    case kNegativeIntegerPower:
      return op + ": integer exponent " + std::to_string(slot.value) +
             " is negative, which has no integer result (found on the device, reported at this synchronising "
             "call); use a float dtype";
    default:
      return op + ": the device reported data error " + std::to_string(slot.kind);
  }
}

}  // namespace backplane::cuda
