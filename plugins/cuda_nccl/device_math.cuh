// Device-side helpers shared by the cuda plugin's kernels: the storage type of
// each dtype, the type arithmetic runs in (f16/bf16 in f32), conversions with
// the cast rules of abi.h, the grid-stride elementwise kernel every
// elementwise family instantiates with its functor, and the error slot.
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_DEVICE_MATH_CUH_
#define BACKPLANE_PLUGINS_CUDA_NCCL_DEVICE_MATH_CUH_

#include <backplane/abi.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "host/layout.hpp"
#include "kernels.hpp"

namespace backplane::cuda {

// ---- types ------------------------------------------------------------------

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <class T>
inline constexpr bool is_float_v = std::is_floating_point_v<T> || is_half_v<T>;

// The type arithmetic on T runs in.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

template <class T>
__device__ __forceinline__ compute_t<T> widen(T x) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return x;
}
template <class T>
__device__ __forceinline__ T narrow(compute_t<T> x) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return x;
}

// A value of T from the bits a fill or clamp bound carries (scalar_bits): the
// low sizeof(T) bytes. The 16-bit floats go through their raw structs.
template <class T>
__host__ __device__ __forceinline__ T from_bits(uint64_t bits) {
  if constexpr (std::is_same_v<T, __half>) {
    __half_raw r;
    r.x = static_cast<unsigned short>(bits);
    return __half(r);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat16_raw r;
    r.x = static_cast<unsigned short>(bits);
    return __nv_bfloat16(r);
  } else {
    T v;
    static_assert(sizeof(T) <= sizeof(bits));
    memcpy(&v, &bits, sizeof(T));  // little-endian: the value's bytes are the low ones
    return v;
  }
}

// Float -> integer: truncates toward zero, saturates, NaN gives 0 (the cpu
// backend's rule, so both backends cast alike).
template <class I, class F>
__device__ __forceinline__ I saturate_cast(F x) {
  constexpr F lo = static_cast<F>(std::numeric_limits<I>::min());
  constexpr F hi = static_cast<F>(std::numeric_limits<I>::max() / 2 + 1) * F{2};
  return x != x    ? I{0}
         : x <= lo ? std::numeric_limits<I>::min()
         : x >= hi ? std::numeric_limits<I>::max()
                   : static_cast<I>(x);
}

// Raw storage of an element of `Size` bytes (ops that only move elements).
template <int Size>
using raw_t = std::conditional_t<
    Size == 1, uint8_t,
    std::conditional_t<Size == 2, uint16_t, std::conditional_t<Size == 4, uint32_t, uint64_t>>>;

// Calls fn.template operator()<T>() with T the storage type of `dtype`, for
// dtypes in the set the flags allow; false when the dtype is not in it.
// Bool and u8 share uint8_t: callers that must tell them apart look at dtype.
template <bool Ints, bool Floats, bool Bytes, class Fn>
__host__ bool dispatch_dtype(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case BP_DTYPE_F32:
      if constexpr (Floats) return fn.template operator()<float>(), true;
      break;
    case BP_DTYPE_F64:
      if constexpr (Floats) return fn.template operator()<double>(), true;
      break;
    case BP_DTYPE_F16:
      if constexpr (Floats) return fn.template operator()<__half>(), true;
      break;
    case BP_DTYPE_BF16:
      if constexpr (Floats) return fn.template operator()<__nv_bfloat16>(), true;
      break;
    case BP_DTYPE_I32:
      if constexpr (Ints) return fn.template operator()<int32_t>(), true;
      break;
    case BP_DTYPE_I64:
      if constexpr (Ints) return fn.template operator()<int64_t>(), true;
      break;
    case BP_DTYPE_BOOL:
    case BP_DTYPE_U8:
      if constexpr (Bytes) return fn.template operator()<uint8_t>(), true;
      break;
    case BP_DTYPE_I8:
      if constexpr (Bytes) return fn.template operator()<int8_t>(), true;
      break;
    default:
      break;
  }
  return false;
}

// Calls fn.template operator()<raw_t<size>>() for size 1, 2, 4 or 8.
template <class Fn>
__host__ bool dispatch_size(int32_t size, Fn&& fn) {
  switch (size) {
    case 1:
      return fn.template operator()<uint8_t>(), true;
    case 2:
      return fn.template operator()<uint16_t>(), true;
    case 4:
      return fn.template operator()<uint32_t>(), true;
    case 8:
      return fn.template operator()<uint64_t>(), true;
    default:
      return false;
  }
}

// ---- errors -----------------------------------------------------------------

// Claims the slot for the first error of its kind since the host last read it.
__device__ __forceinline__ void report_error(ErrorSlot* slot, int32_t op, int32_t kind, int64_t value,
                                             int64_t bound) {
  if (slot == nullptr) return;
  if (atomicCAS(&slot->kind, 0, -1) == 0) {  // -1: claimed, being written
    slot->op = op;
    slot->value = value;
    slot->bound = bound;
    __threadfence_system();
    atomicExch(&slot->kind, kind);
  }
}

// ---- the elementwise kernel ---------------------------------------------------

// f(offsets) for every element of the map's shape, grid-stride. One kernel for
// every elementwise family: each instantiates it once per (family, dtype)
// with its functor, which carries the pointers and the op.
template <int N, class F>
__global__ void __launch_bounds__(kBlockThreads) strided_kernel(IndexMap<N> map, int64_t n, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t offset[N];
    map_offsets(map, i, offset);
    f(offset);
  }
}

template <int N, class F>
__host__ void launch_strided(const KernelContext& ctx, const IndexMap<N>& map, int64_t n, const F& f) {
  const Launch l = launch_1d(n, ctx.sm_count);
  if (l.blocks == 0) return;
  strided_kernel<N, F><<<l.blocks, l.threads, 0, ctx.stream>>>(map, n, f);
}

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_DEVICE_MATH_CUH_
