// Row kernels of the cuda plugin over a contiguous [outer, n, inner] input:
// sum / mean / max / min, argmax / argmin, softmax / log_softmax. One block
// per output row (rows visited grid-stride), each thread folding a strided
// share of the row and CUB's BlockReduce combining the threads' partials, so
// each result is a balanced tree of serial runs of n / 256 elements.
// Accumulators are wide: double for every float dtype (an f32 sum of 10^6
// elements then errs far below the conformance tolerance), 64-bit integers
// (wrapping) for the integer dtypes.
#include <cub/block/block_reduce.cuh>

#include "device_math.cuh"

namespace backplane::cuda {
namespace {

template <class T>
using acc_t = std::conditional_t<is_float_v<T>, double, int64_t>;

// Row r of [outer, n, inner]: its first element and the stride along n.
struct Row {
  int64_t base;
  int64_t stride;
};
__device__ __forceinline__ Row row_of(int64_t r, int64_t n, int64_t inner) {
  const int64_t o = r / inner;
  const int64_t i = r % inner;
  return {o * n * inner + i, inner};
}

template <class A>
__device__ __forceinline__ bool is_nan(A x) {
  if constexpr (std::is_floating_point_v<A>)
    return x != x;
  else
    return false;
}

template <class A>
struct Combine {
  int32_t op;
  __device__ __forceinline__ A operator()(const A& a, const A& b) const {
    switch (op) {
      case BP_OP_MAX:  // NaN-propagating
        return is_nan(a) ? a : is_nan(b) ? b : (a > b ? a : b);
      case BP_OP_MIN:
        return is_nan(a) ? a : is_nan(b) ? b : (a < b ? a : b);
      default:
        if constexpr (std::is_integral_v<A>)
          return static_cast<A>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
        else
          return a + b;
    }
  }
};

template <class A>
__device__ __forceinline__ A identity(int32_t op) {
  if (op == BP_OP_MAX) return std::numeric_limits<A>::lowest();
  if (op == BP_OP_MIN) return std::numeric_limits<A>::max();
  return A(0);
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    reduce_kernel(const T* in, T* out, int64_t rows, int64_t n, int64_t inner, int32_t op) {
  using A = acc_t<T>;
  using Reduce = cub::BlockReduce<A, kBlockThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const Combine<A> combine{op};
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const Row row = row_of(r, n, inner);
    // max/min of floats start at -inf/+inf: lowest() is finite, and a row of
    // -inf must give -inf.
    A acc = identity<A>(op);
    if constexpr (std::is_floating_point_v<A>) {
      if (op == BP_OP_MAX) acc = -INFINITY;
      if (op == BP_OP_MIN) acc = INFINITY;
    }
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      acc = combine(acc, static_cast<A>(widen(in[row.base + j * row.stride])));
    const A total = Reduce(temp).Reduce(acc, combine);
    if (threadIdx.x == 0) {
      A value = total;
      if constexpr (std::is_floating_point_v<A>) {
        if (op == BP_OP_MEAN) value = total / static_cast<A>(n);  // n = 0: NaN
      }
      if constexpr (std::is_integral_v<A>)
        out[r] = static_cast<T>(static_cast<std::make_unsigned_t<T>>(value));  // wraps
      else
        out[r] = narrow<T>(static_cast<compute_t<T>>(value));
    }
    __syncthreads();  // temp is reused by the next row
  }
}

// (value, index): the first extreme; NaN counts as the extreme.
template <class A>
struct ArgPair {
  A value;
  int64_t index;
};

template <class A>
struct ArgCombine {
  bool max;
  __device__ __forceinline__ ArgPair<A> operator()(const ArgPair<A>& a, const ArgPair<A>& b) const {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool an = is_nan(a.value);
    const bool bn = is_nan(b.value);
    if (an || bn) {
      if (an && bn) return a.index <= b.index ? a : b;
      return an ? a : b;
    }
    const bool better = max ? b.value > a.value : b.value < a.value;
    if (better || (b.value == a.value && b.index < a.index)) return b;
    return a;
  }
};

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    arg_reduce_kernel(const T* in, int64_t* out, int64_t rows, int64_t n, int64_t inner, bool max) {
  using A = acc_t<T>;
  using P = ArgPair<A>;
  using Reduce = cub::BlockReduce<P, kBlockThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const ArgCombine<A> combine{max};
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const Row row = row_of(r, n, inner);
    P acc{A(0), -1};
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      acc = combine(acc, P{static_cast<A>(widen(in[row.base + j * row.stride])), j});
    const P best = Reduce(temp).Reduce(acc, combine);
    if (threadIdx.x == 0) out[r] = best.index < 0 ? 0 : best.index;
    __syncthreads();
  }
}

struct MaxOp {
  __device__ __forceinline__ double operator()(double a, double b) const {
    return a != a ? a : b != b ? b : (a > b ? a : b);
  }
};
struct SumOp {
  __device__ __forceinline__ double operator()(double a, double b) const { return a + b; }
};

// Three passes over the row: its max, the sum of exp(x - max) (in double),
// then the outputs. x - max <= 0, so exp never overflows.
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    softmax_kernel(const T* in, T* out, int64_t rows, int64_t n, int64_t inner, bool log_softmax) {
  using C = compute_t<T>;
  using Reduce = cub::BlockReduce<double, kBlockThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ double shared_max;
  __shared__ double shared_sum;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const Row row = row_of(r, n, inner);
    double m = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      m = MaxOp{}(m, static_cast<double>(widen(in[row.base + j * row.stride])));
    const double row_max = Reduce(temp).Reduce(m, MaxOp{});
    if (threadIdx.x == 0) shared_max = row_max;
    __syncthreads();
    const C mx = static_cast<C>(shared_max);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      s += static_cast<double>(exp(widen(in[row.base + j * row.stride]) - mx));
    const double row_sum = Reduce(temp).Reduce(s, SumOp{});
    if (threadIdx.x == 0) shared_sum = row_sum;
    __syncthreads();
    const double sum = shared_sum;
    const C log_sum = static_cast<C>(log(sum));
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t k = row.base + j * row.stride;
      const C shifted = widen(in[k]) - mx;
      out[k] = narrow<T>(log_softmax ? shifted - log_sum : static_cast<C>(exp(shifted) / sum));
    }
    __syncthreads();
  }
}

}  // namespace

bool launch_reduce(const KernelContext& ctx, int32_t op, int32_t dtype, int64_t outer, int64_t n,
                   int64_t inner, void* out, const void* in) {
  const int64_t rows = outer * inner;
  const Launch l = launch_rows(rows, ctx.sm_count);
  return dispatch_dtype<true, true, false>(dtype, [&]<class T>() {
    if (l.blocks == 0) return;
    reduce_kernel<T><<<l.blocks, l.threads, 0, ctx.stream>>>(static_cast<const T*>(in), static_cast<T*>(out),
                                                             rows, n, inner, op);
  });
}

bool launch_arg_reduce(const KernelContext& ctx, bool max, int32_t dtype, int64_t outer, int64_t n,
                       int64_t inner, int64_t* out, const void* in) {
  const int64_t rows = outer * inner;
  const Launch l = launch_rows(rows, ctx.sm_count);
  return dispatch_dtype<true, true, false>(dtype, [&]<class T>() {
    if (l.blocks == 0) return;
    arg_reduce_kernel<T>
        <<<l.blocks, l.threads, 0, ctx.stream>>>(static_cast<const T*>(in), out, rows, n, inner, max);
  });
}

bool launch_softmax(const KernelContext& ctx, bool log, int32_t dtype, int64_t outer, int64_t n,
                    int64_t inner, void* out, const void* in) {
  const int64_t rows = outer * inner;
  const Launch l = launch_rows(rows, ctx.sm_count);
  return dispatch_dtype<false, true, false>(dtype, [&]<class T>() {
    if (l.blocks == 0) return;
    softmax_kernel<T><<<l.blocks, l.threads, 0, ctx.stream>>>(static_cast<const T*>(in), static_cast<T*>(out),
                                                              rows, n, inner, log);
  });
}

}  // namespace backplane::cuda
