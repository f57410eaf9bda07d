// Ops of the cpu engine that write elements without arithmetic between inputs:
// copy (any strides, elements moved as raw bytes), cast, and the creation ops
// fill, arange, rand_uniform and randn.
#include <backplane/plugin.hpp>

#include "elementwise.hpp"
#include "kernels.hpp"
#include "op_dtypes.hpp"
#include "ops.hpp"

namespace backplane::cpu {
namespace {

using plugin::dispatch;

void copy(const OpCall& call) {
  expect_arity(call, 1);
  const int32_t dtype = call.output().dtype;
  dispatch<MovedDTypes>(dtype, call.name(), [&]<class T>() {
    const TensorView out = output_view(call, dtype);
    const TensorView in = input_view(call, 0, dtype);
    if (out.numel == 0) return;
    StridedLayout<2> l = plugin::layout_of<2>(out, {&out, &in});
    coalesce(l);
    using E = Raw<sizeof(T)>;
    copy_strided(l, in.as<const E>(), out.as<E>(), call.threads);
  });
}

// Between any two numeric dtypes; Convert defines every conversion (bool sides
// read any non-zero byte as 1 and write 0/1).
void cast(const OpCall& call) {
  expect_arity(call, 1);
  const int32_t from = call.input(0).dtype;
  const int32_t to = call.output().dtype;
  dispatch<NumericDTypes>(from, call.name(), [&]<class From>() {
    dispatch<NumericDTypes>(to, call.name(), [&]<class To>() {
      const TensorView out = output_view(call, to);
      const TensorView in = input_view(call, 0, from);
      if (out.numel == 0) return;
      StridedLayout<2> l = plugin::layout_of<2>(out, {&out, &in});
      coalesce(l);
      const auto run = [&](auto f) { map1(l, f, in.as<const From>(), out.as<To>(), call.threads); };
      const bool from_bool = from == BP_DTYPE_BOOL;
      const bool to_bool = to == BP_DTYPE_BOOL;
      if constexpr (std::is_same_v<From, uint8_t> && std::is_same_v<To, uint8_t>) {
        if (from_bool && to_bool) return run(Convert<To, true, true>{});
        if (from_bool) return run(Convert<To, false, true>{});
        if (to_bool) return run(Convert<To, true, false>{});
      } else if constexpr (std::is_same_v<From, uint8_t>) {
        if (from_bool) return run(Convert<To, false, true>{});
      } else if constexpr (std::is_same_v<To, uint8_t>) {
        if (to_bool) return run(Convert<To, true, false>{});
      }
      run(Convert<To>{});
    });
  });
}

// out[i] = gen(i) over the (contiguous) output, i the row-major index.
template <class Set, class Make>
void create(const OpCall& call, Make make) {
  expect_arity(call, 0);
  const int32_t dtype = call.output().dtype;
  dispatch<Set>(dtype, call.name(), [&]<class T>() {
    const TensorView out = output_view(call, dtype);
    if (out.numel == 0) return;
    StridedLayout<1> l = plugin::layout_of<1>(out, {&out});
    coalesce(l);
    generate(l, make.template operator()<T>(), out.as<T>(), call.threads);
  });
}

}  // namespace

void run_copy(const OpCall& call) {
  const bp_op_attrs& a = call.attrs();
  switch (call.op()) {
    case BP_OP_COPY:
      return copy(call);
    case BP_OP_CAST:
      return cast(call);
    case BP_OP_FILL: {
      const bool to_bool = call.output().dtype == BP_DTYPE_BOOL;
      return create<NumericDTypes>(call, [&]<class T>() {
        return ConstantGen<T>{to_bool ? Convert<T, true>{}(a.scalar0) : Convert<T>{}(a.scalar0)};
      });
    }
    case BP_OP_ARANGE:
      return create<ArithmeticDTypes>(call, [&]<class T>() { return ArangeGen<T>{a.scalar0, a.scalar1}; });
    case BP_OP_RAND_UNIFORM:
      return create<FloatDTypes>(call,
                                 [&]<class T>() { return UniformGen<T>(a.seed, a.scalar0, a.scalar1); });
    case BP_OP_RANDN:
      return create<FloatDTypes>(call, [&]<class T>() { return NormalGen<T>{a.seed, a.scalar0, a.scalar1}; });
    default:
      plugin::fail(BP_STATUS_INTERNAL, "cpu: " + plugin::op_name(call.op()) + " reached the copy family");
  }
}

}  // namespace backplane::cpu
