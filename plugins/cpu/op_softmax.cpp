// softmax and log_softmax of the cpu engine along attrs.axis (softmax.hpp); the
// output has the input's shape and is contiguous.
#include <backplane/plugin.hpp>

#include "op_dtypes.hpp"
#include "ops.hpp"
#include "softmax.hpp"

namespace backplane::cpu {

void run_softmax(const OpCall& call) {
  expect_arity(call, 1);
  const int32_t dtype = call.output().dtype;
  const bool log = call.op() == BP_OP_LOG_SOFTMAX;
  plugin::dispatch<FloatDTypes>(dtype, call.name(), [&]<class T>() {
    const TensorView out = output_view(call, dtype);
    const TensorView in = input_view(call, 0, dtype);
    const AxisSplit s = split_at_axis(call, in);
    if (!out.contiguous || out.numel != in.numel) [[unlikely]]
      plugin::fail(BP_STATUS_INVALID_ARGUMENT,
                   "cpu: " + plugin::op_name(call.op()) + ": outputs[0] (shape " + out.shape_string() +
                       ") is not a contiguous tensor of inputs[0]'s " + in.shape_string());
    if (out.numel == 0) return;
    std::unique_ptr<unsigned char[]> copy;
    const auto* x =
        reinterpret_cast<const T*>(in.contiguous ? in.data : contiguous_copy(in, copy, call.threads));
    if (log)
      softmax<true>(x, out.as<T>(), s.outer, s.n, s.inner, call.threads);
    else
      softmax<false>(x, out.as<T>(), s.outer, s.n, s.inner, call.threads);
  });
}

}  // namespace backplane::cpu
