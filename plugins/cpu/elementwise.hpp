// Elementwise kernels of the cpu plugin: out = f(inputs...) for zero to three inputs
// over a coalesced StridedLayout (operand 0 is the output), with the op a functor
// inlined into multiversioned contiguous loops. Every binary op (add ... minimum, the
// comparisons) is one functor on the same path. Pure functions over raw pointers (no
// ABI types, no state), like kernels.hpp, so benchmarks can time them.
//
// Semantics: floats follow IEEE 754 and NaN/Inf propagate (no -ffast-math anywhere).
// Integers wrap on overflow. Every conversion has a defined result (see Convert).
// Aliasing: the host never passes an output that overlaps an input (abi.h, "Trust
// contract"), so no kernel guards against it.
#ifndef BACKPLANE_PLUGINS_CPU_ELEMENTWISE_HPP_
#define BACKPLANE_PLUGINS_CPU_ELEMENTWISE_HPP_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels.hpp"
#include "philox.hpp"
#include "vector_math.hpp"

namespace backplane::cpu {

// ---------------------------------------------------------------------------
// Walking a layout
// ---------------------------------------------------------------------------

// Relative cost of one element of functor F, for the decision to use threads: a
// functor may declare `static constexpr int64_t kCost`. An op of cost c runs threaded
// from kParallelMinElements / c elements (a vectorised exp costs a few adds; the team
// wake-up, microseconds, must stay small against the work).
template <class F>
constexpr int64_t cost_of() noexcept {
  if constexpr (requires { F::kCost; })
    return F::kCost;
  else
    return 1;
}

// Calls span(offsets, first, count) for runs of `count` elements along the innermost
// dimension of a coalesced layout, spread over threads: offsets[k] is operand k's
// element offset of the run's first element, `first` that element's row-major index.
// `cost` scales the element count for the threading decision.
template <int N, class Span>
void for_each_span(const StridedLayout<N>& l, int threads, int64_t cost, Span&& span) {
  const int inner = l.ndim - 1;
  const int64_t n = l.shape[inner];
  if (l.ndim == 1) {  // one run: split it (chunk starts are multiples of 64 elements)
    run_chunks(n, threads_for(n * cost, threads), [&](int64_t lo, int64_t hi) {
      int64_t offsets[N];
      for (int k = 0; k < N; ++k) offsets[k] = lo * l.strides[k][0];
      span(static_cast<const int64_t*>(offsets), lo, hi - lo);
      return true;
    });
    return;
  }
  int64_t rows = 1;
  for (int d = 0; d < inner; ++d) rows *= l.shape[d];
  parallel_for_rows(rows, n * cost, threads, [&](int64_t r0, int64_t r1) {
    int64_t row = r0;
    for_each_row(l, r0, r1, [&](const int64_t* offsets) { span(offsets, row++ * n, n); });
    return true;
  });
}

// ---------------------------------------------------------------------------
// Contiguous loops: the multiversioned entry points (see BP_CPU_CLONES). The
// functor's call operator is always_inline, so each clone compiles its own copy.
// ---------------------------------------------------------------------------

template <class F, class O>
BP_CPU_CLONES inline void generate_contiguous(F f, O* out, int64_t first, int64_t n) noexcept {
  BP_CPU_PRAGMA(omp simd)
  for (int64_t i = 0; i < n; ++i) out[i] = f(first + i);
}

template <class F, class O, class A>
BP_CPU_CLONES inline void map1_contiguous(F f, const A* a, O* out, int64_t n) noexcept {
  BP_CPU_PRAGMA(omp simd)
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i]);
}

template <class F, class O, class A, class B>
BP_CPU_CLONES inline void map2_contiguous(F f, const A* a, const B* b, O* out, int64_t n) noexcept {
  BP_CPU_PRAGMA(omp simd)
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
}

template <class F, class O, class A, class B>
BP_CPU_CLONES inline void map2_scalar_lhs(F f, A a, const B* b, O* out, int64_t n) noexcept {
  BP_CPU_PRAGMA(omp simd)
  for (int64_t i = 0; i < n; ++i) out[i] = f(a, b[i]);
}

template <class F, class O, class A, class B>
BP_CPU_CLONES inline void map2_scalar_rhs(F f, const A* a, B b, O* out, int64_t n) noexcept {
  BP_CPU_PRAGMA(omp simd)
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b);
}

template <class F, class O, class C, class A, class B>
BP_CPU_CLONES inline void map3_contiguous(F f, const C* c, const A* a, const B* b, O* out,
                                          int64_t n) noexcept {
  BP_CPU_PRAGMA(omp simd)
  for (int64_t i = 0; i < n; ++i) out[i] = f(c[i], a[i], b[i]);
}

// One of a and b one broadcast element (where(mask, g, 0): the backward of relu).
template <class F, class O, class C, class A, class B>
BP_CPU_CLONES inline void map3_scalar_a(F f, const C* c, A a, const B* b, O* out, int64_t n) noexcept {
  BP_CPU_PRAGMA(omp simd)
  for (int64_t i = 0; i < n; ++i) out[i] = f(c[i], a, b[i]);
}

template <class F, class O, class C, class A, class B>
BP_CPU_CLONES inline void map3_scalar_b(F f, const C* c, const A* a, B b, O* out, int64_t n) noexcept {
  BP_CPU_PRAGMA(omp simd)
  for (int64_t i = 0; i < n; ++i) out[i] = f(c[i], a[i], b);
}

// ---------------------------------------------------------------------------
// One run of n elements with arbitrary strides (so: the output's)
// ---------------------------------------------------------------------------

template <class F, class O>
inline void generate_row(F f, O* out, int64_t so, int64_t first, int64_t n) noexcept {
  if (so == 1) return generate_contiguous(f, out, first, n);
  for (int64_t i = 0; i < n; ++i) out[i * so] = f(first + i);
}

template <class F, class O, class A>
inline void map1_row(F f, const A* a, int64_t sa, O* out, int64_t so, int64_t n) noexcept {
  if (so == 1) {
    if (sa == 1) return map1_contiguous(f, a, out, n);
    if (sa == 0) return std::fill(out, out + n, f(*a));
  }
  for (int64_t i = 0; i < n; ++i) out[i * so] = f(a[i * sa]);
}

template <class F, class O, class A, class B>
inline void map2_row(F f, const A* a, int64_t sa, const B* b, int64_t sb, O* out, int64_t so,
                     int64_t n) noexcept {
  if (so == 1) {
    if (sa == 1 && sb == 1) return map2_contiguous(f, a, b, out, n);
    if (sa == 0 && sb == 1) return map2_scalar_lhs(f, *a, b, out, n);
    if (sa == 1 && sb == 0) return map2_scalar_rhs(f, a, *b, out, n);
    if (sa == 0 && sb == 0) return std::fill(out, out + n, f(*a, *b));
  }
  for (int64_t i = 0; i < n; ++i) out[i * so] = f(a[i * sa], b[i * sb]);
}

// The element-by-element loop of any strides: map3_row's fallback, and what
// tests check its fast paths against.
template <class F, class O, class C, class A, class B>
inline void map3_row_strided(F f, const C* c, int64_t sc, const A* a, int64_t sa, const B* b, int64_t sb,
                             O* out, int64_t so, int64_t n) noexcept {
  for (int64_t i = 0; i < n; ++i) out[i * so] = f(c[i * sc], a[i * sa], b[i * sb]);
}

template <class F, class O, class C, class A, class B>
inline void map3_row(F f, const C* c, int64_t sc, const A* a, int64_t sa, const B* b, int64_t sb, O* out,
                     int64_t so, int64_t n) noexcept {
  if (so == 1 && sc == 1) {
    if (sa == 1 && sb == 1) return map3_contiguous(f, c, a, b, out, n);
    if (sa == 1 && sb == 0) return map3_scalar_b(f, c, a, *b, out, n);
    if (sa == 0 && sb == 1) return map3_scalar_a(f, c, *a, b, out, n);
  }
  map3_row_strided(f, c, sc, a, sa, b, sb, out, so, n);
}

// ---------------------------------------------------------------------------
// Whole layouts (coalesced, no zero extent), threaded above kParallelMinElements
// ---------------------------------------------------------------------------

// out[i] = f(i), i the row-major index of the element.
template <class F, class O>
void generate(const StridedLayout<1>& l, F f, O* out, int threads) {
  const int64_t so = l.strides[0][l.ndim - 1];
  for_each_span(l, threads, cost_of<F>(), [&](const int64_t* off, int64_t first, int64_t n) {
    generate_row(f, out + off[0], so, first, n);
  });
}

template <class F, class O, class A>
void map1(const StridedLayout<2>& l, F f, const A* a, O* out, int threads) {
  const int64_t so = l.strides[0][l.ndim - 1];
  const int64_t sa = l.strides[1][l.ndim - 1];
  for_each_span(l, threads, cost_of<F>(), [&](const int64_t* off, int64_t, int64_t n) {
    map1_row(f, a + off[1], sa, out + off[0], so, n);
  });
}

template <class F, class O, class A, class B>
void map2(const StridedLayout<3>& l, F f, const A* a, const B* b, O* out, int threads) {
  const int64_t so = l.strides[0][l.ndim - 1];
  const int64_t sa = l.strides[1][l.ndim - 1];
  const int64_t sb = l.strides[2][l.ndim - 1];
  for_each_span(l, threads, cost_of<F>(), [&](const int64_t* off, int64_t, int64_t n) {
    map2_row(f, a + off[1], sa, b + off[2], sb, out + off[0], so, n);
  });
}

template <class F, class O, class C, class A, class B>
void map3(const StridedLayout<4>& l, F f, const C* c, const A* a, const B* b, O* out, int threads) {
  const int64_t so = l.strides[0][l.ndim - 1];
  const int64_t sc = l.strides[1][l.ndim - 1];
  const int64_t sa = l.strides[2][l.ndim - 1];
  const int64_t sb = l.strides[3][l.ndim - 1];
  for_each_span(l, threads, cost_of<F>(), [&](const int64_t* off, int64_t, int64_t n) {
    map3_row(f, c + off[1], sc, a + off[2], sa, b + off[3], sb, out + off[0], so, n);
  });
}

// out[0..n) = f(a, b) for a dense output whose inputs are each dense or one broadcast
// element (a_scalar / b_scalar): the fast path of every binary op, with no layout work.
template <class F, class O, class A, class B>
void map2_flat(F f, const A* a, bool a_scalar, const B* b, bool b_scalar, O* out, int64_t n, int threads) {
  const int64_t sa = a_scalar ? 0 : 1;
  const int64_t sb = b_scalar ? 0 : 1;
  run_chunks(n, threads_for(n * cost_of<F>(), threads), [&](int64_t lo, int64_t hi) {
    map2_row(f, a + lo * sa, sa, b + lo * sb, sb, out + lo, 1, hi - lo);
    return true;
  });
}

// out[0..n) = f(c, a, b) for a dense output whose inputs are each dense or one
// broadcast element (c_scalar, a_scalar, b_scalar): where's fast path, as map2_flat.
template <class F, class O, class C, class A, class B>
void map3_flat(F f, const C* c, bool c_scalar, const A* a, bool a_scalar, const B* b, bool b_scalar, O* out,
               int64_t n, int threads) {
  const int64_t sc = c_scalar ? 0 : 1;
  const int64_t sa = a_scalar ? 0 : 1;
  const int64_t sb = b_scalar ? 0 : 1;
  run_chunks(n, threads_for(n * cost_of<F>(), threads), [&](int64_t lo, int64_t hi) {
    map3_row(f, c + lo * sc, sc, a + lo * sa, sa, b + lo * sb, sb, out + lo, 1, hi - lo);
    return true;
  });
}

// ---------------------------------------------------------------------------
// Conversions, defined for every input
// ---------------------------------------------------------------------------

// Float -> integer: truncates toward zero; out-of-range values saturate to the
// integer's limits; NaN gives 0.
template <class I, class F>
[[gnu::always_inline]] inline I saturate_cast(F x) noexcept {
  static_assert(std::is_integral_v<I> && std::is_floating_point_v<F>);
  constexpr F lo = static_cast<F>(std::numeric_limits<I>::min());                 // 0 or -2^k: exact
  constexpr F hi = static_cast<F>(std::numeric_limits<I>::max() / 2 + 1) * F{2};  // max + 1 = 2^k: exact
  return x != x    ? I{0}
         : x <= lo ? std::numeric_limits<I>::min()
         : x >= hi ? std::numeric_limits<I>::max()
                   : static_cast<I>(x);
}

// One element converted to To (stored as To; ToBool: the bool dtype, one byte 0/1).
// To bool is x != 0 (NaN gives 1); a bool source (FromBool) reads any non-zero byte as
// 1; float -> integer is saturate_cast; integer -> narrower integer wraps (two's
// complement, as NumPy and PyTorch do); to float rounds to nearest.
template <class To, bool ToBool = false, bool FromBool = false>
struct Convert {
  template <class From>
  [[gnu::always_inline]] To operator()(From x) const noexcept {
    if constexpr (FromBool)
      return Convert<To, ToBool>{}(static_cast<uint8_t>(x != 0));
    else if constexpr (ToBool)
      return static_cast<To>(x != From{0});
    else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>)
      return saturate_cast<To>(x);
    else
      return static_cast<To>(x);
  }
};

// ---------------------------------------------------------------------------
// Binary ops (one dtype: f32, f64, i32, i64)
// ---------------------------------------------------------------------------

// Integers wrap (two's complement, computed unsigned so overflow is defined);
// floats follow IEEE 754.
template <class T>
using WrapOf = std::make_unsigned_t<T>;

struct AddOp {
  template <class T>
  [[gnu::always_inline]] T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<WrapOf<T>>(a) + static_cast<WrapOf<T>>(b));
    else
      return a + b;
  }
};

struct SubOp {
  template <class T>
  [[gnu::always_inline]] T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<WrapOf<T>>(a) - static_cast<WrapOf<T>>(b));
    else
      return a - b;
  }
};

struct MulOp {
  template <class T>
  [[gnu::always_inline]] T operator()(T a, T b) const noexcept {
    static_assert(sizeof(T) >= sizeof(int), "narrow integers would promote to int and overflow");
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<WrapOf<T>>(a) * static_cast<WrapOf<T>>(b));
    else
      return a * b;
  }
};

// Integer division truncates; INT_MIN / -1 wraps to INT_MIN (C++ leaves it undefined,
// x86 traps). A zero divisor is refused before the kernel runs (it depends on the
// data); here it gives 0 rather than a trap.
struct DivOp {
  template <class T>
  [[gnu::always_inline]] T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) return T{0};
      if (b == T(-1)) return static_cast<T>(WrapOf<T>{0} - static_cast<WrapOf<T>>(a));
      return static_cast<T>(a / b);
    } else {
      return a / b;
    }
  }
};

struct PowOp {
  static constexpr int64_t kCost = 8;
  template <class T>
  [[gnu::always_inline]] T operator()(T a, T b) const noexcept {
    if constexpr (std::is_floating_point_v<T>) {
      return std::pow(a, b);
    } else {
      // Repeated squaring in unsigned arithmetic: wraps like repeated multiplication.
      // A negative exponent is refused before the kernel runs; here it gives 0.
      static_assert(sizeof(T) >= sizeof(int), "narrow integers would promote to int and overflow");
      using U = std::make_unsigned_t<T>;
      U base = static_cast<U>(a);
      U result = 1;
      for (U e = b < 0 ? U{0} : static_cast<U>(b); e != 0; e >>= 1) {
        if ((e & 1) != 0) result *= base;
        base *= base;
      }
      return b < 0 ? T{0} : static_cast<T>(result);
    }
  }
};

// NaN-propagating for floats: a NaN operand gives that NaN.
struct MaximumOp {
  template <class T>
  [[gnu::always_inline]] T operator()(T a, T b) const noexcept {
    if constexpr (std::is_floating_point_v<T>)
      return (a != a || a > b) ? a : b;
    else
      return a > b ? a : b;
  }
};

struct MinimumOp {
  template <class T>
  [[gnu::always_inline]] T operator()(T a, T b) const noexcept {
    if constexpr (std::is_floating_point_v<T>)
      return (a != a || a < b) ? a : b;
    else
      return a < b ? a : b;
  }
};

// ---------------------------------------------------------------------------
// Comparisons (any dtype; the result is the bool dtype: one byte, 0 or 1)
// ---------------------------------------------------------------------------

enum class CompareOp : int { eq, ne, lt, le, gt, ge };

// IEEE comparisons: a NaN operand makes every comparison false except ne. Bool operands
// (Bool = true) compare as 0/1 whatever non-zero byte they hold.
template <CompareOp Op, bool Bool = false>
struct Compare {
  template <class T>
  [[gnu::always_inline]] uint8_t operator()(T a, T b) const noexcept {
    if constexpr (Bool) {
      return Compare<Op>{}(static_cast<uint8_t>(a != 0), static_cast<uint8_t>(b != 0));
    } else {
      if constexpr (Op == CompareOp::eq) return a == b;
      if constexpr (Op == CompareOp::ne) return a != b;
      if constexpr (Op == CompareOp::lt) return a < b;
      if constexpr (Op == CompareOp::le) return a <= b;
      if constexpr (Op == CompareOp::gt) return a > b;
      if constexpr (Op == CompareOp::ge) return a >= b;
    }
  }
};

// where: cond (bool bytes) ? a : b, on raw elements E of the operands' size.
struct SelectOp {
  template <class E>
  [[gnu::always_inline]] E operator()(uint8_t cond, E a, E b) const noexcept {
    return cond != 0 ? a : b;
  }
};

// ---------------------------------------------------------------------------
// Unary ops. neg, abs, relu, clamp: f32, f64, i32, i64 (integers wrap: neg and abs
// of the minimum give the minimum). The rest: f32, f64, through libm (vector
// variants where vector_math.hpp enables them).
// ---------------------------------------------------------------------------

struct NegOp {
  template <class T>
  [[gnu::always_inline]] T operator()(T x) const noexcept {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(std::make_unsigned_t<T>{0} - static_cast<std::make_unsigned_t<T>>(x));
    else
      return -x;
  }
};

struct AbsOp {
  template <class T>
  [[gnu::always_inline]] T operator()(T x) const noexcept {
    if constexpr (std::is_integral_v<T>)
      return x < 0 ? NegOp{}(x) : x;
    else
      return std::abs(x);
  }
};

// NaN stays NaN.
struct ReluOp {
  template <class T>
  [[gnu::always_inline]] T operator()(T x) const noexcept {
    return x < T{0} ? T{0} : x;
  }
};

// min(max(x, lo), hi): hi wins when lo > hi; NaN stays NaN.
template <class T>
struct ClampOp {
  T lo;
  T hi;
  [[gnu::always_inline]] T operator()(T x) const noexcept {
    const T y = x < lo ? lo : x;
    return y > hi ? hi : y;
  }
};

// axpby's update, y = alpha * y + beta * x: each product rounded before the
// sum, as mul, mul and add would round them (abi.h: no fused multiply-add;
// the kernels build without -mfma and with -ffp-contract=off).
template <class T>
struct AxpbyOp {
  T alpha;
  T beta;
  [[gnu::always_inline]] T operator()(T y, T x) const noexcept {
    const T ay = alpha * y;
    const T bx = beta * x;
    return ay + bx;
  }
};

#define BP_CPU_UNARY_LIBM(Name, expr)                         \
  struct Name {                                               \
    static constexpr int64_t kCost = 4;                       \
    template <class T>                                        \
    [[gnu::always_inline]] T operator()(T x) const noexcept { \
      return expr;                                            \
    }                                                         \
  };
BP_CPU_UNARY_LIBM(ExpOp, std::exp(x))
BP_CPU_UNARY_LIBM(LogOp, std::log(x))
BP_CPU_UNARY_LIBM(TanhOp, std::tanh(x))
BP_CPU_UNARY_LIBM(SinOp, std::sin(x))
BP_CPU_UNARY_LIBM(CosOp, std::cos(x))
BP_CPU_UNARY_LIBM(ErfOp, std::erf(x))
#undef BP_CPU_UNARY_LIBM

struct SqrtOp {
  template <class T>
  [[gnu::always_inline]] T operator()(T x) const noexcept {
    return std::sqrt(x);
  }
};

// 1 / (1 + e^-x) without overflow or lost precision for large |x|: with e = e^-|x|
// (in (0, 1]), 1 / (1 + e) for x >= 0 and e / (1 + e) for x < 0.
struct SigmoidOp {
  static constexpr int64_t kCost = 4;
  template <class T>
  [[gnu::always_inline]] T operator()(T x) const noexcept {
    const T e = std::exp(-std::abs(x));
    // Select the numerator, then divide: a select between computed values vectorises,
    // while arithmetic inside one arm of a ?: would be a branch (FP ops may trap).
    const T numerator = x >= T{0} ? T{1} : e;
    return numerator / (T{1} + e);
  }
};

// ---------------------------------------------------------------------------
// Generators: out[i] = f(i), i the row-major index
// ---------------------------------------------------------------------------

template <class T>
struct ConstantGen {
  T value;
  [[gnu::always_inline]] T operator()(int64_t) const noexcept { return value; }
};

// start + i * step, computed in double, then converted (Convert: integers saturate).
template <class T>
struct ArangeGen {
  double start;
  double step;
  [[gnu::always_inline]] T operator()(int64_t i) const noexcept {
    return Convert<T>{}(start + static_cast<double>(i) * step);
  }
};

// Uniform on [low, high) from philox_uniform, rounded to T; a value that rounds up to
// (T)high becomes the largest T below it. An empty range gives (T)low everywhere.
template <class T>
struct UniformGen {
  static constexpr int64_t kCost = 8;
  uint64_t seed;
  double low;
  double high;
  T limit;  // values >= limit are replaced by cap
  T cap;

  UniformGen(uint64_t s, double lo, double hi) noexcept : seed(s), low(lo), high(hi) {
    const T tlo = static_cast<T>(lo);
    const T thi = static_cast<T>(hi);
    if (thi > tlo) {
      limit = thi;
      cap = std::nextafter(thi, tlo);
    } else {
      limit = -std::numeric_limits<T>::infinity();
      cap = tlo;
    }
  }
  [[gnu::always_inline]] T operator()(int64_t i) const noexcept {
    const double u = philox_uniform(seed, static_cast<uint64_t>(i));
    // (1 - u) low + u high cannot overflow where high - low would.
    const T v = static_cast<T>((1.0 - u) * low + u * high);
    return v < limit ? v : cap;
  }
};

// mean + stddev * z, z standard normal from philox_normal, rounded to T.
template <class T>
struct NormalGen {
  static constexpr int64_t kCost = 16;
  uint64_t seed;
  double mean;
  double stddev;
  [[gnu::always_inline]] T operator()(int64_t i) const noexcept {
    return static_cast<T>(mean + stddev * philox_normal(seed, static_cast<uint64_t>(i)));
  }
};

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_ELEMENTWISE_HPP_
