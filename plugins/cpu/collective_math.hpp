// Elementwise arithmetic of the cpu plugin's collectives: out = a (op) b for
// sum, prod, min and max on every dtype they reduce, the division that turns a
// sum into a mean, and the f16/bf16 <-> f32 conversions those need. Pure
// functions over raw pointers, so tests can check them directly.
#ifndef BACKPLANE_PLUGINS_CPU_COLLECTIVE_MATH_HPP_
#define BACKPLANE_PLUGINS_CPU_COLLECTIVE_MATH_HPP_

#include <backplane/abi.h>
#include <backplane_common/half.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels.hpp"

namespace backplane::cpu {

// ---------------------------------------------------------------------------
// Half-precision conversions (IEEE binary16 and bfloat16), round to nearest
// even (backplane_common/half.hpp). Reductions compute in f32 and round once
// per step: f32 carries more than 2p + 2 bits of either format, so each step
// is correctly rounded.
// ---------------------------------------------------------------------------

using common::bf16_to_f32;
using common::f16_to_f32;
using common::f32_to_bf16;
using common::f32_to_f16;

// ---------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------

// out[i] = a[i] (op) b[i] for i < n. out may equal a or b (in place); no other
// overlap. Integers wrap (two's complement); float min/max propagate NaN.
using CombineFn = void (*)(void* out, const void* a, const void* b, std::size_t n);
// data[i] /= divisor (the mean's division by the world size; integers truncate
// toward zero).
using DivideFn = void (*)(void* data, std::size_t n, int64_t divisor);

namespace collective_math_detail {

enum class Op { sum, prod, min, max };

// Storage type S, computed in type C (f32 for the 16-bit floats).
template <class S>
struct Repr {
  using Compute = S;
  static Compute load(S v) noexcept { return v; }
  static S store(Compute v) noexcept { return v; }
};
struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};
template <>
struct Repr<F16> {
  using Compute = float;
  static float load(F16 v) noexcept { return f16_to_f32(v.bits); }
  static F16 store(float v) noexcept { return {f32_to_f16(v)}; }
};
template <>
struct Repr<BF16> {
  using Compute = float;
  static float load(BF16 v) noexcept { return bf16_to_f32(v.bits); }
  static BF16 store(float v) noexcept { return {f32_to_bf16(v)}; }
};

template <Op O, class T>
[[gnu::always_inline]] inline T apply(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // wraps instead of overflowing
    if constexpr (O == Op::sum) return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    if constexpr (O == Op::prod) {
      // Promote narrow types to unsigned int so the product cannot overflow a signed int.
      using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
      return static_cast<T>(
          static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
    }
    if constexpr (O == Op::min) return b < a ? b : a;
    if constexpr (O == Op::max) return a < b ? b : a;
  } else {
    if constexpr (O == Op::sum) return a + b;
    if constexpr (O == Op::prod) return a * b;
    // NaN wins: a when a is NaN, else b when b is NaN (a comparison with NaN is false).
    if constexpr (O == Op::min) return (a < b || a != a) ? a : b;
    if constexpr (O == Op::max) return (a > b || a != a) ? a : b;
  }
}

template <Op O, class S>
BP_CPU_CLONES void combine(void* out, const void* a, const void* b, std::size_t n) noexcept {
  using R = Repr<S>;
  auto* o = static_cast<S*>(out);
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  for (std::size_t i = 0; i < n; ++i) o[i] = R::store(apply<O>(R::load(x[i]), R::load(y[i])));
}

template <class S>
BP_CPU_CLONES void divide(void* data, std::size_t n, int64_t divisor) noexcept {
  using R = Repr<S>;
  using C = typename R::Compute;
  auto* d = static_cast<S*>(data);
  if constexpr (std::is_floating_point_v<C>) {
    // A power of two: x * (1 / 2^k) is x / 2^k bit for bit (the same real
    // number, rounded once; 1 / 2^k is exact), and a multiply costs a
    // fraction of a divide (about 3.5 us of a 2-rank mean over 37.5 KiB).
    if (divisor > 0 && (divisor & (divisor - 1)) == 0) {
      const C scale = C{1} / static_cast<C>(divisor);
      for (std::size_t i = 0; i < n; ++i) d[i] = R::store(static_cast<C>(R::load(d[i]) * scale));
      return;
    }
  }
  const C by = static_cast<C>(divisor);  // exact: divisor is a world size
  for (std::size_t i = 0; i < n; ++i) d[i] = R::store(static_cast<C>(R::load(d[i]) / by));
}

template <class S>
CombineFn combine_for(int32_t op) noexcept {
  switch (op) {
    case BP_REDUCE_SUM:
    case BP_REDUCE_MEAN:
      return &combine<Op::sum, S>;
    case BP_REDUCE_PROD:
      return &combine<Op::prod, S>;
    case BP_REDUCE_MIN:
      return &combine<Op::min, S>;
    case BP_REDUCE_MAX:
      return &combine<Op::max, S>;
    default:
      return nullptr;
  }
}

}  // namespace collective_math_detail

// The combine function for (dtype, reduce op), or nullptr when this plugin does
// not reduce that dtype (bool, unknown values) or the op is unknown. MEAN
// combines as SUM; divide_for supplies its division.
inline CombineFn combine_for(int32_t dtype, int32_t op) noexcept {
  namespace d = collective_math_detail;
  switch (dtype) {
    case BP_DTYPE_F32:
      return d::combine_for<float>(op);
    case BP_DTYPE_F64:
      return d::combine_for<double>(op);
    case BP_DTYPE_I32:
      return d::combine_for<int32_t>(op);
    case BP_DTYPE_I64:
      return d::combine_for<int64_t>(op);
    case BP_DTYPE_I8:
      return d::combine_for<int8_t>(op);
    case BP_DTYPE_U8:
      return d::combine_for<uint8_t>(op);
    case BP_DTYPE_F16:
      return d::combine_for<d::F16>(op);
    case BP_DTYPE_BF16:
      return d::combine_for<d::BF16>(op);
    default:
      return nullptr;
  }
}

// The mean's division for a dtype combine_for accepts; nullptr otherwise.
inline DivideFn divide_for(int32_t dtype) noexcept {
  namespace d = collective_math_detail;
  switch (dtype) {
    case BP_DTYPE_F32:
      return &d::divide<float>;
    case BP_DTYPE_F64:
      return &d::divide<double>;
    case BP_DTYPE_I32:
      return &d::divide<int32_t>;
    case BP_DTYPE_I64:
      return &d::divide<int64_t>;
    case BP_DTYPE_I8:
      return &d::divide<int8_t>;
    case BP_DTYPE_U8:
      return &d::divide<uint8_t>;
    case BP_DTYPE_F16:
      return &d::divide<d::F16>;
    case BP_DTYPE_BF16:
      return &d::divide<d::BF16>;
    default:
      return nullptr;
  }
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_COLLECTIVE_MATH_HPP_
