// Strided and broadcast iteration for plugins: N operands that share one
// shape (the output's; inputs arrive broadcast to it with stride 0), with
// dimensions merged where every operand is dense across them, then visited
// row by row. Element offsets, not bytes.
//
//   StridedLayout<3> l = layout_of<3>(out, {&out, &a, &b});
//   coalesce(l);                         // [4,1,8] dense -> [32]
//   for_each_row(l, 0, rows(l), [&](const int64_t* off) { ... l.shape[l.ndim-1] elements ... });
#ifndef BACKPLANE_PLUGIN_STRIDED_HPP_
#define BACKPLANE_PLUGIN_STRIDED_HPP_

#include <backplane/plugin/tensor_view.hpp>

#include <cstdint>
#include <initializer_list>

namespace backplane::plugin {

template <int N>
struct StridedLayout {
  int ndim = 0;
  int64_t shape[kMaxDims];
  int64_t strides[N][kMaxDims];
};

// The layout of operands that all have `shape_of`'s shape.
template <int N>
StridedLayout<N> layout_of(const TensorView& shape_of,
                           std::initializer_list<const TensorView*> operands) noexcept {
  StridedLayout<N> l;
  l.ndim = shape_of.ndim;
  for (int32_t d = 0; d < shape_of.ndim; ++d) l.shape[d] = shape_of.shape[d];
  int k = 0;
  for (const TensorView* v : operands) {
    if (k >= N) break;
    for (int32_t d = 0; d < shape_of.ndim; ++d) l.strides[k][d] = v->strides[d];
    ++k;
  }
  return l;
}

// Drops extent-1 dimensions and merges a dimension into the one before it
// where every operand is dense across the pair. Leaves at least one dimension.
template <int N>
void coalesce(StridedLayout<N>& l) noexcept {
  int kept = 0;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.shape[d] == 1) continue;
    if (kept > 0) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k)
        mergeable = mergeable && l.strides[k][kept - 1] == l.strides[k][d] * l.shape[d];
      if (mergeable) {
        l.shape[kept - 1] *= l.shape[d];
        for (int k = 0; k < N; ++k) l.strides[k][kept - 1] = l.strides[k][d];
        continue;
      }
    }
    l.shape[kept] = l.shape[d];
    for (int k = 0; k < N; ++k) l.strides[k][kept] = l.strides[k][d];
    ++kept;
  }
  if (kept == 0) {
    l.shape[0] = 1;
    for (int k = 0; k < N; ++k) l.strides[k][0] = 1;
    kept = 1;
  }
  l.ndim = kept;
}

// Rows of a layout: the product of every extent but the last.
template <int N>
int64_t rows(const StridedLayout<N>& l) noexcept {
  int64_t r = 1;
  for (int d = 0; d + 1 < l.ndim; ++d) r *= l.shape[d];
  return r;
}

// Visits rows [r0, r1) of a layout: fn(offsets) gets each operand's element
// offset of the row's first element; a row has l.shape[l.ndim - 1] elements
// at l.strides[k][l.ndim - 1].
template <int N, class Fn>
void for_each_row(const StridedLayout<N>& l, int64_t r0, int64_t r1, Fn&& fn) {
  const int outer = l.ndim - 1;
  int64_t index[kMaxDims];
  int64_t offset[N] = {};
  int64_t r = r0;
  for (int d = outer - 1; d >= 0; --d) {
    index[d] = r == 0 ? 0 : r % l.shape[d];  // the first (often only) range starts at 0: no division
    r = r == 0 ? 0 : r / l.shape[d];
    for (int k = 0; k < N; ++k) offset[k] += index[d] * l.strides[k][d];
  }
  for (int64_t row = r0; row < r1; ++row) {
    fn(static_cast<const int64_t*>(offset));
    for (int d = outer - 1; d >= 0; --d) {
      if (++index[d] < l.shape[d]) {
        for (int k = 0; k < N; ++k) offset[k] += l.strides[k][d];
        break;
      }
      index[d] = 0;
      for (int k = 0; k < N; ++k) offset[k] -= (l.shape[d] - 1) * l.strides[k][d];
    }
  }
}

}  // namespace backplane::plugin

#endif  // BACKPLANE_PLUGIN_STRIDED_HPP_
