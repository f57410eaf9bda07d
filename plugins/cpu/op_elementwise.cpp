// Elementwise ops of the cpu engine: every binary op (add, sub, mul, div, pow,
// maximum, minimum, the comparisons) on one path, where, and the unary ops. Each
// takes the flat fast path when the output is dense and every input is dense or
// one broadcast element, and walks a coalesced layout otherwise.
#include <backplane/plugin.hpp>
#include <type_traits>

#include "elementwise.hpp"
#include "op_dtypes.hpp"
#include "ops.hpp"

namespace backplane::cpu {
namespace {

using plugin::dispatch;

// out = f(a, b): A, B the inputs' element types, O the output's.
template <class A, class B, class O, class F>
void binary(F f, const TensorView& a, const TensorView& b, const TensorView& out, int threads) {
  if (out.numel == 0) return;
  if (out.contiguous && (a.contiguous || a.scalar) && (b.contiguous || b.scalar)) [[likely]] {
    map2_flat(f, a.as<const A>(), !a.contiguous, b.as<const B>(), !b.contiguous, out.as<O>(), out.numel,
              threads);
    return;
  }
  StridedLayout<3> l = plugin::layout_of<3>(out, {&out, &a, &b});
  coalesce(l);
  map2(l, f, a.as<const A>(), b.as<const B>(), out.as<O>(), threads);
}

// out = f(x).
template <class X, class O, class F>
void unary(F f, const TensorView& x, const TensorView& out, int threads) {
  if (out.numel == 0) return;
  StridedLayout<2> l = plugin::layout_of<2>(out, {&out, &x});
  coalesce(l);
  map1(l, f, x.as<const X>(), out.as<O>(), threads);
}

// True when pred holds for an element of v; each distinct element is visited
// once (broadcast dimensions are not walked).
template <class T, class Pred>
bool any_element(const TensorView& v, Pred pred) {
  if (v.numel == 0) return false;
  StridedLayout<1> l;
  l.ndim = v.ndim;
  for (int32_t d = 0; d < v.ndim; ++d) {
    l.shape[d] = v.strides[d] == 0 ? 1 : v.shape[d];
    l.strides[0][d] = v.strides[d];
  }
  coalesce(l);
  const int64_t n = l.shape[l.ndim - 1];
  const int64_t stride = l.strides[0][l.ndim - 1];
  const T* data = v.as<const T>();
  bool found = false;
  for_each_row(l, 0, plugin::rows(l), [&](const int64_t* off) {
    const T* row = data + off[0];
    for (int64_t i = 0; i < n; ++i) found |= pred(row[i * stride]);
  });
  return found;
}

// add ... minimum: inputs and output share one arithmetic dtype. Integer div and
// pow first look for the data their ops cannot take (the host cannot know it).
template <class F>
[[gnu::noinline]] void arithmetic(const OpCall& call, F f) {
  expect_arity(call, 2);
  const int32_t dtype = call.output().dtype;
  dispatch<ArithmeticDTypes>(dtype, call.name(), [&]<class T>() {
    constexpr int32_t D = arithmetic_dtype<T>;  // == dtype
    static_assert(D != BP_DTYPE_INVALID);
    const TensorView out = output_view(call, D);
    const TensorView a = input_view(call, 0, D);
    const TensorView b = input_view(call, 1, D);
    if constexpr (std::is_integral_v<T> && std::is_same_v<F, DivOp>) {
      if (any_element<T>(b, [](T v) { return v == 0; }))
        plugin::fail(BP_STATUS_INVALID_ARGUMENT,
                     "cpu: div: inputs[1] holds a zero, and integer division (" + plugin::dtype_name(dtype) +
                         ") by zero has no value; use a float dtype or mask the zeros");
    }
    if constexpr (std::is_integral_v<T> && std::is_same_v<F, PowOp>) {
      if (any_element<T>(b, [](T v) { return v < 0; }))
        plugin::fail(BP_STATUS_INVALID_ARGUMENT,
                     "cpu: pow: inputs[1] holds a negative exponent, which integer pow (" +
                         plugin::dtype_name(dtype) + ") does not take; use a float dtype");
    }
    binary<T, T, T>(f, a, b, out, call.threads);
  });
}

// eq ... ge: inputs of one dtype, a bool output. Bool inputs compare as 0/1
// whatever non-zero byte they hold.
template <CompareOp Op>
[[gnu::noinline]] void compare(const OpCall& call) {
  expect_arity(call, 2);
  const int32_t dtype = call.input(0).dtype;
  dispatch<NumericDTypes>(dtype, call.name(), [&]<class T>() {
    const TensorView out = output_view(call, BP_DTYPE_BOOL);
    const TensorView a = input_view(call, 0, dtype);
    const TensorView b = input_view(call, 1, dtype);
    if constexpr (std::is_same_v<T, uint8_t>) {
      if (dtype == BP_DTYPE_BOOL) return binary<T, T, uint8_t>(Compare<Op, true>{}, a, b, out, call.threads);
    }
    binary<T, T, uint8_t>(Compare<Op>{}, a, b, out, call.threads);
  });
}

// where: inputs [cond (bool), a, b]; a, b and the output share one dtype. The
// flat fast path as binary's; a broadcast a or b (a scalar zero, in the
// backward passes of relu, abs, clamp, maximum) keeps it on a vector loop.
[[gnu::noinline]] void where(const OpCall& call) {
  expect_arity(call, 3);
  const int32_t dtype = call.output().dtype;
  dispatch<MovedDTypes>(dtype, call.name(), [&]<class T>() {
    using E = Raw<sizeof(T)>;
    const TensorView out = output_view(call, dtype);
    const TensorView cond = input_view(call, 0, BP_DTYPE_BOOL);
    const TensorView a = input_view(call, 1, dtype);
    const TensorView b = input_view(call, 2, dtype);
    if (out.numel == 0) return;
    const auto flat = [](const TensorView& v) { return v.contiguous || v.scalar; };
    if (out.contiguous && flat(cond) && flat(a) && flat(b)) [[likely]] {
      map3_flat(SelectOp{}, cond.as<const uint8_t>(), !cond.contiguous, a.as<const E>(), !a.contiguous,
                b.as<const E>(), !b.contiguous, out.as<E>(), out.numel, call.threads);
      return;
    }
    StridedLayout<4> l = plugin::layout_of<4>(out, {&out, &cond, &a, &b});
    coalesce(l);
    map3(l, SelectOp{}, cond.as<const uint8_t>(), a.as<const E>(), b.as<const E>(), out.as<E>(),
         call.threads);
  });
}

// Unary ops of one dtype from `Set`; make<T>() gives the functor.
template <class Set, class Make>
[[gnu::noinline]] void unary_typed(const OpCall& call, Make make) {
  expect_arity(call, 1);
  const int32_t dtype = call.output().dtype;
  dispatch<Set>(dtype, call.name(), [&]<class T>() {
    constexpr int32_t D = arithmetic_dtype<T>;  // == dtype (Set: arithmetic or float dtypes)
    static_assert(D != BP_DTYPE_INVALID);
    const TensorView out = output_view(call, D);
    const TensorView x = input_view(call, 0, D);
    unary<T, T>(make.template operator()<T>(), x, out, call.threads);
  });
}

template <class Set, class F>
void unary_op(const OpCall& call, F f) {
  unary_typed<Set>(call, [f]<class T>() { return f; });
}

// axpby: inputs [y, x] contiguous, of one float dtype and shape; the output
// is y itself (abi.h's UPDATE kind). Reading y[i] before writing it is the
// only order the loop has, so the aliasing is safe.
[[gnu::noinline]] void axpby(const OpCall& call) {
  expect_arity(call, 2);
  const int32_t dtype = call.output().dtype;
  dispatch<FloatDTypes>(dtype, call.name(), [&]<class T>() {
    constexpr int32_t D = arithmetic_dtype<T>;
    const TensorView out = output_view(call, D);
    const TensorView y = input_view(call, 0, D);
    const TensorView x = input_view(call, 1, D);
    if (out.numel == 0) return;
    if (!out.contiguous || !y.contiguous || !x.contiguous || out.data != y.data || x.numel != out.numel)
        [[unlikely]]
      plugin::fail(BP_STATUS_INVALID_ARGUMENT,
                   "cpu: axpby: y, x and the output must be contiguous and the output must be y itself "
                   "(abi.h's UPDATE kind)");
    const bp_op_attrs& attrs = call.attrs();
    const AxpbyOp<T> f{static_cast<T>(attrs.scalar0), static_cast<T>(attrs.scalar1)};
    map2_flat(f, y.as<const T>(), false, x.as<const T>(), false, out.as<T>(), out.numel, call.threads);
  });
}

[[noreturn, gnu::cold, gnu::noinline]] void not_elementwise(const OpCall& call) {
  plugin::fail(BP_STATUS_INTERNAL, "cpu: " + plugin::op_name(call.op()) + " reached the elementwise family");
}

}  // namespace

// Each family above is a function of its own (noinline), so that this is a
// jump table of tail calls with no stack frame: inlined, the largest of them
// gave it a 400-byte frame and six saved registers that every op paid for.
void run_elementwise(const OpCall& call) {
  switch (call.op()) {
    case BP_OP_ADD:
      return arithmetic(call, AddOp{});
    case BP_OP_SUB:
      return arithmetic(call, SubOp{});
    case BP_OP_MUL:
      return arithmetic(call, MulOp{});
    case BP_OP_DIV:
      return arithmetic(call, DivOp{});
    case BP_OP_POW:
      return arithmetic(call, PowOp{});
    case BP_OP_MAXIMUM:
      return arithmetic(call, MaximumOp{});
    case BP_OP_MINIMUM:
      return arithmetic(call, MinimumOp{});
    case BP_OP_EQ:
      return compare<CompareOp::eq>(call);
    case BP_OP_NE:
      return compare<CompareOp::ne>(call);
    case BP_OP_LT:
      return compare<CompareOp::lt>(call);
    case BP_OP_LE:
      return compare<CompareOp::le>(call);
    case BP_OP_GT:
      return compare<CompareOp::gt>(call);
    case BP_OP_GE:
      return compare<CompareOp::ge>(call);
    case BP_OP_WHERE:
      return where(call);
    case BP_OP_NEG:
      return unary_op<ArithmeticDTypes>(call, NegOp{});
    case BP_OP_ABS:
      return unary_op<ArithmeticDTypes>(call, AbsOp{});
    case BP_OP_RELU:
      return unary_op<ArithmeticDTypes>(call, ReluOp{});
    case BP_OP_CLAMP: {
      const bp_op_attrs& attrs = call.attrs();
      return unary_typed<ArithmeticDTypes>(call, [&]<class T>() {
        return ClampOp<T>{Convert<T>{}(attrs.scalar0), Convert<T>{}(attrs.scalar1)};
      });
    }
    case BP_OP_EXP:
      return unary_op<FloatDTypes>(call, ExpOp{});
    case BP_OP_LOG:
      return unary_op<FloatDTypes>(call, LogOp{});
    case BP_OP_SQRT:
      return unary_op<FloatDTypes>(call, SqrtOp{});
    case BP_OP_TANH:
      return unary_op<FloatDTypes>(call, TanhOp{});
    case BP_OP_SIGMOID:
      return unary_op<FloatDTypes>(call, SigmoidOp{});
    case BP_OP_SIN:
      return unary_op<FloatDTypes>(call, SinOp{});
    case BP_OP_COS:
      return unary_op<FloatDTypes>(call, CosOp{});
    case BP_OP_ERF:
      return unary_op<FloatDTypes>(call, ErfOp{});
    case BP_OP_AXPBY:
      return axpby(call);
    default:
      not_elementwise(call);
  }
}

}  // namespace backplane::cpu
