// The cpu engine's op families, one file each (op_*.cpp), and what they share:
// operand views (the SDK's make_view over this plugin's buffers), the arity
// check, the [outer, n, inner] split around an axis and a contiguous copy.
// Requests arrive validated by the host (abi.h, "Trust contract"): shapes,
// broadcasting, axes and dtypes are not checked again, and outputs never overlap
// inputs. What is checked is cheap and would otherwise corrupt memory: arity,
// live buffers, views inside their buffers.
#ifndef BACKPLANE_PLUGINS_CPU_OPS_HPP_
#define BACKPLANE_PLUGINS_CPU_OPS_HPP_

#include <backplane/abi.h>
#include <backplane/plugin.hpp>

#include <cstdint>
#include <memory>
#include <type_traits>

#include "host_buffer.hpp"

namespace backplane::cpu {

using plugin::Role;
using plugin::TensorView;

// Raw storage of an element of `Size` bytes, for ops that only move elements.
template <size_t Size>
using Raw = std::conditional_t<
    Size == 1, uint8_t,
    std::conditional_t<Size == 2, uint16_t, std::conditional_t<Size == 4, uint32_t, uint64_t>>>;

// One execute call as the families see it.
struct OpCall {
  const bp_execute_args& args;
  int threads;  // team size for large work (>= 1)

  int32_t op() const noexcept { return args.op; }
  const char* name() const noexcept { return bp_op_name(args.op); }
  const bp_tensor& input(int i) const noexcept { return args.inputs[i]; }
  const bp_tensor& output() const noexcept { return args.outputs[0]; }
  const bp_op_attrs& attrs() const noexcept { return *args.attrs; }
};

// The families (each returns once the output is written; throws plugin::Failure).
void run_elementwise(const OpCall& call);  // add ... minimum, comparisons, where, unary ops
void run_copy(const OpCall& call);         // copy, cast, fill, arange, rand_uniform, randn
void run_reduce(const OpCall& call);       // sum, mean, max, min, argmax, argmin
void run_softmax(const OpCall& call);      // softmax, log_softmax
void run_matmul(const OpCall& call);       // matmul
void run_take(const OpCall& call);         // index_select, gather

[[noreturn, gnu::cold, gnu::noinline]] void arity_fail(const OpCall& call, int32_t inputs);
[[noreturn, gnu::cold, gnu::noinline]] void dead_buffer_fail(const OpCall& call, Role role);

// The op takes `inputs` inputs and one output.
inline void expect_arity(const OpCall& call, int32_t inputs) {
  const bp_execute_args& a = call.args;
  if (a.num_inputs != inputs || a.num_outputs != 1 || (inputs > 0 && a.inputs == nullptr) ||
      a.outputs == nullptr) [[unlikely]]
    arity_fail(call, inputs);
}

// A checked view of `t` (dtype `dtype`) in this plugin's host memory: O(ndim).
[[gnu::always_inline]] inline TensorView view_of(const OpCall& call, const bp_tensor& t, int32_t dtype,
                                                 Role role) {
  if (!is_live(t.buffer)) [[unlikely]]
    dead_buffer_fail(call, role);
  // make_view, spelt out so the checks inline into the op (make_view itself
  // stays out of line).
  TensorView v;
  const plugin::ViewError error =
      plugin::check_view(t, dtype, buffer_data(t.buffer), buffer_size(t.buffer), v);
  if (error != plugin::ViewError::none) [[unlikely]]
    plugin::view_fail(error, t, call.name(), role, dtype, buffer_size(t.buffer));
  return v;
}
[[gnu::always_inline]] inline TensorView input_view(const OpCall& call, int i, int32_t dtype) {
  return view_of(call, call.input(i), dtype, {"inputs", i});
}
[[gnu::always_inline]] inline TensorView output_view(const OpCall& call, int32_t dtype) {
  return view_of(call, call.output(), dtype, {"outputs", 0});
}

// A contiguous tensor around an axis: [outer, n, inner].
struct AxisSplit {
  int64_t axis;
  int64_t outer;
  int64_t n;
  int64_t inner;
};

// attrs.axis split of x (host-checked: 0 <= axis < ndim; a 0-d x has n = 1).
AxisSplit split_at_axis(const OpCall& call, const TensorView& x);

// x's elements in fresh row-major storage (for kernels that read contiguous input).
const unsigned char* contiguous_copy(const TensorView& x, std::unique_ptr<unsigned char[]>& storage,
                                     int threads);

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_OPS_HPP_
