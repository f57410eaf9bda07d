// GEMM of the cpu plugin: C = A * B on strided 2-D views through OpenBLAS (cblas,
// with OpenBLAS's own threads). Layouts BLAS cannot read are packed first.
#ifndef BACKPLANE_PLUGINS_CPU_GEMM_HPP_
#define BACKPLANE_PLUGINS_CPU_GEMM_HPP_

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "kernels.hpp"

// OpenBLAS extensions; declared here because not every cblas.h carries them.
extern "C" char* openblas_get_config(void);
extern "C" int openblas_get_num_threads(void);
extern "C" void openblas_set_num_threads(int);

namespace backplane::cpu {

// A rows x cols matrix; element (i, j) is data[i * row_stride + j * col_stride].
template <class T>
struct MatrixView {
  T* data;
  int64_t rows;
  int64_t cols;
  int64_t row_stride;
  int64_t col_stride;
};

// How BLAS can address a matrix in place: row-major (transposed == false) or
// column-major, with leading dimension ld. usable == false: pack it first.
struct BlasOperand {
  bool usable;
  bool transposed;
  int64_t ld;
};

// A dimension of extent 1 makes its stride irrelevant; zero, negative or overlapping
// strides (broadcast views, flipped views) are not BLAS layouts.
inline BlasOperand blas_operand(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) noexcept {
  constexpr int64_t kMaxLd = INT_MAX;
  if ((cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= std::max<int64_t>(cols, 1))) {
    const int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : row_stride;
    if (ld <= kMaxLd) return {true, false, ld};
  }
  if ((rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= std::max<int64_t>(rows, 1))) {
    const int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : col_stride;
    if (ld <= kMaxLd) return {true, true, ld};
  }
  return {false, false, 0};
}

// True when OpenBLAS (32-bit int interface) can take these extents.
inline bool gemm_fits_blas(int64_t m, int64_t n, int64_t k) noexcept {
  return m <= INT_MAX && n <= INT_MAX && k <= INT_MAX;
}

namespace detail {

template <class T>
std::unique_ptr<T[]> pack_row_major(const MatrixView<const T>& x) {
  auto packed = std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(x.rows * x.cols));
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t j = 0; j < x.cols; ++j) packed[i * x.cols + j] = x.data[i * x.row_stride + j * x.col_stride];
  return packed;
}

inline void blas_gemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n,
                      int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  cblas_sgemm(order, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}
inline void blas_gemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n,
                      int k, const double* a, int lda, const double* b, int ldb, double* c, int ldc) {
  cblas_dgemm(order, ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}

}  // namespace detail

// c = a * b for T = float or double. a is m x k, b is k x n, c is m x n; c must not
// overlap a or b, nor itself. Extents must satisfy gemm_fits_blas. k == 0 gives zeros.
// Throws std::bad_alloc when a packing buffer cannot be allocated.
template <class T>
void gemm(const MatrixView<const T>& a, const MatrixView<const T>& b, const MatrixView<T>& c) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  const int64_t m = c.rows;
  const int64_t n = c.cols;
  const int64_t k = a.cols;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c.data[i * c.row_stride + j * c.col_stride] = T{0};
    return;
  }

  std::unique_ptr<T[]> a_packed, b_packed, c_packed;
  const T* a_data = a.data;
  const T* b_data = b.data;
  T* c_data = c.data;
  BlasOperand oa = blas_operand(m, k, a.row_stride, a.col_stride);
  if (!oa.usable) {
    a_packed = detail::pack_row_major(a);
    a_data = a_packed.get();
    oa = {true, false, k};
  }
  BlasOperand ob = blas_operand(k, n, b.row_stride, b.col_stride);
  if (!ob.usable) {
    b_packed = detail::pack_row_major(b);
    b_data = b_packed.get();
    ob = {true, false, n};
  }
  BlasOperand oc = blas_operand(m, n, c.row_stride, c.col_stride);
  if (!oc.usable) {
    c_packed = std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(m * n));
    c_data = c_packed.get();
    oc = {true, false, n};
  }

  // A column-major C is computed as a column-major GEMM; an operand whose storage
  // order differs from C's is passed transposed.
  const enum CBLAS_ORDER order = oc.transposed ? CblasColMajor : CblasRowMajor;
  const enum CBLAS_TRANSPOSE ta = oa.transposed != oc.transposed ? CblasTrans : CblasNoTrans;
  const enum CBLAS_TRANSPOSE tb = ob.transposed != oc.transposed ? CblasTrans : CblasNoTrans;
  detail::blas_gemm(order, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), a_data,
                    static_cast<int>(oa.ld), b_data, static_cast<int>(ob.ld), c_data,
                    static_cast<int>(oc.ld));

  if (c_packed) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c.data[i * c.row_stride + j * c.col_stride] = c_packed[i * n + j];
  }
}

// Batched GEMM: for every index i of the batch shape (batch_ndim dims, no extent 0),
// c[i] = a[i] * b[i], where operand X's matrix i starts at X.data + sum_d i_d * X_batch[d]
// (stride 0 on a broadcast batch dim) and has X's 2-D view otherwise. When b is shared by
// every batch and the batch dims of a and c fold into their row dims (a contiguous stack
// of matrices, the common [B,M,K] x [K,N] case), this is one [B*M,K] x [K,N] GEMM;
// otherwise one GEMM per batch. Preconditions as gemm's, for every batch.
template <class T>
void gemm_batched(const MatrixView<const T>& a, const int64_t* a_batch, const MatrixView<const T>& b,
                  const int64_t* b_batch, const MatrixView<T>& c, const int64_t* c_batch, int batch_ndim,
                  const int64_t* batch_shape) {
  if (c.rows == 0 || c.cols == 0) return;
  bool b_shared = true;
  for (int d = 0; d < batch_ndim; ++d) b_shared = b_shared && (batch_shape[d] == 1 || b_batch[d] == 0);
  if (b_shared) {
    // Rows of a and c across batches: do (batch..., M) coalesce into one dimension?
    StridedLayout<2> rows;
    rows.ndim = batch_ndim + 1;
    for (int d = 0; d < batch_ndim; ++d) {
      rows.shape[d] = batch_shape[d];
      rows.strides[0][d] = c_batch[d];
      rows.strides[1][d] = a_batch[d];
    }
    rows.shape[batch_ndim] = c.rows;
    rows.strides[0][batch_ndim] = c.row_stride;
    rows.strides[1][batch_ndim] = a.row_stride;
    coalesce(rows);
    if (rows.ndim == 1 && gemm_fits_blas(rows.shape[0], c.cols, a.cols)) {
      const MatrixView<const T> a_all{a.data, rows.shape[0], a.cols, rows.strides[1][0], a.col_stride};
      const MatrixView<T> c_all{c.data, rows.shape[0], c.cols, rows.strides[0][0], c.col_stride};
      gemm<T>(a_all, b, c_all);
      return;
    }
  }
  StridedLayout<3> l;  // operands: 0 = c, 1 = a, 2 = b
  l.ndim = batch_ndim;
  for (int d = 0; d < batch_ndim; ++d) {
    l.shape[d] = batch_shape[d];
    l.strides[0][d] = c_batch[d];
    l.strides[1][d] = a_batch[d];
    l.strides[2][d] = b_batch[d];
  }
  coalesce(l);
  const int inner = l.ndim - 1;
  int64_t rows = 1;
  for (int d = 0; d < inner; ++d) rows *= l.shape[d];
  for_each_row(l, 0, rows, [&](const int64_t* off) {
    for (int64_t i = 0; i < l.shape[inner]; ++i) {
      MatrixView<const T> ai = a;
      MatrixView<const T> bi = b;
      MatrixView<T> ci = c;
      ai.data += off[1] + i * l.strides[1][inner];
      bi.data += off[2] + i * l.strides[2][inner];
      ci.data += off[0] + i * l.strides[0][inner];
      gemm<T>(ai, bi, ci);
    }
  });
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_GEMM_HPP_
