// Softmax and log-softmax of the cpu plugin along one axis of a contiguous tensor viewed
// as [outer, n, inner]. Numerically stable: the max along the axis is subtracted first.
// exp comes from glibc's libmvec where the build links it (vector_math.hpp: 4-8 lanes
// per call, with FMA on AVX2); otherwise f32 uses exp_f32x8 (below) and f64 std::exp.
#ifndef BACKPLANE_PLUGINS_CPU_SOFTMAX_HPP_
#define BACKPLANE_PLUGINS_CPU_SOFTMAX_HPP_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels.hpp"
#include "reduce.hpp"
#include "vector_math.hpp"

// The softmax kernels are bound by exp, so they also get an AVX-512 clone: libmvec's
// 16-lane expf measured 25% faster than its 8-lane one (the rest of the plugin is
// memory-bound and stays at AVX2; see BP_CPU_CLONES).
#if BP_CPU_HAS_CLONES
#define BP_CPU_SOFTMAX_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define BP_CPU_SOFTMAX_CLONES
#endif

namespace backplane::cpu {

// Eight floats in one GCC vector. exp is written on these explicitly: GCC 12 does not
// vectorise a loop over a scalar version (its range clamps stay branches: "control flow
// in loop"). In the baseline clone the type is lowered to two SSE registers.
using Float8 = float __attribute__((vector_size(32)));
using Int8 = int32_t __attribute__((vector_size(32)));

// v = e^v in each lane. Cody-Waite reduction x = k ln2 + r with |r| <= ln2/2, Cephes'
// degree-6 polynomial for e^r, then scaling by 2^k in two halves, so subnormal results
// and overflow to +inf come out of plain multiplies. Error below 1 ulp over the whole
// range (checked against double exp). e^NaN = NaN, e^+inf = +inf, e^-inf = +0.
// By reference: a 32-byte vector passed by value changes the calling convention
// between the AVX2 and baseline clones (GCC's -Wpsabi).
[[gnu::always_inline]] inline void exp_f32x8(Float8& v) noexcept {
  constexpr float kLow = -104.0f;  // e^-104 < 2^-150: rounds to 0
  constexpr float kHigh = 89.0f;   // e^89 > FLT_MAX: the scaling overflows to +inf
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // 9 significant bits, so k * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const Float8 zero = {};
  const Float8 low = zero + kLow;
  const Float8 high = zero + kHigh;
  const Int8 nan = v != v;
  Float8 t = nan ? zero : v;
  t = t < low ? low : t;
  t = t > high ? high : t;
  const Float8 kf = (t * kLog2e + kRound) - kRound;  // round(t / ln2), in [-150, 129]
  const Float8 r = (t - kf * kLn2Hi) - kf * kLn2Lo;
  Float8 p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Float8 y = p * (r * r) + r + 1.0f;
  const Int8 k = __builtin_convertvector(kf, Int8);
  const Int8 k1 = k / 2;  // both halves in [-75, 65]: normal powers of two
  const Int8 k2 = k - k1;
  const Float8 e =
      (y * reinterpret_cast<Float8>((k1 + 127) << 23)) * reinterpret_cast<Float8>((k2 + 127) << 23);
  v = nan ? v : e;
}

// e^x for one float, by the same code as exp_f32x8.
inline float exp_f32(float x) noexcept {
  Float8 v = Float8{} + x;
  exp_f32x8(v);
  return v[0];
}

namespace softmax_detail {

// Elements of a log_softmax row whose exps are buffered (on the stack) at a time.
inline constexpr int64_t kChunk = 1024;
// Widest vertical tile (columns), and the bytes one tile should span over all rows
// (so that the three passes over it hit the cache).
inline constexpr int64_t kMaxTile = 256;
inline constexpr int64_t kTileBytes = 256 * 1024;

// The max of x[0..n), n >= 1; NaN when x holds a NaN. Four independent vectors of
// lanes, so the compare-and-blend chain does not bound the speed.
template <class T>
[[gnu::always_inline]] inline T row_max(const T* x, int64_t n) noexcept {
  constexpr int kLanes = 4 * 32 / sizeof(T);
  T m[kLanes];
  T bad[kLanes];  // x - x: NaN once a NaN (or an infinity) has been seen
  std::fill(m, m + kLanes, x[0]);
  std::fill(bad, bad + kLanes, T{0});
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const T v = x[i + j];
      m[j] = v > m[j] ? v : m[j];
      bad[j] += v - v;
    }
  for (int w = kLanes / 2; w > 0; w /= 2)  // pairwise: vector ops, not a scalar chain
    for (int j = 0; j < w; ++j) {
      m[j] = m[j + w] > m[j] ? m[j + w] : m[j];
      bad[j] += bad[j + w];
    }
  T result = m[0];
  T any_bad = bad[0];
  for (; i < n; ++i) {
    result = x[i] > result ? x[i] : result;
    any_bad += x[i] - x[i];
  }
  // An infinity also makes any_bad NaN; only a NaN makes the max NaN.
  if (any_bad != any_bad)
    for (int64_t k = 0; k < n; ++k)
      if (x[k] != x[k]) return x[k];
  return result;
}

// y[i] = e^(x[i] - m) for i < n. y may be x itself. No sum here: a SIMD sum reduced
// per call costs a serial chain of lane adds (GCC's omp simd epilogue); the caller sums
// y afterwards with reduce_detail::sum_floats, reduced once per row.
template <class T>
[[gnu::always_inline]] inline void exp_shifted(const T* x, T m, T* y, int64_t n) noexcept {
  if constexpr (std::is_same_v<T, float> && !BP_CPU_VECTOR_MATH) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      Float8 v;
      std::memcpy(&v, x + i, sizeof v);
      v -= m;
      exp_f32x8(v);
      std::memcpy(y + i, &v, sizeof v);
    }
    if (i < n) {
      Float8 v = {};
      for (int64_t k = 0; k < n - i; ++k) v[k] = x[i + k] - m;
      exp_f32x8(v);
      for (int64_t k = 0; k < n - i; ++k) y[i + k] = v[k];
    }
  } else {
    BP_CPU_PRAGMA(omp simd)
    for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - m);
  }
}

// e[j] = exp(x[j] - m[j]) for j < w.
template <class T>
[[gnu::always_inline]] inline void exp_shifted_columns(const T* x, const T* m, T* e, int64_t w) noexcept {
  if constexpr (std::is_same_v<T, float> && !BP_CPU_VECTOR_MATH) {
    int64_t j = 0;
    for (; j + 8 <= w; j += 8) {
      Float8 v, mv;
      std::memcpy(&v, x + j, sizeof v);
      std::memcpy(&mv, m + j, sizeof mv);
      v -= mv;
      exp_f32x8(v);
      std::memcpy(e + j, &v, sizeof v);
    }
    if (j < w) {
      Float8 v = {};
      for (int64_t k = 0; k < w - j; ++k) v[k] = x[j + k] - m[j + k];
      exp_f32x8(v);
      for (int64_t k = 0; k < w - j; ++k) e[j + k] = v[k];
    }
  } else {
    BP_CPU_PRAGMA(omp simd)
    for (int64_t j = 0; j < w; ++j) e[j] = std::exp(x[j] - m[j]);
  }
}

// One contiguous row: y = softmax(x) or log_softmax(x). y may be x itself.
template <bool Log, class T>
BP_CPU_SOFTMAX_CLONES inline void softmax_row(const T* x, T* y, int64_t n) noexcept {
  const T m = row_max(x, n);
  double total = 0;
  if constexpr (Log) {
    // y must keep x (it may be x) for the last pass: the exps go through a buffer.
    T e[kChunk];
    for (int64_t c = 0; c < n; c += kChunk) {
      const int64_t len = std::min(kChunk, n - c);
      exp_shifted(x + c, m, e, len);
      total += reduce_detail::sum_floats(e, len);
    }
    // (x - m) - log(sum), not x - (m + log(sum)): the latter loses the low bits of
    // x - m when |m| is large.
    const T lse = static_cast<T>(std::log(total));
    BP_CPU_PRAGMA(omp simd)
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - lse;
  } else {
    exp_shifted(x, m, y, n);
    total = reduce_detail::sum_floats(y, n);
    const T inv = static_cast<T>(1.0 / total);
    BP_CPU_PRAGMA(omp simd)
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  }
}

// A tile of w columns (w <= kMaxTile) over n rows of stride `stride`: softmax down
// each column. y may be x itself.
template <bool Log, class T>
BP_CPU_SOFTMAX_CLONES inline void softmax_columns(const T* x, T* y, int64_t n, int64_t stride,
                                                  int64_t w) noexcept {
  T m[kMaxTile];
  double total[kMaxTile];
  T e[kMaxTile];
  std::copy(x, x + w, m);
  for (int64_t r = 1; r < n; ++r) {
    const T* p = x + r * stride;
    BP_CPU_PRAGMA(omp simd)
    for (int64_t j = 0; j < w; ++j) m[j] = (p[j] > m[j] || p[j] != p[j]) ? p[j] : m[j];
  }
  std::fill(total, total + w, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    T* q = y + r * stride;
    exp_shifted_columns(x + r * stride, m, Log ? e : q, w);
    const T* got = Log ? e : q;
    BP_CPU_PRAGMA(omp simd)
    for (int64_t j = 0; j < w; ++j) total[j] += static_cast<double>(got[j]);
  }
  T scale[kMaxTile];
  for (int64_t j = 0; j < w; ++j)
    scale[j] = Log ? static_cast<T>(std::log(total[j])) : static_cast<T>(1.0 / total[j]);
  for (int64_t r = 0; r < n; ++r) {
    const T* p = x + r * stride;
    T* q = y + r * stride;
    if constexpr (Log) {
      BP_CPU_PRAGMA(omp simd)
      for (int64_t j = 0; j < w; ++j) q[j] = (p[j] - m[j]) - scale[j];
    } else {
      BP_CPU_PRAGMA(omp simd)
      for (int64_t j = 0; j < w; ++j) q[j] *= scale[j];
    }
  }
}

}  // namespace softmax_detail

// y = softmax(x) (or log_softmax, Log) along the middle axis of [outer, n, inner]; both
// contiguous; y may be x itself but must not otherwise overlap it. A row (or column)
// holding NaN gives NaN throughout; one of only -inf gives NaN (as PyTorch does).
template <bool Log, class T>
void softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, int threads) {
  static_assert(std::is_floating_point_v<T>);
  if (outer == 0 || n == 0 || inner == 0) return;
  using namespace softmax_detail;
  if (inner == 1) {
    parallel_for_rows(outer, n, threads, [=](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) softmax_row<Log, T>(x + o * n, y + o * n, n);
      return true;
    });
    return;
  }
  // Tiles of columns narrow enough that one tile over all n rows stays in cache, but at
  // least 16 columns wide (two AVX2 vectors of f32) when inner allows.
  int64_t width = kTileBytes / (n * static_cast<int64_t>(sizeof(T)));
  width = std::clamp<int64_t>(width / 16 * 16, 16, kMaxTile);
  width = std::min(width, inner);
  const int64_t tiles = (inner + width - 1) / width;
  parallel_for_rows(outer * tiles, n * width, threads, [=](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t o = u / tiles;
      const int64_t j0 = (u % tiles) * width;
      const int64_t offset = o * n * inner + j0;
      softmax_columns<Log, T>(x + offset, y + offset, n, inner, std::min(width, inner - j0));
    }
    return true;
  });
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_SOFTMAX_HPP_
