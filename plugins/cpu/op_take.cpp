// index_select and gather of the cpu engine as one "take" (index.hpp). Every index
// is checked before x is read: an index out of range is the one error the host
// cannot see (it depends on the data).
#include <backplane/plugin.hpp>

#include "index.hpp"
#include "op_dtypes.hpp"
#include "ops.hpp"

namespace backplane::cpu {
namespace {

// The multi-index of row-major position `flat` within shape, as "[i,j,...]".
std::string unravel(int64_t flat, int32_t ndim, const int64_t* shape) {
  int64_t index[kMaxDims];
  for (int32_t d = ndim - 1; d >= 0; --d) {
    index[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return plugin::describe_shape(ndim, index);
}

}  // namespace

// index_select: inputs [x, index (I64, 1-D)], out = x with extent len(index) on the
// axis. gather: inputs [x, index (I64, x's ndim)], out has the index's shape.
void run_take(const OpCall& call) {
  expect_arity(call, 2);
  const bool gather = call.op() == BP_OP_GATHER;
  const int32_t dtype = call.input(0).dtype;
  plugin::dispatch<MovedDTypes>(dtype, call.name(), [&]<class T>() {
    const TensorView x = input_view(call, 0, dtype);
    const TensorView index = input_view(call, 1, BP_DTYPE_I64);
    const TensorView out = output_view(call, dtype);
    const AxisSplit s = split_at_axis(call, x);
    const auto axis = static_cast<int32_t>(s.axis);
    if (x.ndim == 0 || index.ndim != (gather ? x.ndim : 1) || out.ndim != x.ndim) [[unlikely]]
      plugin::fail(BP_STATUS_INVALID_ARGUMENT, "cpu: " + plugin::op_name(call.op()) + ": shapes x " +
                                                   x.shape_string() + ", index " + index.shape_string() +
                                                   " -> " + out.shape_string() + " do not fit the op");
    const auto* indices = index.as<const int64_t>();

    // Indices first: one out of range is an error even when the output is empty.
    if (index.numel > 0) {
      StridedLayout<1> il = plugin::layout_of<1>(index, {&index});
      coalesce(il);
      const int64_t bad = first_bad_index(il, indices, s.n, call.threads);
      if (bad >= 0) {
        int64_t at = 0;  // element offset of row-major position `bad`
        int64_t flat = bad;
        for (int32_t d = index.ndim - 1; d >= 0; --d) {
          at += (flat % index.shape[d]) * index.strides[d];
          flat /= index.shape[d];
        }
        plugin::fail(BP_STATUS_INVALID_ARGUMENT,
                     "cpu: " + plugin::op_name(call.op()) + ": index " + std::to_string(indices[at]) +
                         " at position " + unravel(bad, index.ndim, index.shape) +
                         " of the index is out of range for axis " + std::to_string(axis) +
                         " of x, of extent " + std::to_string(s.n) + " (valid: 0 to " +
                         std::to_string(s.n - 1) + ")");
      }
    }
    if (out.numel == 0) return;

    StridedLayout<3> l;  // operands: 0 = out, 1 = index, 2 = x without its axis stride
    l.ndim = out.ndim;
    for (int32_t d = 0; d < out.ndim; ++d) {
      l.shape[d] = out.shape[d];
      l.strides[0][d] = out.strides[d];
      l.strides[1][d] = gather ? index.strides[d] : (d == axis ? index.strides[0] : 0);
      l.strides[2][d] = d == axis ? 0 : x.strides[d];
    }
    coalesce(l);
    using E = Raw<sizeof(T)>;
    take(l, x.as<const E>(), indices, x.strides[axis], out.as<E>(), call.threads);
  });
}

}  // namespace backplane::cpu
