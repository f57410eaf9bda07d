// Kernels of the cuda plugin that move or create elements: copy (raw bytes,
// any strides), cast (one kernel for every pair of dtypes, through a wide
// intermediate), fill, arange, rand_uniform / randn (Philox4x32-10, counter =
// element index, key = seed: the same values whatever the launch geometry),
// index_select / gather, and the integer division of an integer mean.
#include "device_math.cuh"

namespace backplane::cuda {
namespace {

template <class E>
struct CopyFn {
  E* out;
  const E* in;
  __device__ void operator()(const int64_t (&o)[2]) const { out[o[0]] = in[o[1]]; }
};

// A value between its load and its store: integers exactly, floats as double
// (which holds every f16, bf16, f32 and f64 exactly).
struct Wide {
  bool is_int;
  int64_t i;
  double d;
};

__device__ __forceinline__ Wide load_any(const void* p, int64_t k, int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return {false, 0, static_cast<const float*>(p)[k]};
    case BP_DTYPE_F64:
      return {false, 0, static_cast<const double*>(p)[k]};
    case BP_DTYPE_F16:
      return {false, 0, __half2float(static_cast<const __half*>(p)[k])};
    case BP_DTYPE_BF16:
      return {false, 0, __bfloat162float(static_cast<const __nv_bfloat16*>(p)[k])};
    case BP_DTYPE_I32:
      return {true, static_cast<const int32_t*>(p)[k], 0.0};
    case BP_DTYPE_I64:
      return {true, static_cast<const int64_t*>(p)[k], 0.0};
    case BP_DTYPE_BOOL:  // any non-zero byte reads as 1
      return {true, static_cast<const uint8_t*>(p)[k] != 0 ? 1 : 0, 0.0};
    case BP_DTYPE_U8:
      return {true, static_cast<const uint8_t*>(p)[k], 0.0};
    case BP_DTYPE_I8:
      return {true, static_cast<const int8_t*>(p)[k], 0.0};
    default:
      return {true, 0, 0.0};
  }
}

template <class I>
__device__ __forceinline__ I to_int(const Wide& w) {
  // Integer -> narrower integer wraps (two's complement); float truncates and saturates.
  return w.is_int ? static_cast<I>(static_cast<std::make_unsigned_t<I>>(w.i)) : saturate_cast<I>(w.d);
}

__device__ __forceinline__ void store_any(void* p, int64_t k, int32_t dtype, const Wide& w) {
  switch (dtype) {
    case BP_DTYPE_F32:  // from an integer: one rounding, int64 -> float directly
      static_cast<float*>(p)[k] = w.is_int ? static_cast<float>(w.i) : static_cast<float>(w.d);
      break;
    case BP_DTYPE_F64:
      static_cast<double*>(p)[k] = w.is_int ? static_cast<double>(w.i) : w.d;
      break;
    case BP_DTYPE_F16:
      static_cast<__half*>(p)[k] = w.is_int ? __ll2half_rn(w.i) : __double2half(w.d);
      break;
    case BP_DTYPE_BF16:
      static_cast<__nv_bfloat16*>(p)[k] = w.is_int ? __ll2bfloat16_rn(w.i) : __double2bfloat16(w.d);
      break;
    case BP_DTYPE_I32:
      static_cast<int32_t*>(p)[k] = to_int<int32_t>(w);
      break;
    case BP_DTYPE_I64:
      static_cast<int64_t*>(p)[k] = to_int<int64_t>(w);
      break;
    case BP_DTYPE_BOOL:  // x != 0; NaN gives 1
      static_cast<uint8_t*>(p)[k] = (w.is_int ? w.i != 0 : w.d != 0.0) ? 1 : 0;
      break;
    case BP_DTYPE_U8:
      static_cast<uint8_t*>(p)[k] = to_int<uint8_t>(w);
      break;
    case BP_DTYPE_I8:
      static_cast<int8_t*>(p)[k] = to_int<int8_t>(w);
      break;
    default:
      break;
  }
}

struct CastFn {
  void* out;
  const void* in;
  int32_t from;
  int32_t to;
  __device__ void operator()(const int64_t (&o)[2]) const {
    store_any(out, o[0], to, load_any(in, o[1], from));
  }
};

template <class E>
__global__ void __launch_bounds__(kBlockThreads) fill_kernel(E* out, int64_t n, E value) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    out[i] = value;
}

// The value of `x` (a double) stored as T, by the cast rules.
template <class T>
__device__ __forceinline__ T from_double(double x) {
  if constexpr (std::is_integral_v<T>)
    return saturate_cast<T>(x);
  else if constexpr (std::is_same_v<T, __half>)
    return __double2half(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __double2bfloat16(x);
  else
    return static_cast<T>(x);
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    arange_kernel(T* out, int64_t n, double start, double step_value) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    out[i] = from_double<T>(start + static_cast<double>(i) * step_value);
}

// ---- Philox4x32-10 (Salmon et al., SC'11), as the cpu backend draws it ----------

struct Words {
  uint32_t v[4];
};

__device__ __forceinline__ Words philox(uint64_t seed, uint64_t index) {
  Words c{{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0}};
  uint32_t k0 = static_cast<uint32_t>(seed);
  uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c.v[0]);
    const uint32_t lo0 = 0xD2511F53u * c.v[0];
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.v[2]);
    const uint32_t lo1 = 0xCD9E8D57u * c.v[2];
    c = Words{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// 53 random bits as k * 2^-53 in [0, 1) (plus `add` ulps: add = 1 gives (0, 1]).
__device__ __forceinline__ double unit_double(uint32_t hi, uint32_t lo, double add = 0.0) {
  const double a = static_cast<double>(hi >> 5);  // 27 bits
  const double b = static_cast<double>(lo >> 6);  // 26 bits
  return (a * 67108864.0 + b + add) * (1.0 / 9007199254740992.0);
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    random_kernel(T* out, int64_t n, uint64_t seed, bool normal, double a, double b, T limit, T cap) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Words w = philox(seed, static_cast<uint64_t>(i));
    if (normal) {  // Box-Muller on the element's own four words (one of the pair is dropped)
      const double u1 = unit_double(w.v[0], w.v[1], 1.0);  // (0, 1]: log is finite
      const double u2 = unit_double(w.v[2], w.v[3]);
      const double z = sqrt(-2.0 * log(u1)) * cospi(2.0 * u2);
      out[i] = from_double<T>(a + b * z);
    } else {
      const double u = unit_double(w.v[0], w.v[1]);
      // (1 - u) low + u high cannot overflow where high - low would; a value
      // that rounds up to high becomes the largest T below it.
      const T v = from_double<T>((1.0 - u) * a + u * b);
      out[i] = widen(v) < widen(limit) ? v : cap;
    }
  }
}

template <class E>
struct TakeFn {
  E* out;
  const E* x;
  const int64_t* index;
  int64_t axis_stride;
  int64_t extent;
  ErrorSlot* slot;
  int32_t op;
  __device__ void operator()(const int64_t (&o)[3]) const {
    const int64_t i = index[o[2]];
    if (i < 0 || i >= extent) {  // never read outside x: the host reports it at the next sync
      report_error(slot, op, kIndexOutOfRange, i, extent);
      return;
    }
    out[o[0]] = x[o[1] + i * axis_stride];
  }
};

template <class T>
__global__ void __launch_bounds__(kBlockThreads) divide_kernel(T* data, int64_t n, T divisor) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    data[i] = static_cast<T>(data[i] / divisor);
}

}  // namespace

bool launch_copy(const KernelContext& ctx, int32_t element_size, const IndexMap<2>& map, int64_t n, void* out,
                 const void* in) {
  return dispatch_size(element_size, [&]<class E>() {
    launch_strided(ctx, map, n, CopyFn<E>{static_cast<E*>(out), static_cast<const E*>(in)});
  });
}

bool launch_cast(const KernelContext& ctx, int32_t from, int32_t to, const IndexMap<2>& map, int64_t n,
                 void* out, const void* in) {
  launch_strided(ctx, map, n, CastFn{out, in, from, to});
  return true;
}

bool launch_fill(const KernelContext& ctx, int32_t element_size, uint64_t bits, int64_t n, void* out) {
  const Launch l = launch_1d(n, ctx.sm_count);
  return dispatch_size(element_size, [&]<class E>() {
    if (l.blocks == 0) return;
    fill_kernel<E><<<l.blocks, l.threads, 0, ctx.stream>>>(static_cast<E*>(out), n, static_cast<E>(bits));
  });
}

bool launch_arange(const KernelContext& ctx, int32_t dtype, int64_t n, void* out, double start, double step) {
  const Launch l = launch_1d(n, ctx.sm_count);
  return dispatch_dtype<true, true, false>(dtype, [&]<class T>() {
    if (l.blocks == 0) return;
    arange_kernel<T><<<l.blocks, l.threads, 0, ctx.stream>>>(static_cast<T*>(out), n, start, step);
  });
}

bool launch_random(const KernelContext& ctx, int32_t dtype, bool normal, int64_t n, void* out, uint64_t seed,
                   double a, double b) {
  const Launch l = launch_1d(n, ctx.sm_count);
  // The cap of uniform values: T(high) when it lies above T(low), else
  // everything is T(low) (an empty range). Worked out on the host in float
  // or double; f16/bf16 compare through their float values.
  return dispatch_dtype<false, true, false>(dtype, [&]<class T>() {
    if (l.blocks == 0) return;
    T limit{};
    T cap{};
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T lo = static_cast<T>(a);
      const T hi = static_cast<T>(b);
      limit = hi > lo ? hi : -std::numeric_limits<T>::infinity();
      cap = hi > lo ? std::nextafter(hi, lo) : lo;
    } else {
      const bool half = std::is_same_v<T, __half>;
      auto to_bits = [&](float v) { return half ? float_to_half_bits(v) : float_to_bf16_bits(v); };
      auto to_float = [&](uint16_t v) { return half ? half_bits_to_float(v) : bf16_bits_to_float(v); };
      const uint16_t lo = to_bits(static_cast<float>(a));
      const uint16_t hi = to_bits(static_cast<float>(b));
      uint16_t limit_bits = 0;
      uint16_t cap_bits = lo;
      if (to_float(hi) > to_float(lo)) {
        limit_bits = hi;
        // The next value toward low: one ulp down in magnitude for a positive
        // hi, up for a negative one (sign-magnitude encoding).
        cap_bits = (hi & 0x7fffu) == 0   ? static_cast<uint16_t>(0x8001u)
                   : (hi & 0x8000u) == 0 ? static_cast<uint16_t>(hi - 1)
                                         : static_cast<uint16_t>(hi + 1);
      } else {
        limit_bits = to_bits(-std::numeric_limits<float>::infinity());
      }
      limit = from_bits<T>(limit_bits);
      cap = from_bits<T>(cap_bits);
    }
    random_kernel<T>
        <<<l.blocks, l.threads, 0, ctx.stream>>>(static_cast<T*>(out), n, seed, normal, a, b, limit, cap);
  });
}

bool launch_take(const KernelContext& ctx, int32_t element_size, const IndexMap<3>& map, int64_t n, void* out,
                 const void* x, const int64_t* index, int64_t axis_stride, int64_t extent) {
  return dispatch_size(element_size, [&]<class E>() {
    launch_strided(ctx, map, n,
                   TakeFn<E>{static_cast<E*>(out), static_cast<const E*>(x), index, axis_stride, extent,
                             ctx.slot, ctx.op});
  });
}

bool launch_divide_int(const KernelContext& ctx, int32_t dtype, int64_t n, void* data, int64_t divisor) {
  const Launch l = launch_1d(n, ctx.sm_count);
  return dispatch_dtype<true, false, true>(dtype, [&]<class T>() {
    if (l.blocks == 0) return;
    divide_kernel<T>
        <<<l.blocks, l.threads, 0, ctx.stream>>>(static_cast<T*>(data), n, static_cast<T>(divisor));
  });
}

}  // namespace backplane::cuda
