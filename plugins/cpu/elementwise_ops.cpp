// Dispatch of the cpu plugin's ABI 1.1 elementwise and creation ops to the kernels of
// elementwise.hpp, one template instance per (op, dtype). Built with -fno-math-errno
// (see vector_math.hpp) like every cpu kernel.
#include "elementwise_ops.hpp"

#include <backplane/abi.h>

#include <cstdint>

#include "elementwise.hpp"
#include "kernels.hpp"

namespace backplane::cpu {
namespace {

// A dtype's storage type; Bool marks the bool dtype (stored as uint8_t, like u8).
template <class T, bool Bool = false>
struct Tag {
  using type = T;
  static constexpr bool is_bool = Bool;
};

// Each visit_* calls fn(Tag<T>{}) for dtype's storage type T, or returns false for a
// dtype outside its set.
template <class Fn>
bool visit_float(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case BP_DTYPE_F32:
      fn(Tag<float>{});
      return true;
    case BP_DTYPE_F64:
      fn(Tag<double>{});
      return true;
    default:
      return false;
  }
}

template <class Fn>
bool visit_arithmetic(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case BP_DTYPE_I32:
      fn(Tag<int32_t>{});
      return true;
    case BP_DTYPE_I64:
      fn(Tag<int64_t>{});
      return true;
    default:
      return visit_float(dtype, fn);
  }
}

// f32 f64 i32 i64 bool u8 i8.
template <class Fn>
bool visit_numeric(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case BP_DTYPE_BOOL:
      fn(Tag<uint8_t, true>{});
      return true;
    case BP_DTYPE_U8:
      fn(Tag<uint8_t>{});
      return true;
    case BP_DTYPE_I8:
      fn(Tag<int8_t>{});
      return true;
    default:
      return visit_arithmetic(dtype, fn);
  }
}

// Any dtype, as an unsigned integer of its size (for ops that only move elements).
template <class Fn>
bool visit_raw(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case BP_DTYPE_BOOL:
    case BP_DTYPE_U8:
    case BP_DTYPE_I8:
      fn(Tag<uint8_t>{});
      return true;
    case BP_DTYPE_F16:
    case BP_DTYPE_BF16:
      fn(Tag<uint16_t>{});
      return true;
    case BP_DTYPE_F32:
    case BP_DTYPE_I32:
      fn(Tag<uint32_t>{});
      return true;
    case BP_DTYPE_F64:
    case BP_DTYPE_I64:
      fn(Tag<uint64_t>{});
      return true;
    default:
      return false;
  }
}

bool in_float(int32_t dtype) {
  return visit_float(dtype, [](auto) {});
}
bool in_arithmetic(int32_t dtype) {
  return visit_arithmetic(dtype, [](auto) {});
}
bool in_numeric(int32_t dtype) {
  return visit_numeric(dtype, [](auto) {});
}
bool in_raw(int32_t dtype) {
  return visit_raw(dtype, [](auto) {});
}

// The call's operands (output first, then inputs) over its shape, coalesced.
template <int N>
StridedLayout<N> layout_of(const ElementwiseCall& c) {
  StridedLayout<N> l;
  l.ndim = c.ndim;
  for (int32_t d = 0; d < c.ndim; ++d) {
    l.shape[d] = c.shape[d];
    l.strides[0][d] = c.out_strides[d];
    for (int k = 1; k < N; ++k) l.strides[k][d] = c.inputs[k - 1].strides[d];
  }
  coalesce(l);
  return l;
}

template <class T>
const T* input(const ElementwiseCall& c, int index) {
  return static_cast<const T*>(c.inputs[index].data);
}

template <class T>
T* output(const ElementwiseCall& c) {
  return static_cast<T*>(c.out);
}

ElementwiseResult result(bool supported) {
  return supported ? ElementwiseResult::ok : ElementwiseResult::unsupported;
}

// Whether any element of inputs[index] is negative. Visits each distinct element once
// (broadcast dimensions are not walked).
template <class T>
bool any_negative(const ElementwiseCall& c, int index) {
  const int64_t* strides = c.inputs[index].strides;
  StridedLayout<1> l;
  l.ndim = c.ndim;
  for (int32_t d = 0; d < c.ndim; ++d) {
    l.shape[d] = strides[d] == 0 ? 1 : c.shape[d];
    l.strides[0][d] = strides[d];
  }
  coalesce(l);
  const int inner = l.ndim - 1;
  const int64_t n = l.shape[inner];
  const int64_t stride = l.strides[0][inner];
  int64_t rows = 1;
  for (int d = 0; d < inner; ++d) rows *= l.shape[d];
  const T* data = input<T>(c, index);
  bool negative = false;
  for_each_row(l, 0, rows, [&](const int64_t* off) {
    const T* row = data + off[0];
    for (int64_t i = 0; i < n; ++i) negative |= row[i * stride] < 0;
  });
  return negative;
}

template <class F>
ElementwiseResult run_binary(const ElementwiseCall& c, F f) {
  return result(visit_arithmetic(c.out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map2(layout_of<3>(c), f, input<T>(c, 0), input<T>(c, 1), output<T>(c), c.threads);
  }));
}

ElementwiseResult run_pow(const ElementwiseCall& c) {
  bool negative = false;
  if (c.out_dtype == BP_DTYPE_I32) negative = any_negative<int32_t>(c, 1);
  if (c.out_dtype == BP_DTYPE_I64) negative = any_negative<int64_t>(c, 1);
  if (negative) return ElementwiseResult::negative_exponent;
  return run_binary(c, PowOp{});
}

template <CompareOp Op>
ElementwiseResult run_compare(const ElementwiseCall& c) {
  if (c.out_dtype != BP_DTYPE_BOOL) return ElementwiseResult::unsupported;
  return result(visit_numeric(c.in_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map2(layout_of<3>(c), Compare<Op, decltype(tag)::is_bool>{}, input<T>(c, 0), input<T>(c, 1),
         output<uint8_t>(c), c.threads);
  }));
}

ElementwiseResult run_where(const ElementwiseCall& c) {
  if (c.in_dtype != BP_DTYPE_BOOL) return ElementwiseResult::unsupported;
  return result(visit_raw(c.out_dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    map3(layout_of<4>(c), SelectOp{}, input<uint8_t>(c, 0), input<E>(c, 1), input<E>(c, 2), output<E>(c),
         c.threads);
  }));
}

template <class F, class Visit>
ElementwiseResult run_unary(const ElementwiseCall& c, F f, Visit visit) {
  return result(visit(c.out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map1(layout_of<2>(c), f, input<T>(c, 0), output<T>(c), c.threads);
  }));
}

template <class F>
ElementwiseResult run_unary_arithmetic(const ElementwiseCall& c, F f) {
  return run_unary(c, f, [](int32_t dtype, auto&& fn) { return visit_arithmetic(dtype, fn); });
}

template <class F>
ElementwiseResult run_unary_float(const ElementwiseCall& c, F f) {
  return run_unary(c, f, [](int32_t dtype, auto&& fn) { return visit_float(dtype, fn); });
}

ElementwiseResult run_clamp(const ElementwiseCall& c) {
  return result(visit_arithmetic(c.out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ClampOp<T> f{Convert<T>{}(c.scalar0), Convert<T>{}(c.scalar1)};
    map1(layout_of<2>(c), f, input<T>(c, 0), output<T>(c), c.threads);
  }));
}

ElementwiseResult run_cast(const ElementwiseCall& c) {
  bool supported = false;
  visit_numeric(c.in_dtype, [&](auto from) {
    using From = typename decltype(from)::type;
    supported = visit_numeric(c.out_dtype, [&](auto to) {
      using To = typename decltype(to)::type;
      const Convert<To, decltype(to)::is_bool, decltype(from)::is_bool> f;
      map1(layout_of<2>(c), f, input<From>(c, 0), output<To>(c), c.threads);
    });
  });
  return result(supported);
}

ElementwiseResult run_fill(const ElementwiseCall& c) {
  return result(visit_numeric(c.out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ConstantGen<T> f{Convert<T, decltype(tag)::is_bool>{}(c.scalar0)};
    generate(layout_of<1>(c), f, output<T>(c), c.threads);
  }));
}

ElementwiseResult run_arange(const ElementwiseCall& c) {
  return result(visit_arithmetic(c.out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    generate(layout_of<1>(c), ArangeGen<T>{c.scalar0, c.scalar1}, output<T>(c), c.threads);
  }));
}

ElementwiseResult run_rand_uniform(const ElementwiseCall& c) {
  return result(visit_float(c.out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    generate(layout_of<1>(c), UniformGen<T>(c.seed, c.scalar0, c.scalar1), output<T>(c), c.threads);
  }));
}

ElementwiseResult run_randn(const ElementwiseCall& c) {
  return result(visit_float(c.out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    generate(layout_of<1>(c), NormalGen<T>{c.seed, c.scalar0, c.scalar1}, output<T>(c), c.threads);
  }));
}

}  // namespace

const char* elementwise_vector_math() noexcept {
  return BP_CPU_VECTOR_MATH ? "glibc libmvec (vectorised exp, log, sin, cos, tanh, pow)" : "scalar libm";
}

const char* elementwise_rng() noexcept {
  return "philox4x32-10; element i of seed s draws counter i under key s";
}

bool is_elementwise_op(int32_t op) noexcept { return op >= BP_OP_POW && op <= BP_OP_RANDN; }

const char* elementwise_op_name(int32_t op) noexcept {
  switch (op) {
    case BP_OP_POW:
      return "pow";
    case BP_OP_MAXIMUM:
      return "maximum";
    case BP_OP_MINIMUM:
      return "minimum";
    case BP_OP_EQ:
      return "eq";
    case BP_OP_NE:
      return "ne";
    case BP_OP_LT:
      return "lt";
    case BP_OP_LE:
      return "le";
    case BP_OP_GT:
      return "gt";
    case BP_OP_GE:
      return "ge";
    case BP_OP_WHERE:
      return "where";
    case BP_OP_NEG:
      return "neg";
    case BP_OP_ABS:
      return "abs";
    case BP_OP_EXP:
      return "exp";
    case BP_OP_LOG:
      return "log";
    case BP_OP_SQRT:
      return "sqrt";
    case BP_OP_TANH:
      return "tanh";
    case BP_OP_SIGMOID:
      return "sigmoid";
    case BP_OP_RELU:
      return "relu";
    case BP_OP_SIN:
      return "sin";
    case BP_OP_COS:
      return "cos";
    case BP_OP_CLAMP:
      return "clamp";
    case BP_OP_CAST:
      return "cast";
    case BP_OP_FILL:
      return "fill";
    case BP_OP_ARANGE:
      return "arange";
    case BP_OP_RAND_UNIFORM:
      return "rand_uniform";
    case BP_OP_RANDN:
      return "randn";
    default:
      return nullptr;
  }
}

int elementwise_arity(int32_t op) noexcept {
  if (op >= BP_OP_POW && op <= BP_OP_GE) return 2;
  if (op == BP_OP_WHERE) return 3;
  if (op >= BP_OP_NEG && op <= BP_OP_CAST) return 1;
  return 0;  // creation
}

const char* elementwise_dtypes(int32_t op) noexcept {
  switch (op) {
    case BP_OP_POW:
    case BP_OP_MAXIMUM:
    case BP_OP_MINIMUM:
    case BP_OP_NEG:
    case BP_OP_ABS:
    case BP_OP_RELU:
    case BP_OP_CLAMP:
    case BP_OP_ARANGE:
      return "f32, f64, i32, i64";
    case BP_OP_EQ:
    case BP_OP_NE:
    case BP_OP_LT:
    case BP_OP_LE:
    case BP_OP_GT:
    case BP_OP_GE:
      return "inputs f32, f64, i32, i64, bool, u8 or i8; output bool";
    case BP_OP_WHERE:
      return "cond bool; a, b and the output one dtype, any";
    case BP_OP_CAST:
    case BP_OP_FILL:
      return "f32, f64, i32, i64, bool, u8, i8";
    default:
      return "f32, f64";
  }
}

bool elementwise_supports(int32_t op, int32_t dtype) noexcept {
  switch (op) {
    case BP_OP_EQ:
    case BP_OP_NE:
    case BP_OP_LT:
    case BP_OP_LE:
    case BP_OP_GT:
    case BP_OP_GE:
      return in_numeric(dtype);  // also true for bool, the output's dtype
    case BP_OP_WHERE:
      return in_raw(dtype);  // also true for bool, cond's dtype
    case BP_OP_CAST:
      return in_numeric(dtype);
    default:
      return is_elementwise_op(op) && elementwise_supports(op, dtype, dtype);
  }
}

bool elementwise_supports(int32_t op, int32_t out_dtype, int32_t in_dtype) noexcept {
  switch (op) {
    case BP_OP_POW:
    case BP_OP_MAXIMUM:
    case BP_OP_MINIMUM:
    case BP_OP_NEG:
    case BP_OP_ABS:
    case BP_OP_RELU:
    case BP_OP_CLAMP:
    case BP_OP_ARANGE:
      return out_dtype == in_dtype && in_arithmetic(out_dtype);
    case BP_OP_EXP:
    case BP_OP_LOG:
    case BP_OP_SQRT:
    case BP_OP_TANH:
    case BP_OP_SIGMOID:
    case BP_OP_SIN:
    case BP_OP_COS:
    case BP_OP_RAND_UNIFORM:
    case BP_OP_RANDN:
      return out_dtype == in_dtype && in_float(out_dtype);
    case BP_OP_EQ:
    case BP_OP_NE:
    case BP_OP_LT:
    case BP_OP_LE:
    case BP_OP_GT:
    case BP_OP_GE:
      return out_dtype == BP_DTYPE_BOOL && in_numeric(in_dtype);
    case BP_OP_WHERE:
      return in_dtype == BP_DTYPE_BOOL && in_raw(out_dtype);
    case BP_OP_CAST:
      return in_numeric(out_dtype) && in_numeric(in_dtype);
    case BP_OP_FILL:
      return out_dtype == in_dtype && in_numeric(out_dtype);
    default:
      return false;
  }
}

int32_t elementwise_input_dtype(int32_t op, int index, int32_t out_dtype, int32_t in0_dtype) noexcept {
  switch (op) {
    case BP_OP_EQ:
    case BP_OP_NE:
    case BP_OP_LT:
    case BP_OP_LE:
    case BP_OP_GT:
    case BP_OP_GE:
    case BP_OP_CAST:
      return in0_dtype;
    case BP_OP_WHERE:
      return index == 0 ? BP_DTYPE_BOOL : out_dtype;
    default:
      return out_dtype;
  }
}

ElementwiseResult run_elementwise(const ElementwiseCall& c) {
  if (!elementwise_supports(c.op, c.out_dtype, c.in_dtype)) return ElementwiseResult::unsupported;
  switch (c.op) {
    case BP_OP_POW:
      return run_pow(c);
    case BP_OP_MAXIMUM:
      return run_binary(c, MaximumOp{});
    case BP_OP_MINIMUM:
      return run_binary(c, MinimumOp{});
    case BP_OP_EQ:
      return run_compare<CompareOp::eq>(c);
    case BP_OP_NE:
      return run_compare<CompareOp::ne>(c);
    case BP_OP_LT:
      return run_compare<CompareOp::lt>(c);
    case BP_OP_LE:
      return run_compare<CompareOp::le>(c);
    case BP_OP_GT:
      return run_compare<CompareOp::gt>(c);
    case BP_OP_GE:
      return run_compare<CompareOp::ge>(c);
    case BP_OP_WHERE:
      return run_where(c);
    case BP_OP_NEG:
      return run_unary_arithmetic(c, NegOp{});
    case BP_OP_ABS:
      return run_unary_arithmetic(c, AbsOp{});
    case BP_OP_RELU:
      return run_unary_arithmetic(c, ReluOp{});
    case BP_OP_CLAMP:
      return run_clamp(c);
    case BP_OP_EXP:
      return run_unary_float(c, ExpOp{});
    case BP_OP_LOG:
      return run_unary_float(c, LogOp{});
    case BP_OP_SQRT:
      return run_unary_float(c, SqrtOp{});
    case BP_OP_TANH:
      return run_unary_float(c, TanhOp{});
    case BP_OP_SIGMOID:
      return run_unary_float(c, SigmoidOp{});
    case BP_OP_SIN:
      return run_unary_float(c, SinOp{});
    case BP_OP_COS:
      return run_unary_float(c, CosOp{});
    case BP_OP_CAST:
      return run_cast(c);
    case BP_OP_FILL:
      return run_fill(c);
    case BP_OP_ARANGE:
      return run_arange(c);
    case BP_OP_RAND_UNIFORM:
      return run_rand_uniform(c);
    case BP_OP_RANDN:
      return run_randn(c);
    default:
      return ElementwiseResult::unsupported;
  }
}

}  // namespace backplane::cpu
