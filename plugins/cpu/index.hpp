// index_select and gather of the cpu plugin, as one "take" kernel: out[p] = x[p with its
// axis coordinate replaced by an index], elements moved as raw bytes of their size.
// Indices are validated first (first_bad_index), so x is never read out of bounds.
#ifndef BACKPLANE_PLUGINS_CPU_INDEX_HPP_
#define BACKPLANE_PLUGINS_CPU_INDEX_HPP_

#include <cstdint>
#include <cstring>

#include "kernels.hpp"

namespace backplane::cpu {

namespace index_detail {

// Position of the first element of v[0..n) (stride s) outside [0, extent), or -1.
inline int64_t first_bad(const int64_t* v, int64_t s, int64_t n, int64_t extent) noexcept {
  const auto limit = static_cast<uint64_t>(extent);  // a negative index wraps above it
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<uint64_t>(v[i * s]) >= limit) return i;
  return -1;
}

// True when every element of the contiguous v[0..n) lies in [0, extent).
BP_CPU_CLONES inline bool all_in_range(const int64_t* v, int64_t n, int64_t extent) noexcept {
  const auto limit = static_cast<uint64_t>(extent);
  int bad = 0;
  BP_CPU_PRAGMA(omp simd reduction(| : bad))
  for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint64_t>(v[i]) >= limit;
  return bad == 0;
}

}  // namespace index_detail

// The row-major position, among the elements of the index tensor laid out by l (one
// operand, coalesced), of its first value outside [0, extent); -1 when all are valid.
inline int64_t first_bad_index(const StridedLayout<1>& l, const int64_t* index, int64_t extent, int threads) {
  const int inner = l.ndim - 1;
  const int64_t n = l.shape[inner];
  const int64_t s = l.strides[0][inner];
  if (l.ndim == 1 && s == 1) {
    // The common case, checked in parallel; the position is then found serially.
    const bool ok = parallel_for_chunks(n, threads, [=](int64_t lo, int64_t hi) {
      return index_detail::all_in_range(index + lo, hi - lo, extent);
    });
    return ok ? -1 : index_detail::first_bad(index, 1, n, extent);
  }
  int64_t rows = 1;
  for (int d = 0; d < inner; ++d) rows *= l.shape[d];
  int64_t found = -1;
  int64_t row = 0;
  for_each_row(l, 0, rows, [&](const int64_t* off) {
    if (found < 0) {
      const int64_t i = index_detail::first_bad(index + off[0], s, n, extent);
      if (i >= 0) found = row * n + i;
    }
    ++row;
  });
  return found;
}

// Over a coalesced layout of the output's shape with operands 0 = out, 1 = the index
// tensor, 2 = x with its axis stride set to 0:
//   out[off0] = x[off2 + index[off1] * x_axis_stride]
// E is an unsigned integer of the element's size. Every index must already lie in range;
// out must not overlap x or the index.
template <class E>
void take(const StridedLayout<3>& l, const E* x, const int64_t* index, int64_t x_axis_stride, E* out,
          int threads) {
  const int inner = l.ndim - 1;
  const int64_t n = l.shape[inner];
  const int64_t so = l.strides[0][inner];
  const int64_t si = l.strides[1][inner];
  const int64_t sx = l.strides[2][inner];
  // count elements of a row starting at the given operand pointers.
  const auto row = [=](E* o, const int64_t* idx, const E* src, int64_t count) {
    if (si == 0) {  // one index for the whole row: a (strided) copy
      const E* from = src + *idx * x_axis_stride;
      if (so == 1 && sx == 1) {
        std::memcpy(o, from, static_cast<std::size_t>(count) * sizeof(E));
      } else {
        for (int64_t k = 0; k < count; ++k) o[k * so] = from[k * sx];
      }
    } else if (so == 1 && sx == 0 && si == 1) {  // index_select / gather along the last axis
      for (int64_t k = 0; k < count; ++k) o[k] = src[idx[k] * x_axis_stride];
    } else {
      for (int64_t k = 0; k < count; ++k) o[k * so] = src[k * sx + idx[k * si] * x_axis_stride];
    }
  };
  if (l.ndim == 1) {  // one long row: split it, not the single row count
    parallel_for_chunks(n, threads, [=](int64_t lo, int64_t hi) {
      row(out + lo * so, index + lo * si, x + lo * sx, hi - lo);
      return true;
    });
    return;
  }
  int64_t rows = 1;
  for (int d = 0; d < inner; ++d) rows *= l.shape[d];
  parallel_for_rows(rows, n, threads, [&](int64_t r0, int64_t r1) {
    for_each_row(l, r0, r1, [&](const int64_t* off) { row(out + off[0], index + off[1], x + off[2], n); });
    return true;
  });
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_INDEX_HPP_
