// Elementwise and copy kernels of the cpu plugin. Pure functions over raw pointers
// (no ABI types, no state), so benchmarks compile and time the very same code.
// Build with OpenMP (-fopenmp) for threads and `omp simd`; without it they run serially.
#ifndef BACKPLANE_PLUGINS_CPU_KERNELS_HPP_
#define BACKPLANE_PLUGINS_CPU_KERNELS_HPP_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#define BP_CPU_PRAGMA(x) _Pragma(#x)
#else
#define BP_CPU_PRAGMA(x)
#endif

// Hot contiguous loops are compiled twice, for AVX2 and for the x86-64 baseline, and
// picked once at load time (an ifunc), so one binary runs everywhere yet uses AVX2
// where it exists. Define BACKPLANE_CPU_NO_CLONES to get the baseline only (to compare).
// Not under ThreadSanitizer: it instruments the ifunc resolvers, which an executable
// runs before the sanitizer's runtime is initialised (a crash at startup).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(BACKPLANE_CPU_NO_CLONES) && \
    !defined(__SANITIZE_THREAD__)
#define BP_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#define BP_CPU_HAS_CLONES 1
#else
#define BP_CPU_CLONES
#define BP_CPU_HAS_CLONES 0
#endif

namespace backplane::cpu {

// Below this many elements an op runs on the calling thread: waking a team costs
// microseconds, more than a small op itself.
inline constexpr int64_t kParallelMinElements = 32768;
// Each extra thread must get at least this much work.
inline constexpr int64_t kElementsPerThread = 16384;
// Largest ndim a strided kernel accepts (fixed arrays keep the hot path allocation-free).
inline constexpr int kMaxDims = 64;

enum class BinaryOp : int { add, sub, mul, div };

// Threads to use for `elements` of work given the configured count (>= 1).
inline int threads_for(int64_t elements, int threads) noexcept {
  if (threads <= 1 || elements < kParallelMinElements) return 1;
  return static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(1, elements / kElementsPerThread)));
}

// Runs fn(lo, hi) -> bool over [0, n) split into one chunk for each of `team`
// threads; chunk starts are multiples of 64 elements so threads do not write the
// same cache lines. Returns the AND of all results. fn must not throw.
template <class Fn>
bool run_chunks(int64_t n, int team, Fn&& fn) {
  if (team <= 1) return fn(int64_t{0}, n);
  bool ok = true;
#ifdef _OPENMP
  BP_CPU_PRAGMA(omp parallel num_threads(team) reduction(&& : ok)) {
    const int64_t nt = omp_get_num_threads();
    const int64_t per = ((n + nt - 1) / nt + 63) / 64 * 64;
    const int64_t lo = std::min(n, omp_get_thread_num() * per);
    const int64_t hi = std::min(n, lo + per);
    if (lo < hi) ok = fn(lo, hi);
  }
#else
  ok = fn(int64_t{0}, n);
#endif
  return ok;
}

// run_chunks with a team sized for n elements of work.
template <class Fn>
bool parallel_for_chunks(int64_t n, int threads, Fn&& fn) {
  return run_chunks(n, threads_for(n, threads), static_cast<Fn&&>(fn));
}

// Like parallel_for_chunks, over `rows` rows of `row_elements` elements each.
template <class Fn>
bool parallel_for_rows(int64_t rows, int64_t row_elements, int threads, Fn&& fn) {
  const int t = threads_for(rows * row_elements, threads);
  if (t <= 1 || rows < 2) return fn(int64_t{0}, rows);
  bool ok = true;
#ifdef _OPENMP
  BP_CPU_PRAGMA(omp parallel num_threads(static_cast<int>(std::min<int64_t>(t, rows))) reduction(&& : ok)) {
    const int64_t nt = omp_get_num_threads();
    const int64_t id = omp_get_thread_num();
    const int64_t lo = rows * id / nt;
    const int64_t hi = rows * (id + 1) / nt;
    if (lo < hi) ok = fn(lo, hi);
  }
#else
  ok = fn(int64_t{0}, rows);
#endif
  return ok;
}

// ---------------------------------------------------------------------------
// Iteration space
// ---------------------------------------------------------------------------

// N operands (operand 0 is the output) walked over one shape; strides in elements.
// Only the first ndim entries of each array are meaningful.
template <int N>
struct StridedLayout {
  int ndim = 0;
  int64_t shape[kMaxDims];
  int64_t strides[N][kMaxDims];
};

// Drops size-1 dimensions and merges neighbours that are contiguous with respect to
// every operand, so a contiguous (or fully broadcast) operand set becomes one
// dimension. Leaves ndim == 1 with shape [1] for a single element (0-d included).
// Precondition: no dimension has size 0.
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

// Visits rows [r0, r1) of a coalesced layout: fn(offsets) gets each operand's element
// offset of the row's first element. The innermost dimension is the row.
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

// ---------------------------------------------------------------------------
// Elementwise binary ops
// ---------------------------------------------------------------------------
//
// Semantics: floats follow IEEE 754 (x/0 is inf or nan). Integers wrap on overflow
// (two's complement), including INT_MIN / -1 == INT_MIN, which C++ leaves undefined
// and x86 turns into SIGFPE. Integer division by zero is reported (the kernel returns
// false; the output is then unspecified) and never executed.
//
// Aliasing: the output may be the very same memory as an input (in-place), but must
// not partially overlap one.

template <BinaryOp Op, class T>
inline constexpr bool kIntegerDiv = (Op == BinaryOp::div) && std::is_integral_v<T>;

// One element. For integer div the caller guarantees b != 0.
template <BinaryOp Op, class T>
[[gnu::always_inline]] inline T apply(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    static_assert(sizeof(T) >= sizeof(int), "narrow integers would promote to int and overflow");
    using U = std::make_unsigned_t<T>;
    const U ua = static_cast<U>(a);
    const U ub = static_cast<U>(b);
    if constexpr (Op == BinaryOp::add) return static_cast<T>(ua + ub);
    if constexpr (Op == BinaryOp::sub) return static_cast<T>(ua - ub);
    if constexpr (Op == BinaryOp::mul) return static_cast<T>(ua * ub);
    if constexpr (Op == BinaryOp::div) return b == T(-1) ? static_cast<T>(U{0} - ua) : static_cast<T>(a / b);
  } else {
    if constexpr (Op == BinaryOp::add) return a + b;
    if constexpr (Op == BinaryOp::sub) return a - b;
    if constexpr (Op == BinaryOp::mul) return a * b;
    if constexpr (Op == BinaryOp::div) return a / b;
  }
}

namespace detail {

template <BinaryOp Op, class T>
[[gnu::always_inline]] inline bool vv(const T* a, const T* b, T* out, int64_t n) noexcept {
  if constexpr (kIntegerDiv<Op, T>) {
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      const T d = b[i];
      ok = ok && d != 0;
      out[i] = d == 0 ? T{0} : apply<Op>(a[i], d);
    }
    return ok;
  } else {
    BP_CPU_PRAGMA(omp simd)
    for (int64_t i = 0; i < n; ++i) out[i] = apply<Op>(a[i], b[i]);
    return true;
  }
}

template <BinaryOp Op, class T>
[[gnu::always_inline]] inline bool sv(T a, const T* b, T* out, int64_t n) noexcept {
  if constexpr (kIntegerDiv<Op, T>) {
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      const T d = b[i];
      ok = ok && d != 0;
      out[i] = d == 0 ? T{0} : apply<Op>(a, d);
    }
    return ok;
  } else {
    BP_CPU_PRAGMA(omp simd)
    for (int64_t i = 0; i < n; ++i) out[i] = apply<Op>(a, b[i]);
    return true;
  }
}

template <BinaryOp Op, class T>
[[gnu::always_inline]] inline bool vs(const T* a, T b, T* out, int64_t n) noexcept {
  if constexpr (kIntegerDiv<Op, T>) {
    if (b == 0) return n == 0;
  }
  BP_CPU_PRAGMA(omp simd)
  for (int64_t i = 0; i < n; ++i) out[i] = apply<Op>(a[i], b);
  return true;
}

}  // namespace detail

// Serial contiguous loops, one call per row or per thread chunk. These are the
// multiversioned entry points.
template <BinaryOp Op, class T>
BP_CPU_CLONES inline bool binary_vv(const T* a, const T* b, T* out, int64_t n) noexcept {
  return detail::vv<Op, T>(a, b, out, n);
}
template <BinaryOp Op, class T>
BP_CPU_CLONES inline bool binary_sv(T a, const T* b, T* out, int64_t n) noexcept {
  return detail::sv<Op, T>(a, b, out, n);
}
template <BinaryOp Op, class T>
BP_CPU_CLONES inline bool binary_vs(const T* a, T b, T* out, int64_t n) noexcept {
  return detail::vs<Op, T>(a, b, out, n);
}

// One row of n elements with arbitrary strides (so: output, sa/sb: inputs).
template <BinaryOp Op, class T>
inline bool binary_row(const T* a, int64_t sa, const T* b, int64_t sb, T* out, int64_t so,
                       int64_t n) noexcept {
  if (so == 1) {
    if (sa == 1 && sb == 1) return binary_vv<Op, T>(a, b, out, n);
    if (sa == 0 && sb == 1) return binary_sv<Op, T>(*a, b, out, n);
    if (sa == 1 && sb == 0) return binary_vs<Op, T>(a, *b, out, n);
  }
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) {
    const T x = a[i * sa];
    const T y = b[i * sb];
    if constexpr (kIntegerDiv<Op, T>) {
      ok = ok && y != 0;
      out[i * so] = y == 0 ? T{0} : apply<Op>(x, y);
    } else {
      out[i * so] = apply<Op>(x, y);
    }
  }
  return ok;
}

// Flat forms over n contiguous elements, threaded above kParallelMinElements.
template <BinaryOp Op, class T>
bool binary_contiguous(const T* a, const T* b, T* out, int64_t n, int threads) {
  return parallel_for_chunks(n, threads, [=](int64_t lo, int64_t hi) {
    return binary_vv<Op, T>(a + lo, b + lo, out + lo, hi - lo);
  });
}
template <BinaryOp Op, class T>
bool binary_scalar_lhs(T a, const T* b, T* out, int64_t n, int threads) {
  return parallel_for_chunks(
      n, threads, [=](int64_t lo, int64_t hi) { return binary_sv<Op, T>(a, b + lo, out + lo, hi - lo); });
}
template <BinaryOp Op, class T>
bool binary_scalar_rhs(const T* a, T b, T* out, int64_t n, int threads) {
  if constexpr (kIntegerDiv<Op, T>) {
    if (b == 0) return n == 0;
  }
  return parallel_for_chunks(
      n, threads, [=](int64_t lo, int64_t hi) { return binary_vs<Op, T>(a + lo, b, out + lo, hi - lo); });
}

// out = a (op) b over a coalesced layout (operands: 0 = out, 1 = a, 2 = b) whose
// shape has no zero. Picks the flat forms when the layout allows, else walks rows.
// Returns false only for integer division by zero.
template <BinaryOp Op, class T>
bool binary(const StridedLayout<3>& l, const T* a, const T* b, T* out, int threads) {
  const int inner = l.ndim - 1;
  const int64_t n = l.shape[inner];
  const int64_t so = l.strides[0][inner];
  const int64_t sa = l.strides[1][inner];
  const int64_t sb = l.strides[2][inner];
  if (l.ndim == 1 && so == 1) {
    if (sa == 1 && sb == 1) return binary_contiguous<Op, T>(a, b, out, n, threads);
    if (sa == 0 && sb == 1) return binary_scalar_lhs<Op, T>(*a, b, out, n, threads);
    if (sa == 1 && sb == 0) return binary_scalar_rhs<Op, T>(a, *b, out, n, threads);
  }
  if (l.ndim == 1) {  // one long strided row: split it, not the (single) row count
    return parallel_for_chunks(n, threads, [=](int64_t lo, int64_t hi) {
      return binary_row<Op, T>(a + lo * sa, sa, b + lo * sb, sb, out + lo * so, so, hi - lo);
    });
  }
  int64_t rows = 1;
  for (int d = 0; d < inner; ++d) rows *= l.shape[d];
  // The row kernel is chosen once, outside the walk over rows.
  const auto walk = [&](auto&& row) {
    return parallel_for_rows(rows, n, threads, [&](int64_t r0, int64_t r1) {
      bool ok = true;
      for_each_row(l, r0, r1,
                   [&](const int64_t* off) { ok = row(a + off[1], b + off[2], out + off[0]) && ok; });
      return ok;
    });
  };
  if (so == 1 && sa == 1 && sb == 1)
    return walk([n](const T* x, const T* y, T* o) { return binary_vv<Op, T>(x, y, o, n); });
  if (so == 1 && sa == 0 && sb == 1)
    return walk([n](const T* x, const T* y, T* o) { return binary_sv<Op, T>(*x, y, o, n); });
  if (so == 1 && sa == 1 && sb == 0)
    return walk([n](const T* x, const T* y, T* o) { return binary_vs<Op, T>(x, *y, o, n); });
  return walk([=](const T* x, const T* y, T* o) { return binary_row<Op, T>(x, sa, y, sb, o, so, n); });
}

// ---------------------------------------------------------------------------
// Copy (any dtype, moved as raw elements of 1, 2, 4 or 8 bytes)
// ---------------------------------------------------------------------------

// Contiguous copy; large copies use several threads (one thread does not saturate
// memory bandwidth). dst and src must not overlap.
inline void copy_bytes(void* dst, const void* src, int64_t bytes, int threads) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // The threading threshold counts 8-byte elements; chunks are in bytes.
  run_chunks(bytes, threads_for(bytes / 8, threads), [=](int64_t lo, int64_t hi) {
    std::memcpy(d + lo, s + lo, static_cast<std::size_t>(hi - lo));
    return true;
  });
}

// dst = src over a coalesced layout (operands: 0 = dst, 1 = src) of elements of type
// E (an unsigned integer of the element's size). dst must not overlap src.
template <class E>
void copy_strided(const StridedLayout<2>& l, const E* src, E* dst, int threads) {
  const int inner = l.ndim - 1;
  const int64_t n = l.shape[inner];
  const int64_t sd = l.strides[0][inner];
  const int64_t ss = l.strides[1][inner];
  if (l.ndim == 1 && sd == 1 && ss == 1) {
    copy_bytes(dst, src, n * static_cast<int64_t>(sizeof(E)), threads);
    return;
  }
  const auto copy_row = [=](E* d, const E* s, int64_t count) {
    if (sd == 1 && ss == 1) {
      std::memcpy(d, s, static_cast<std::size_t>(count) * sizeof(E));
    } else if (sd == 1 && ss == 0) {
      std::fill(d, d + count, *s);
    } else if (sd == 1) {
      for (int64_t i = 0; i < count; ++i) d[i] = s[i * ss];
    } else {
      for (int64_t i = 0; i < count; ++i) d[i * sd] = s[i * ss];
    }
  };
  if (l.ndim == 1) {  // one long strided row: split it, not the (single) row count
    parallel_for_chunks(n, threads, [=](int64_t lo, int64_t hi) {
      copy_row(dst + lo * sd, src + lo * ss, hi - lo);
      return true;
    });
    return;
  }
  int64_t rows = 1;
  for (int d = 0; d < inner; ++d) rows *= l.shape[d];
  parallel_for_rows(rows, n, threads, [&](int64_t r0, int64_t r1) {
    for_each_row(l, r0, r1, [&](const int64_t* off) { copy_row(dst + off[0], src + off[1], n); });
    return true;
  });
}

// copy_strided for an element size known only at run time (1, 2, 4 or 8 bytes).
// Returns false for any other size.
inline bool copy_strided_bytes(const StridedLayout<2>& l, const void* src, void* dst, int element_size,
                               int threads) {
  switch (element_size) {
    case 1:
      copy_strided(l, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), threads);
      return true;
    case 2:
      copy_strided(l, static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), threads);
      return true;
    case 4:
      copy_strided(l, static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), threads);
      return true;
    case 8:
      copy_strided(l, static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst), threads);
      return true;
    default:
      return false;
  }
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_KERNELS_HPP_
