// Reductions of the cpu engine over attrs.axis: sum, mean, max, min, argmax,
// argmin (reduce.hpp). The output holds the outer * inner results contiguously.
#include <backplane/plugin.hpp>

#include "op_dtypes.hpp"
#include "ops.hpp"
#include "reduce.hpp"

namespace backplane::cpu {
namespace {

template <ReduceOp Op, class Set>
void reduce_as(const OpCall& call) {
  expect_arity(call, 1);
  const int32_t dtype = call.input(0).dtype;
  plugin::dispatch<Set>(dtype, call.name(), [&]<class T>() {
    constexpr bool kArg = Op == ReduceOp::argmax || Op == ReduceOp::argmin;
    const TensorView in = input_view(call, 0, dtype);
    const TensorView out = output_view(call, kArg ? int32_t{BP_DTYPE_I64} : dtype);
    const AxisSplit s = split_at_axis(call, in);
    if (!out.contiguous || out.numel != s.outer * s.inner) [[unlikely]]
      plugin::fail(BP_STATUS_INVALID_ARGUMENT,
                   "cpu: " + plugin::op_name(call.op()) + ": outputs[0] (shape " + out.shape_string() +
                       ") is not a contiguous tensor of the " + std::to_string(s.outer * s.inner) +
                       " results of reducing " + in.shape_string() + " over axis " + std::to_string(s.axis));
    if (out.numel == 0) return;
    // The kernels read [outer, n, inner] densely: a strided input is gathered first.
    std::unique_ptr<unsigned char[]> copy;
    const unsigned char* data = in.contiguous ? in.data : contiguous_copy(in, copy, call.threads);
    if (!reduce<Op, T>(reinterpret_cast<const T*>(data), out.as<ReduceOut<Op, T>>(), s.outer, s.n, s.inner,
                       call.threads))
      plugin::fail(BP_STATUS_INVALID_ARGUMENT, "cpu: " + plugin::op_name(call.op()) + ": axis " +
                                                   std::to_string(s.axis) + " of shape " + in.shape_string() +
                                                   " is empty, and " + plugin::op_name(call.op()) +
                                                   " of no elements has no value");
  });
}

}  // namespace

void run_reduce(const OpCall& call) {
  switch (call.op()) {
    case BP_OP_SUM:
      return reduce_as<ReduceOp::sum, ArithmeticDTypes>(call);
    case BP_OP_MEAN:
      return reduce_as<ReduceOp::mean, FloatDTypes>(call);
    case BP_OP_MAX:
      return reduce_as<ReduceOp::max, ArithmeticDTypes>(call);
    case BP_OP_MIN:
      return reduce_as<ReduceOp::min, ArithmeticDTypes>(call);
    case BP_OP_ARGMAX:
      return reduce_as<ReduceOp::argmax, ArithmeticDTypes>(call);
    case BP_OP_ARGMIN:
      return reduce_as<ReduceOp::argmin, ArithmeticDTypes>(call);
    default:
      plugin::fail(BP_STATUS_INTERNAL,
                   "cpu: " + plugin::op_name(call.op()) + " reached the reduction family");
  }
}

}  // namespace backplane::cpu
