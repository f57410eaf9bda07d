// Softmax and log-softmax of the cpu plugin along one axis of a contiguous tensor viewed
// as [outer, n, inner]. Numerically stable: the max along the axis is subtracted first.
// exp comes from glibc's libmvec where the build links it (vector_math.hpp: 4-8 lanes
// per call, with FMA on AVX2); otherwise f32 uses exp_f32x8 (below) and f64 std::exp.
//
// Subnormals are never computed. Logits spread wide (a range of hundreds) send most
// x - max below ln(FLT_MIN): libmvec's expf leaves its vector path for a scalar call
// per lane there, and any multiply producing a subnormal takes a microcode assist;
// together they made such rows 35x slower than ordinary ones. So x - max below
// kExpLow gives e = 0 without calling exp on it, and a softmax output below the
// type's smallest normal is written as 0 (the exact value is below 1.2e-38 for f32;
// sums and every normal output are unchanged).
#ifndef BACKPLANE_PLUGINS_CPU_SOFTMAX_HPP_
#define BACKPLANE_PLUGINS_CPU_SOFTMAX_HPP_

#include <algorithm>
#include <bit>
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

// f32 exps through exp_f32x8 (below) where libmvec is not linked.
#define BP_CPU_SOFTMAX_INLINE_EXP (!BP_CPU_VECTOR_MATH)

namespace backplane::cpu {

// Eight floats in one GCC vector. exp is written on these explicitly: GCC 12 does not
// vectorise a loop over a scalar version (its range clamps stay branches: "control flow
// in loop"). In the baseline clone the type is lowered to two SSE registers. (Sixteen
// lanes measured 5x slower here than libmvec's 16-lane expf, so that stays the f32
// path wherever libmvec is linked.)
using Float8 = float __attribute__((vector_size(32)));
using Int8 = int32_t __attribute__((vector_size(32)));

// v = e^v in each lane of a float vector V (Int: the int32 vector of its width).
// Cody-Waite reduction x = k ln2 + r with |r| <= ln2/2, Cephes' degree-6 polynomial
// for e^r, then scaling by 2^k in two halves, so subnormal results and overflow to
// +inf come out of plain multiplies. Error below 1 ulp over the whole range (checked
// against double exp). e^NaN = NaN, e^+inf = +inf, e^-inf = +0. By reference: a
// vector passed by value changes the calling convention between clones (-Wpsabi).
template <class V, class Int>
[[gnu::always_inline]] inline void exp_f32v(V& v) noexcept {
  constexpr float kLow = -104.0f;  // e^-104 < 2^-150: rounds to 0
  constexpr float kHigh = 89.0f;   // e^89 > FLT_MAX: the scaling overflows to +inf
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // 9 significant bits, so k * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const V zero = {};
  const V low = zero + kLow;
  const V high = zero + kHigh;
  const Int nan = v != v;
  V t = nan ? zero : v;
  t = t < low ? low : t;
  t = t > high ? high : t;
  const V kf = (t * kLog2e + kRound) - kRound;  // round(t / ln2), in [-150, 129]
  const V r = (t - kf * kLn2Hi) - kf * kLn2Lo;
  V p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V y = p * (r * r) + r + 1.0f;
  const Int k = __builtin_convertvector(kf, Int);
  const Int k1 = k / 2;  // both halves in [-75, 65]: normal powers of two
  const Int k2 = k - k1;
  const V e = (y * reinterpret_cast<V>((k1 + 127) << 23)) * reinterpret_cast<V>((k2 + 127) << 23);
  v = nan ? v : e;
}

[[gnu::always_inline]] inline void exp_f32x8(Float8& v) noexcept { exp_f32v<Float8, Int8>(v); }

// e^x for one float, by the same code as exp_f32x8.
inline float exp_f32(float x) noexcept {
  Float8 v = Float8{} + x;
  exp_f32x8(v);
  return v[0];
}

namespace softmax_detail {

// Below this, e^x is under the smallest normal T and libmvec's fast path: such
// exps are taken as 0 (see the top of this file).
template <class T>
inline constexpr T kExpLow = std::is_same_v<T, float> ? T(-87.0) : T(-708.0);

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

// e^d, or 0 when d < kExpLow, with exp never called below kExpLow. d is x - max,
// so d <= 0 or NaN. The clamp is an unsigned min on the bits (for negative floats
// the bits grow with the magnitude; a non-negative d keeps its bits), not
// `d < low ? low : d`: GCC turns exp of a select into a select of exps, exp(low)
// folded to a constant, and so calls the vector exp on the unclamped d after all
// (and fmax does not vectorise). The 0 (and a NaN d's NaN) come from multiplying
// by `keep` for the same reason, and so that no select follows the call: GCC would
// move the call into a branch, which it vectorises for AVX-512 only. Vectorises: a
// min, two compares, a multiply.
template <class T>
[[gnu::always_inline]] inline T exp_flushed(T d) noexcept {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const T keep = d != d ? d : static_cast<T>(d >= kExpLow<T>);  // 1, 0, or NaN (which e * keep keeps)
  const Bits clamped = std::min(std::bit_cast<Bits>(d), std::bit_cast<Bits>(kExpLow<T>));
  const T e = std::exp(std::bit_cast<T>(clamped));
  return e * keep;
}

// exp_flushed on a vector of floats (explicit vector code: no call, so no select
// can be folded into one).
template <class V, class Int>
[[gnu::always_inline]] inline void exp_flushed_f32v(V& v) noexcept {
  const V low = V{} + kExpLow<float>;
  const V keep = __builtin_convertvector(-(v >= low), V);  // lanes: 1 or 0
  const Int nan = v != v;
  V t = v > low || nan ? v : low;
  exp_f32v<V, Int>(t);
  v = nan ? v : t * keep;
}

// y[i] = e^(x[i] - m) for i < n. y may be x itself. No sum here: a SIMD sum reduced
// per call costs a serial chain of lane adds (GCC's omp simd epilogue); the caller sums
// y afterwards with reduce_detail::sum_floats, reduced once per row.
template <class T>
[[gnu::always_inline]] inline void exp_shifted(const T* x, T m, T* y, int64_t n) noexcept {
  if constexpr (std::is_same_v<T, float> && BP_CPU_SOFTMAX_INLINE_EXP) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      Float8 v;
      std::memcpy(&v, x + i, sizeof v);
      v -= m;
      exp_flushed_f32v<Float8, Int8>(v);
      std::memcpy(y + i, &v, sizeof v);
    }
    if (i < n) {
      Float8 v = {};
      for (int64_t k = 0; k < n - i; ++k) v[k] = x[i + k] - m;
      exp_flushed_f32v<Float8, Int8>(v);
      for (int64_t k = 0; k < n - i; ++k) y[i + k] = v[k];
    }
  } else {
    BP_CPU_PRAGMA(omp simd)
    for (int64_t i = 0; i < n; ++i) y[i] = exp_flushed(x[i] - m);
  }
}

// e[j] = exp(x[j] - m[j]) for j < w.
template <class T>
[[gnu::always_inline]] inline void exp_shifted_columns(const T* x, const T* m, T* e, int64_t w) noexcept {
  if constexpr (std::is_same_v<T, float> && BP_CPU_SOFTMAX_INLINE_EXP) {
    int64_t j = 0;
    for (; j + 8 <= w; j += 8) {
      Float8 v, mv;
      std::memcpy(&v, x + j, sizeof v);
      std::memcpy(&mv, m + j, sizeof mv);
      v -= mv;
      exp_flushed_f32v<Float8, Int8>(v);
      std::memcpy(e + j, &v, sizeof v);
    }
    if (j < w) {
      Float8 v = {};
      for (int64_t k = 0; k < w - j; ++k) v[k] = x[j + k] - m[j + k];
      exp_flushed_f32v<Float8, Int8>(v);
      for (int64_t k = 0; k < w - j; ++k) e[j + k] = v[k];
    }
  } else {
    BP_CPU_PRAGMA(omp simd)
    for (int64_t j = 0; j < w; ++j) e[j] = exp_flushed(x[j] - m[j]);
  }
}

// Rows up to this many bytes prefetch the next row while they compute: a row
// starts in a fresh page, where the hardware prefetcher begins cold, so without
// it the max pass of each row waits on memory while the core sits idle in the
// exp work before it. Longer rows are streams the prefetcher follows.
inline constexpr int64_t kPrefetchRowBytes = 16 * 1024;
// Elements of a row computed (exp, sum) per step: one step prefetches the same
// span of the next row (a few lines per step keeps the misses spread out).
inline constexpr int64_t kStep = 64;
// Float lanes summed side by side, and the elements summed in float before the
// partial sum joins the row's double total (as reduce_detail::sum_floats does).
inline constexpr int kSumLanes = 64;
inline constexpr int64_t kSumBlock = 1024;

// Sums of the exps of one row, kept in kSumLanes float lanes (vector adds only)
// and folded into a double every kSumBlock elements and at the end.
template <class T>
struct RowSum {
  T acc[kSumLanes] = {};
  int64_t pending = 0;  // elements in acc since the last fold
  double total = 0;

  // Adds p[0..len), len <= kStep.
  [[gnu::always_inline]] void add(const T* p, int64_t len) noexcept {
    int64_t i = 0;
    for (; i + kSumLanes <= len; i += kSumLanes)
      for (int j = 0; j < kSumLanes; ++j) acc[j] += p[i + j];
    for (; i < len; ++i) acc[0] += p[i];  // acc[i % kSumLanes] would force acc into memory
    pending += len;
    if (pending >= kSumBlock) fold();
  }
  [[gnu::always_inline]] void fold() noexcept {
    for (int w = kSumLanes / 2; w > 0; w /= 2)
      for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    total += static_cast<double>(acc[0]);
    std::fill(acc, acc + kSumLanes, T{0});
    pending = 0;
  }
  [[gnu::always_inline]] double finish() noexcept {
    if (pending > 0) fold();
    return total;
  }
};

// One contiguous row: y = softmax(x) or log_softmax(x). y may be x itself.
// next_x: the next row this thread computes (prefetched), or null. The exps are
// summed step by step while they are still in L1, and each step prefetches a
// slice of the next row.
template <bool Log, class T>
BP_CPU_SOFTMAX_CLONES inline void softmax_row(const T* x, T* y, int64_t n, const T* next_x) noexcept {
  const T m = row_max(x, n);
  const bool prefetch = next_x != nullptr && n * static_cast<int64_t>(sizeof(T)) <= kPrefetchRowBytes;
  RowSum<T> sum;
  // Log: y must keep x (it may be x) for the last pass, so the exps go to a buffer.
  T e[Log ? kStep : 1];
  for (int64_t c = 0; c < n; c += kStep) {
    const int64_t len = std::min(kStep, n - c);
    if (prefetch)
      for (int64_t b = 0; b < len * static_cast<int64_t>(sizeof(T)); b += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(next_x + c) + b, 0, 3);
    T* out = Log ? e : y + c;
    exp_shifted(x + c, m, out, len);
    sum.add(out, len);
  }
  const double total = sum.finish();
  if constexpr (Log) {
    // (x - m) - log(sum), not x - (m + log(sum)): the latter loses the low bits of
    // x - m when |m| is large.
    const T lse = static_cast<T>(std::log(total));
    BP_CPU_PRAGMA(omp simd)
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - lse;
  } else {
    const T inv = static_cast<T>(1.0 / total);
    // e * inv is subnormal exactly when e < smallest normal * total: 0 instead (a
    // multiply by the comparison; a select would be folded into one of products).
    const T tiny = static_cast<T>(static_cast<double>(std::numeric_limits<T>::min()) * total);
    BP_CPU_PRAGMA(omp simd)
    for (int64_t i = 0; i < n; ++i) y[i] = (y[i] * static_cast<T>(y[i] >= tiny)) * inv;
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
  T tiny[kMaxTile];  // softmax: e below it would scale to a subnormal (see softmax_row)
  for (int64_t j = 0; j < w; ++j) {
    scale[j] = Log ? static_cast<T>(std::log(total[j])) : static_cast<T>(1.0 / total[j]);
    tiny[j] = static_cast<T>(static_cast<double>(std::numeric_limits<T>::min()) * total[j]);
  }
  for (int64_t r = 0; r < n; ++r) {
    const T* p = x + r * stride;
    T* q = y + r * stride;
    if constexpr (Log) {
      BP_CPU_PRAGMA(omp simd)
      for (int64_t j = 0; j < w; ++j) q[j] = (p[j] - m[j]) - scale[j];
    } else {
      BP_CPU_PRAGMA(omp simd)
      for (int64_t j = 0; j < w; ++j) q[j] = (q[j] * static_cast<T>(q[j] >= tiny[j])) * scale[j];
    }
  }
}

}  // namespace softmax_detail

// y = softmax(x) (or log_softmax, Log) along the middle axis of [outer, n, inner]; both
// contiguous and not overlapping. A row (or column)
// holding NaN gives NaN throughout; one of only -inf gives NaN (as PyTorch does).
template <bool Log, class T>
void softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, int threads) {
  static_assert(std::is_floating_point_v<T>);
  if (outer == 0 || n == 0 || inner == 0) return;
  using namespace softmax_detail;
  if (inner == 1) {
    parallel_for_rows(outer, n, threads, [=](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        const bool last = o + 1 == o1;
        softmax_row<Log, T>(x + o * n, y + o * n, n, last ? nullptr : x + (o + 1) * n);
      }
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
