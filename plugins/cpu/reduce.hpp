// Reductions of the cpu plugin along one axis: sum, mean, max, min, argmax, argmin.
// The input is contiguous, viewed as [outer, n, inner]; the output holds outer * inner
// contiguous results. Pure functions over raw pointers, like kernels.hpp.
#ifndef BACKPLANE_PLUGINS_CPU_REDUCE_HPP_
#define BACKPLANE_PLUGINS_CPU_REDUCE_HPP_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.hpp"

namespace backplane::cpu {

enum class ReduceOp : int { sum, mean, max, min, argmax, argmin };

// Semantics, for every op:
//  - sum: f32 and f64 accumulate in double (blocked, so the error grows with the block
//    counts, not with n); integers wrap (two's complement). An empty axis gives 0.
//  - mean: floats only; sum / n; an empty axis gives NaN.
//  - max, min: a NaN anywhere along the axis gives NaN.
//  - argmax, argmin: the first index of the extreme; the first NaN counts as the extreme.
//  - max, min, argmax, argmin of an empty axis have no value: reduce() returns false.
namespace reduce_detail {

template <class T>
[[gnu::always_inline]] inline bool is_nan(T x) noexcept {
  if constexpr (std::is_floating_point_v<T>)
    return x != x;
  else
    return false;
}

// Accumulator of a sum: double for floats, the unsigned type of the same width for
// integers (wraps without undefined behaviour).
template <class T, bool = std::is_floating_point_v<T>>
struct SumAccOf {
  using type = double;
};
template <class T>
struct SumAccOf<T, false> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using SumAcc = typename SumAccOf<T>::type;

// Vertical (inner > 1) float sums: rows accumulated before the partial joins the total.
inline constexpr int64_t kSumBlock = 4096;
// Elements scanned at once by argmax/argmin: the block's extreme is found with SIMD, and
// only a block that improves on the best so far is searched for its index.
inline constexpr int64_t kArgBlock = 1024;
// Width of a vertical (inner > 1) tile: the accumulators of one tile stay in L1.
inline constexpr int64_t kTile = 256;
// Contiguous rows shorter than this are reduced inline, element by element: a call
// through the clone dispatcher per row would cost more than the row.
inline constexpr int64_t kShortRow = 16;

// Sum of the contiguous float (or double) x[0..n): kLanes independent accumulators of T
// (SIMD registers, latency hidden) over blocks of kBlock elements, block sums added in
// double. Each lane sums kBlock / kLanes = 16 (f32) or 256 (f64) terms, so the error
// stays within about (16 + 6) ulp of the block's sum of |x| for f32, as pairwise
// summation's, while the loop runs at memory speed (f32 lanes of double measured 2x
// slower from memory). Inline, so it compiles for the caller's clone.
template <class T>
[[gnu::always_inline]] inline double sum_floats(const T* x, int64_t n) noexcept {
  static_assert(std::is_floating_point_v<T>);
  constexpr int kLanes = std::is_same_v<T, float> ? 64 : 16;
  constexpr int64_t kBlock = std::is_same_v<T, float> ? 1024 : 4096;
  double total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    const T* p = x + b;
    T acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= m; i += kLanes)
      for (int j = 0; j < kLanes; ++j) acc[j] += p[i + j];
    for (; i < m; ++i) acc[0] += p[i];  // acc[i % kLanes] would force acc into memory
    for (int w = kLanes / 2; w > 0; w /= 2)
      for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    total += static_cast<double>(acc[0]);
  }
  return total;
}

// Sum of the contiguous x[0..n); integers wrap.
template <class T>
BP_CPU_CLONES inline SumAcc<T> sum_row(const T* x, int64_t n) noexcept {
  using A = SumAcc<T>;
  if constexpr (std::is_integral_v<T>) {
    A acc = 0;
    BP_CPU_PRAGMA(omp simd reduction(+ : acc))
    for (int64_t i = 0; i < n; ++i) acc += static_cast<A>(x[i]);
    return acc;
  } else {
    return sum_floats(x, n);
  }
}

// acc[0..w) += rows [0, rows) of x (row stride `stride`); w <= kTile.
template <class T>
BP_CPU_CLONES inline void sum_rows(const T* x, int64_t rows, int64_t stride, int64_t w,
                                   SumAcc<T>* acc) noexcept {
  using A = SumAcc<T>;
  if constexpr (std::is_integral_v<T>) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* p = x + r * stride;
      BP_CPU_PRAGMA(omp simd)
      for (int64_t j = 0; j < w; ++j) acc[j] += static_cast<A>(p[j]);
    }
  } else {
    A block[kTile];
    for (int64_t r0 = 0; r0 < rows; r0 += kSumBlock) {
      const int64_t r1 = std::min(rows, r0 + kSumBlock);
      std::fill(block, block + w, A{0});
      for (int64_t r = r0; r < r1; ++r) {
        const T* p = x + r * stride;
        BP_CPU_PRAGMA(omp simd)
        for (int64_t j = 0; j < w; ++j) block[j] += static_cast<A>(p[j]);
      }
      BP_CPU_PRAGMA(omp simd)
      for (int64_t j = 0; j < w; ++j) acc[j] += block[j];
    }
  }
}

// The largest (Max) or smallest element of x[0..n), n >= 1; NaN when x holds a NaN.
template <bool Max, class T>
BP_CPU_CLONES inline T extreme_row(const T* x, int64_t n) noexcept {
  T m = x[0];
  int nan = 0;
  if constexpr (Max) {
    BP_CPU_PRAGMA(omp simd reduction(max : m) reduction(| : nan))
    for (int64_t i = 0; i < n; ++i) {
      m = x[i] > m ? x[i] : m;
      nan |= is_nan(x[i]);
    }
  } else {
    BP_CPU_PRAGMA(omp simd reduction(min : m) reduction(| : nan))
    for (int64_t i = 0; i < n; ++i) {
      m = x[i] < m ? x[i] : m;
      nan |= is_nan(x[i]);
    }
  }
  if constexpr (std::is_floating_point_v<T>)
    if (nan) return std::numeric_limits<T>::quiet_NaN();
  return m;
}

// best[j] = extreme(best[j], row r) for rows [0, rows); a NaN sticks.
template <bool Max, class T>
BP_CPU_CLONES inline void extreme_rows(const T* x, int64_t rows, int64_t stride, int64_t w,
                                       T* best) noexcept {
  for (int64_t r = 0; r < rows; ++r) {
    const T* p = x + r * stride;
    BP_CPU_PRAGMA(omp simd)
    for (int64_t j = 0; j < w; ++j) {
      const T v = p[j];
      const bool take = (Max ? v > best[j] : v < best[j]) || is_nan(v);
      best[j] = take ? v : best[j];
    }
  }
}

// Extends the running (best, index) of an arg reduction (index < 0: nothing seen yet)
// by x[0..n), whose first element has axis index `base`. Stops at the first NaN.
template <bool Max, class T>
BP_CPU_CLONES inline void arg_row(const T* x, int64_t n, int64_t base, T& best, int64_t& index) noexcept {
  if (index >= 0 && is_nan(best)) return;
  for (int64_t b = 0; b < n; b += kArgBlock) {
    const int64_t m = std::min(kArgBlock, n - b);
    const T* p = x + b;
    // The block's extreme by the vectorised scan; only a winning block is searched.
    const T e = extreme_row<Max>(p, m);
    if (is_nan(e)) {
      int64_t i = 0;
      while (!is_nan(p[i])) ++i;
      best = p[i];
      index = base + b + i;
      return;
    }
    if (index < 0 || (Max ? e > best : e < best)) {
      int64_t i = 0;
      while (p[i] != e) ++i;
      best = e;
      index = base + b + i;
    }
  }
}

// The vertical form of arg_row: rows [0, rows) of x, row r having axis index base + r,
// against (best[j], index[j]), which hold at least one earlier row.
template <bool Max, class T>
BP_CPU_CLONES inline void arg_rows(const T* x, int64_t rows, int64_t stride, int64_t w, int64_t base, T* best,
                                   int64_t* index) noexcept {
  for (int64_t r = 0; r < rows; ++r) {
    const T* p = x + r * stride;
    const int64_t at = base + r;
    BP_CPU_PRAGMA(omp simd)
    for (int64_t j = 0; j < w; ++j) {
      const T v = p[j];
      const T b = best[j];
      const bool take = (Max ? v > b : v < b) || (is_nan(v) && !is_nan(b));
      best[j] = take ? v : b;
      index[j] = take ? at : index[j];
    }
  }
}

// One op on one dtype. A state is (acc, index): index < 0 marks an empty state for the
// extremes; sums ignore it. combine() takes states in any order (ties go to the lower
// index), so partial results of threads merge without bookkeeping.
template <ReduceOp Op, class T>
struct Reducer {
  static constexpr bool kSum = Op == ReduceOp::sum || Op == ReduceOp::mean;
  static constexpr bool kMax = Op == ReduceOp::max || Op == ReduceOp::argmax;
  static constexpr bool kArg = Op == ReduceOp::argmax || Op == ReduceOp::argmin;
  static_assert(Op != ReduceOp::mean || std::is_floating_point_v<T>, "mean is for float dtypes");
  using Acc = std::conditional_t<kSum, SumAcc<T>, T>;
  using Out = std::conditional_t<kArg, int64_t, T>;

  static void init(Acc& acc, int64_t& index) noexcept {
    acc = Acc{};
    index = -1;
  }

  // Extends a state by the contiguous x[0..n), axis indices base...
  static void row(const T* x, int64_t n, int64_t base, Acc& acc, int64_t& index) noexcept {
    if constexpr (kSum) {
      acc += sum_row<T>(x, n);
    } else if constexpr (kArg) {
      arg_row<kMax, T>(x, n, base, acc, index);
    } else {
      if (n > 0) combine(acc, index, extreme_row<kMax, T>(x, n), base);
    }
  }

  // row() for a short row, element by element.
  static void short_row(const T* x, int64_t n, int64_t base, Acc& acc, int64_t& index) noexcept {
    for (int64_t i = 0; i < n; ++i) combine(acc, index, static_cast<Acc>(x[i]), base + i);
  }

  // Starts states of a w-wide tile from row 0 of x (axis index base); returns the
  // rows consumed (0 or 1).
  static int64_t start_rows(const T* x, int64_t w, int64_t base, Acc* acc, int64_t* index) noexcept {
    if constexpr (kSum) {
      std::fill(acc, acc + w, Acc{0});
      return 0;
    } else {
      std::copy(x, x + w, acc);
      std::fill(index, index + w, base);
      return 1;
    }
  }

  // Extends tile states by rows [0, rows) of x, axis indices base...
  static void rows(const T* x, int64_t rows, int64_t stride, int64_t w, int64_t base, Acc* acc,
                   int64_t* index) noexcept {
    if constexpr (kSum)
      sum_rows<T>(x, rows, stride, w, acc);
    else if constexpr (kArg)
      arg_rows<kMax, T>(x, rows, stride, w, base, acc, index);
    else
      extreme_rows<kMax, T>(x, rows, stride, w, acc);
  }

  static void combine(Acc& a, int64_t& ia, Acc b, int64_t ib) noexcept {
    if constexpr (kSum) {
      a += b;
    } else {
      if (ib < 0) return;
      bool take;
      if (ia < 0)
        take = true;
      else if (is_nan(a))
        take = is_nan(b) && ib < ia;
      else if (is_nan(b))
        take = true;
      else
        take = (kMax ? b > a : b < a) || (b == a && ib < ia);
      if (take) {
        a = b;
        ia = ib;
      }
    }
  }

  static Out finish(Acc acc, int64_t index, int64_t n) noexcept {
    if constexpr (Op == ReduceOp::sum) {
      return static_cast<T>(acc);
    } else if constexpr (Op == ReduceOp::mean) {
      return n == 0 ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(acc / static_cast<double>(n));
    } else if constexpr (kArg) {
      return index;
    } else {
      return acc;
    }
  }
};

// The team's share [lo, hi) of `total` work items for thread `id` of `nt`.
inline void share(int64_t total, int64_t nt, int64_t id, int64_t& lo, int64_t& hi) noexcept {
  const int64_t per = (total + nt - 1) / nt;
  lo = std::min(total, id * per);
  hi = std::min(total, lo + per);
}

// inner == 1: outer rows of n contiguous elements. The team splits the outer * n
// elements evenly, whatever the shape: a thread finishes the rows that lie wholly in its
// share and leaves a partial state for the (at most two) rows it shares with others.
template <ReduceOp Op, class T>
void reduce_contiguous(const T* x, typename Reducer<Op, T>::Out* out, int64_t outer, int64_t n, int threads) {
  using R = Reducer<Op, T>;
  using Acc = typename R::Acc;
  [[maybe_unused]] const int team = threads_for(outer * n, threads);  // unused without OpenMP
  const auto whole_row = [&](int64_t o) {
    Acc acc;
    int64_t index;
    R::init(acc, index);
    if (n < kShortRow)
      R::short_row(x + o * n, n, 0, acc, index);
    else
      R::row(x + o * n, n, 0, acc, index);
    out[o] = R::finish(acc, index, n);
  };
#ifdef _OPENMP
  if (team > 1) {
    struct Partial {
      int64_t row = -1;
      Acc acc{};
      int64_t index = -1;
    };
    std::vector<Partial> parts(2 * static_cast<std::size_t>(team));
    const unsigned mode = fp_mode();  // the team computes as the caller does (fp_mode.hpp)
    BP_CPU_PRAGMA(omp parallel num_threads(team)) {
      const FpModeScope fp(mode);
      const int64_t id = omp_get_thread_num();
      int64_t lo, hi;
      share(outer * n, omp_get_num_threads(), id, lo, hi);
      if (lo < hi) {
        const int64_t first = lo / n;
        const int64_t last = (hi - 1) / n;
        const auto partial = [&](Partial& p, int64_t o, int64_t i0, int64_t i1) {
          p.row = o;
          R::init(p.acc, p.index);
          R::row(x + o * n + i0, i1 - i0, i0, p.acc, p.index);
        };
        partial(parts[2 * id], first, lo - first * n, std::min(n, hi - first * n));
        for (int64_t o = first + 1; o < last; ++o) whole_row(o);
        if (last > first) partial(parts[2 * id + 1], last, 0, hi - last * n);
      }
    }
    // Partials are in row order; merge the runs that share a row.
    for (std::size_t i = 0; i < parts.size();) {
      if (parts[i].row < 0) {
        ++i;
        continue;
      }
      Partial merged = parts[i];
      std::size_t j = i + 1;
      for (; j < parts.size() && (parts[j].row < 0 || parts[j].row == merged.row); ++j)
        if (parts[j].row >= 0) R::combine(merged.acc, merged.index, parts[j].acc, parts[j].index);
      out[merged.row] = R::finish(merged.acc, merged.index, n);
      i = j;
    }
    return;
  }
#endif
  for (int64_t o = 0; o < outer; ++o) whole_row(o);
}

// inner > 1: vertical accumulation over rows, in tiles of at most kTile columns. The
// work items are (tile, row) pairs, split evenly as in reduce_contiguous.
template <ReduceOp Op, class T>
void reduce_vertical(const T* x, typename Reducer<Op, T>::Out* out, int64_t outer, int64_t n, int64_t inner,
                     int threads) {
  using R = Reducer<Op, T>;
  using Acc = typename R::Acc;
  const int64_t tiles_per_outer = (inner + kTile - 1) / kTile;
  const int64_t units = outer * tiles_per_outer;
  struct Tile {
    const T* x;
    int64_t column;  // of the first column in the output's row
    int64_t width;
  };
  const auto tile = [&](int64_t u) {
    const int64_t o = u / tiles_per_outer;
    const int64_t j0 = (u % tiles_per_outer) * kTile;
    return Tile{x + o * n * inner + j0, o * inner + j0, std::min(kTile, inner - j0)};
  };
  // States of tile t over rows [r0, r1), r1 > r0.
  const auto accumulate = [&](const Tile& t, int64_t r0, int64_t r1, Acc* acc, int64_t* index) {
    const T* p = t.x + r0 * inner;
    const int64_t used = R::start_rows(p, t.width, r0, acc, index);
    R::rows(p + used * inner, r1 - r0 - used, inner, t.width, r0 + used, acc, index);
  };
  const auto finish = [&](const Tile& t, const Acc* acc, const int64_t* index) {
    for (int64_t j = 0; j < t.width; ++j) out[t.column + j] = R::finish(acc[j], index[j], n);
  };
  const auto whole_unit = [&](int64_t u) {
    Acc acc[kTile];
    int64_t index[kTile];
    const Tile t = tile(u);
    accumulate(t, 0, n, acc, index);
    finish(t, acc, index);
  };
  [[maybe_unused]] const int team = threads_for(outer * n * inner, threads);  // unused without OpenMP
#ifdef _OPENMP
  if (team > 1) {
    struct Partial {
      int64_t unit = -1;
      Acc acc[kTile];
      int64_t index[kTile];
    };
    std::vector<Partial> parts(2 * static_cast<std::size_t>(team));
    const unsigned mode = fp_mode();  // the team computes as the caller does (fp_mode.hpp)
    BP_CPU_PRAGMA(omp parallel num_threads(team)) {
      const FpModeScope fp(mode);
      const int64_t id = omp_get_thread_num();
      int64_t lo, hi;
      share(units * n, omp_get_num_threads(), id, lo, hi);
      if (lo < hi) {
        const int64_t first = lo / n;
        const int64_t last = (hi - 1) / n;
        const auto partial = [&](Partial& p, int64_t u, int64_t r0, int64_t r1) {
          p.unit = u;
          accumulate(tile(u), r0, r1, p.acc, p.index);
        };
        partial(parts[2 * id], first, lo - first * n, std::min(n, hi - first * n));
        for (int64_t u = first + 1; u < last; ++u) whole_unit(u);
        if (last > first) partial(parts[2 * id + 1], last, 0, hi - last * n);
      }
    }
    for (std::size_t i = 0; i < parts.size();) {
      if (parts[i].unit < 0) {
        ++i;
        continue;
      }
      Partial& merged = parts[i];
      const Tile t = tile(merged.unit);
      std::size_t j = i + 1;
      for (; j < parts.size() && (parts[j].unit < 0 || parts[j].unit == merged.unit); ++j)
        if (parts[j].unit >= 0)
          for (int64_t c = 0; c < t.width; ++c)
            R::combine(merged.acc[c], merged.index[c], parts[j].acc[c], parts[j].index[c]);
      finish(t, merged.acc, merged.index);
      i = j;
    }
    return;
  }
#endif
  for (int64_t u = 0; u < units; ++u) whole_unit(u);
}

}  // namespace reduce_detail

// Output element type of op on T: int64_t for argmax/argmin, T otherwise.
template <ReduceOp Op, class T>
using ReduceOut = typename reduce_detail::Reducer<Op, T>::Out;

// out[o * inner + j] = op over i of x[(o * n + i) * inner + j]. x is contiguous, out
// holds outer * inner elements and does not overlap x. Returns false (writing nothing)
// for max, min, argmax and argmin of an empty axis (n == 0), which have no value.
// May throw std::bad_alloc (a few kilobytes of per-thread partial states).
template <ReduceOp Op, class T>
bool reduce(const T* x, ReduceOut<Op, T>* out, int64_t outer, int64_t n, int64_t inner, int threads) {
  using R = reduce_detail::Reducer<Op, T>;
  if (outer == 0 || inner == 0) return true;
  if (n == 0) {
    if constexpr (!R::kSum) return false;
    std::fill(out, out + outer * inner, R::finish(typename R::Acc{0}, -1, 0));
    return true;
  }
  if (inner == 1)
    reduce_detail::reduce_contiguous<Op, T>(x, out, outer, n, threads);
  else
    reduce_detail::reduce_vertical<Op, T>(x, out, outer, n, inner, threads);
  return true;
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_REDUCE_HPP_
