// Elementwise kernels of the cuda plugin: binary arithmetic, comparisons,
// where and the unary ops. One functor per family, instantiated per dtype
// only; the op is a kernel argument (the same for every thread, so the switch
// costs no divergence), which keeps the build small.
#include "device_math.cuh"

namespace backplane::cuda {
namespace {

template <class T>
struct BinaryFn {
  T* out;
  const T* a;
  const T* b;
  int32_t op;
  ErrorSlot* slot;

  __device__ void operator()(const int64_t (&o)[3]) const {
    using C = compute_t<T>;
    const C x = widen(a[o[1]]);
    const C y = widen(b[o[2]]);
    out[o[0]] = narrow<T>(apply(x, y));
  }

  __device__ compute_t<T> apply(compute_t<T> x, compute_t<T> y) const {
    using C = compute_t<T>;
    if constexpr (std::is_integral_v<C>) {
      // Two's complement wrap, computed unsigned so overflow is defined.
      using U = std::make_unsigned_t<C>;
      switch (op) {
        case BP_OP_ADD:
          return static_cast<C>(static_cast<U>(x) + static_cast<U>(y));
        case BP_OP_SUB:
          return static_cast<C>(static_cast<U>(x) - static_cast<U>(y));
        case BP_OP_MUL:
          return static_cast<C>(static_cast<U>(x) * static_cast<U>(y));
        case BP_OP_DIV:
          if (y == 0) {
            report_error(slot, op, kIntegerDivByZero, 0, 0);
            return 0;
          }
          if (y == C(-1)) return static_cast<C>(U{0} - static_cast<U>(x));  // INT_MIN / -1 wraps
          return static_cast<C>(x / y);
        case BP_OP_POW: {
          if (y < 0) {
            report_error(slot, op, kNegativeIntegerPower, static_cast<int64_t>(y), 0);
            return 0;
          }
          U base = static_cast<U>(x);
          U result = 1;
          for (U e = static_cast<U>(y); e != 0; e >>= 1) {
            if ((e & 1) != 0) result *= base;
            base *= base;
          }
          return static_cast<C>(result);
        }
        case BP_OP_MAXIMUM:
          return x > y ? x : y;
        case BP_OP_MINIMUM:
          return x < y ? x : y;
        default:
          return 0;
      }
    } else {
      switch (op) {
        case BP_OP_ADD:
          return x + y;
        case BP_OP_SUB:
          return x - y;
        case BP_OP_MUL:
          return x * y;
        case BP_OP_DIV:
          return x / y;
        case BP_OP_POW:
          return pow(x, y);
        case BP_OP_MAXIMUM:  // NaN-propagating
          return (x != x || x > y) ? x : y;
        case BP_OP_MINIMUM:
          return (x != x || x < y) ? x : y;
        default:
          return C(0);
      }
    }
  }
};

template <class T>
struct CompareFn {
  uint8_t* out;
  const T* a;
  const T* b;
  int32_t op;
  bool as_bool;  // bool inputs compare as 0/1 whatever non-zero byte they hold

  __device__ void operator()(const int64_t (&o)[3]) const {
    auto x = widen(a[o[1]]);
    auto y = widen(b[o[2]]);
    if constexpr (std::is_same_v<T, uint8_t>) {
      if (as_bool) {
        x = x != 0;
        y = y != 0;
      }
    }
    bool r = false;
    switch (op) {
      case BP_OP_EQ:
        r = x == y;
        break;
      case BP_OP_NE:
        r = x != y;
        break;
      case BP_OP_LT:
        r = x < y;
        break;
      case BP_OP_LE:
        r = x <= y;
        break;
      case BP_OP_GT:
        r = x > y;
        break;
      case BP_OP_GE:
        r = x >= y;
        break;
      default:
        break;
    }
    out[o[0]] = r ? 1 : 0;
  }
};

template <class E>
struct WhereFn {
  E* out;
  const uint8_t* cond;
  const E* a;
  const E* b;
  __device__ void operator()(const int64_t (&o)[4]) const { out[o[0]] = cond[o[1]] != 0 ? a[o[2]] : b[o[3]]; }
};

template <class T>
struct UnaryFn {
  T* out;
  const T* in;
  int32_t op;
  T lo;
  T hi;

  __device__ void operator()(const int64_t (&o)[2]) const {
    using C = compute_t<T>;
    const C x = widen(in[o[1]]);
    C r = x;
    if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<C>;
      switch (op) {
        case BP_OP_NEG:
          r = static_cast<C>(U{0} - static_cast<U>(x));
          break;
        case BP_OP_ABS:
          r = x < 0 ? static_cast<C>(U{0} - static_cast<U>(x)) : x;
          break;
        case BP_OP_RELU:
          r = x < 0 ? C{0} : x;
          break;
        case BP_OP_CLAMP: {
          const C y = x < lo ? lo : x;
          r = y > hi ? hi : y;
          break;
        }
        default:
          break;
      }
    } else {
      switch (op) {
        case BP_OP_NEG:
          r = -x;
          break;
        case BP_OP_ABS:
          r = fabs(x);
          break;
        case BP_OP_RELU:  // NaN stays NaN
          r = x < C(0) ? C(0) : x;
          break;
        case BP_OP_CLAMP: {  // hi wins when lo > hi; NaN stays NaN
          const C l = widen(lo);
          const C h = widen(hi);
          const C y = x < l ? l : x;
          r = y > h ? h : y;
          break;
        }
        case BP_OP_EXP:
          r = exp(x);
          break;
        case BP_OP_LOG:
          r = log(x);
          break;
        case BP_OP_SQRT:
          r = sqrt(x);
          break;
        case BP_OP_TANH:
          r = tanh(x);
          break;
        case BP_OP_SIGMOID: {  // no overflow for large |x|
          const C e = exp(-fabs(x));
          r = (x >= C(0) ? C(1) : e) / (C(1) + e);
          break;
        }
        case BP_OP_SIN:
          r = sin(x);
          break;
        case BP_OP_COS:
          r = cos(x);
          break;
        case BP_OP_ERF:
          r = erf(x);
          break;
        default:
          break;
      }
    }
    out[o[0]] = narrow<T>(r);
  }
};

// axpby: y = alpha * y + beta * x over n contiguous elements, in place. Each
// product is rounded to T before the sum and no multiply-add is fused
// (__*mul_rn, __*add_rn), so the update equals mul, mul and add (abi.h).
template <class C>
__device__ __forceinline__ C mul_rn(C a, C b) {
  if constexpr (std::is_same_v<C, double>)
    return __dmul_rn(a, b);
  else
    return __fmul_rn(a, b);
}
template <class C>
__device__ __forceinline__ C add_rn(C a, C b) {
  if constexpr (std::is_same_v<C, double>)
    return __dadd_rn(a, b);
  else
    return __fadd_rn(a, b);
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads) axpby_kernel(T* y, const T* x, int64_t n, T alpha, T beta) {
  using C = compute_t<T>;
  const C a = widen(alpha);
  const C b = widen(beta);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const C ay = widen(narrow<T>(mul_rn(a, widen(y[i]))));
    const C bx = widen(narrow<T>(mul_rn(b, widen(x[i]))));
    y[i] = narrow<T>(add_rn(ay, bx));
  }
}

}  // namespace

bool launch_binary(const KernelContext& ctx, int32_t dtype, const IndexMap<3>& map, int64_t n, void* out,
                   const void* a, const void* b) {
  return dispatch_dtype<true, true, false>(dtype, [&]<class T>() {
    launch_strided(ctx, map, n,
                   BinaryFn<T>{static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b),
                               ctx.op, ctx.slot});
  });
}

bool launch_compare(const KernelContext& ctx, int32_t dtype, const IndexMap<3>& map, int64_t n, void* out,
                    const void* a, const void* b) {
  return dispatch_dtype<true, true, true>(dtype, [&]<class T>() {
    launch_strided(ctx, map, n,
                   CompareFn<T>{static_cast<uint8_t*>(out), static_cast<const T*>(a),
                                static_cast<const T*>(b), ctx.op, dtype == BP_DTYPE_BOOL});
  });
}

bool launch_where(const KernelContext& ctx, int32_t element_size, const IndexMap<4>& map, int64_t n,
                  void* out, const void* cond, const void* a, const void* b) {
  return dispatch_size(element_size, [&]<class E>() {
    launch_strided(ctx, map, n,
                   WhereFn<E>{static_cast<E*>(out), static_cast<const uint8_t*>(cond),
                              static_cast<const E*>(a), static_cast<const E*>(b)});
  });
}

bool launch_unary(const KernelContext& ctx, int32_t dtype, const IndexMap<2>& map, int64_t n, void* out,
                  const void* in, uint64_t lo_bits, uint64_t hi_bits) {
  return dispatch_dtype<true, true, false>(dtype, [&]<class T>() {
    launch_strided(ctx, map, n,
                   UnaryFn<T>{static_cast<T*>(out), static_cast<const T*>(in), ctx.op, from_bits<T>(lo_bits),
                              from_bits<T>(hi_bits)});
  });
}

bool launch_axpby(const KernelContext& ctx, int32_t dtype, int64_t n, void* y, const void* x,
                  uint64_t alpha_bits, uint64_t beta_bits) {
  const Launch l = launch_1d(n, ctx.sm_count);
  return dispatch_dtype<false, true, false>(dtype, [&]<class T>() {
    if (l.blocks == 0) return;
    axpby_kernel<T><<<l.blocks, l.threads, 0, ctx.stream>>>(
        static_cast<T*>(y), static_cast<const T*>(x), n, from_bits<T>(alpha_bits), from_bits<T>(beta_bits));
  });
}

}  // namespace backplane::cuda
