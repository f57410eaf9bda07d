// The host side of the cuda plugin's ops (ops.hpp): views, index maps and
// scratch around one kernel launch per op.
#include "ops.hpp"

#include <string>

#include "kernels.hpp"

namespace backplane::cuda {
namespace {

using plugin::fail;
using plugin::Role;

[[noreturn, gnu::cold]] void launch_refused(const OpCall& call, int32_t dtype) {
  fail(BP_STATUS_UNSUPPORTED,
       std::string("cuda: ") + call.name() + ": no kernel for dtype " + plugin::dtype_name(dtype));
}

// CUDA's launch error, named after the op: the message is made only here.
[[gnu::cold, gnu::noinline]] void launch_failed(const OpCall& call, cudaError_t error) {
  call.device.check(error, std::string(call.name()) + ": kernel launch");
}

// Checks the launch: a refused dtype, or CUDA's launch error.
void launched(const OpCall& call, bool ok, int32_t dtype) {
  if (!ok) [[unlikely]]
    launch_refused(call, dtype);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) [[unlikely]]
    launch_failed(call, error);
}

// Row-major strides of a shape (elements).
void dense_strides(int32_t ndim, const int64_t* shape, int64_t* strides) {
  int64_t s = 1;
  for (int32_t d = ndim - 1; d >= 0; --d) {
    strides[d] = s;
    s *= shape[d];
  }
}

TensorView out_view(const OpCall& call, int32_t dtype) {
  return operand(call, call.output(), dtype, {"outputs", 0});
}
TensorView in_view(const OpCall& call, int i, int32_t dtype) {
  return operand(call, call.input(i), dtype, {"inputs", i});
}

void binary(const OpCall& call) {
  expect_arity(call, 2);
  const int32_t dtype = call.output().dtype;
  const TensorView out = out_view(call, dtype);
  const TensorView a = in_view(call, 0, dtype);
  const TensorView b = in_view(call, 1, dtype);
  if (out.numel == 0) return;
  const int64_t* const s[3] = {out.strides, a.strides, b.strides};
  launched(call,
           launch_binary(call.kernels(), dtype, make_index_map<3>(out.ndim, out.shape, s), out.numel,
                         out.data, a.data, b.data),
           dtype);
}

void compare(const OpCall& call) {
  expect_arity(call, 2);
  const int32_t dtype = call.input(0).dtype;
  const TensorView out = out_view(call, BP_DTYPE_BOOL);
  const TensorView a = in_view(call, 0, dtype);
  const TensorView b = in_view(call, 1, dtype);
  if (out.numel == 0) return;
  const int64_t* const s[3] = {out.strides, a.strides, b.strides};
  launched(call,
           launch_compare(call.kernels(), dtype, make_index_map<3>(out.ndim, out.shape, s), out.numel,
                          out.data, a.data, b.data),
           dtype);
}

void where(const OpCall& call) {
  expect_arity(call, 3);
  const int32_t dtype = call.output().dtype;
  const TensorView out = out_view(call, dtype);
  const TensorView cond = in_view(call, 0, BP_DTYPE_BOOL);
  const TensorView a = in_view(call, 1, dtype);
  const TensorView b = in_view(call, 2, dtype);
  if (out.numel == 0) return;
  const int64_t* const s[4] = {out.strides, cond.strides, a.strides, b.strides};
  launched(call,
           launch_where(call.kernels(), out.element_size, make_index_map<4>(out.ndim, out.shape, s),
                        out.numel, out.data, cond.data, a.data, b.data),
           dtype);
}

void unary(const OpCall& call) {
  expect_arity(call, 1);
  const int32_t dtype = call.output().dtype;
  const TensorView out = out_view(call, dtype);
  const TensorView in = in_view(call, 0, dtype);
  if (out.numel == 0) return;
  const int64_t* const s[2] = {out.strides, in.strides};
  // clamp's bounds as the dtype holds them (integers saturate), as a cast would.
  const uint64_t lo = scalar_bits(dtype, call.attrs().scalar0);
  const uint64_t hi = scalar_bits(dtype, call.attrs().scalar1);
  launched(call,
           launch_unary(call.kernels(), dtype, make_index_map<2>(out.ndim, out.shape, s), out.numel, out.data,
                        in.data, lo, hi),
           dtype);
}

// axpby: inputs [y, x] contiguous; the output is y itself (abi.h's UPDATE kind).
void axpby(const OpCall& call) {
  expect_arity(call, 2);
  const int32_t dtype = call.output().dtype;
  const TensorView out = out_view(call, dtype);
  const TensorView y = in_view(call, 0, dtype);
  const TensorView x = in_view(call, 1, dtype);
  if (out.numel == 0) return;
  if (!out.contiguous || !y.contiguous || !x.contiguous || out.data != y.data || x.numel != out.numel)
    fail(
        BP_STATUS_INVALID_ARGUMENT,
        "cuda: axpby: y, x and the output must be contiguous and the output must be y itself (abi.h's UPDATE "
        "kind)");
  launched(call,
           launch_axpby(call.kernels(), dtype, out.numel, out.data, x.data,
                        scalar_bits(dtype, call.attrs().scalar0), scalar_bits(dtype, call.attrs().scalar1)),
           dtype);
}

void copy(const OpCall& call) {
  expect_arity(call, 1);
  const int32_t dtype = call.output().dtype;
  const TensorView out = out_view(call, dtype);
  const TensorView in = in_view(call, 0, dtype);
  if (out.numel == 0) return;
  const int64_t* const s[2] = {out.strides, in.strides};
  launched(call,
           launch_copy(call.kernels(), out.element_size, make_index_map<2>(out.ndim, out.shape, s), out.numel,
                       out.data, in.data),
           dtype);
}

void cast(const OpCall& call) {
  expect_arity(call, 1);
  const int32_t from = call.input(0).dtype;
  const int32_t to = call.output().dtype;
  if (!AllDTypes::contains(from) || !AllDTypes::contains(to))
    launch_refused(call, AllDTypes::contains(from) ? to : from);
  const TensorView out = out_view(call, to);
  const TensorView in = in_view(call, 0, from);
  if (out.numel == 0) return;
  const int64_t* const s[2] = {out.strides, in.strides};
  launched(call,
           launch_cast(call.kernels(), from, to, make_index_map<2>(out.ndim, out.shape, s), out.numel,
                       out.data, in.data),
           from);
}

// Creation ops write a contiguous output (abi.h); a strided one (never sent
// by the host) would be refused by the contiguity check below.
TensorView creation_output(const OpCall& call, int32_t dtype) {
  expect_arity(call, 0);
  const TensorView out = out_view(call, dtype);
  if (!out.contiguous)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cuda: ") + call.name() + ": the output must be contiguous");
  return out;
}

void create(const OpCall& call) {
  const int32_t dtype = call.output().dtype;
  const TensorView out = creation_output(call, dtype);
  if (out.numel == 0) return;
  const bp_op_attrs& a = call.attrs();
  bool ok = false;
  switch (call.op()) {
    case BP_OP_FILL:
      ok = launch_fill(call.kernels(), out.element_size, scalar_bits(dtype, a.scalar0), out.numel, out.data);
      break;
    case BP_OP_ARANGE:
      ok = ArithmeticDTypes::contains(dtype) &&
           launch_arange(call.kernels(), dtype, out.numel, out.data, a.scalar0, a.scalar1);
      break;
    default:  // rand_uniform, randn
      ok = FloatDTypes::contains(dtype) && launch_random(call.kernels(), dtype, call.op() == BP_OP_RANDN,
                                                         out.numel, out.data, a.seed, a.scalar0, a.scalar1);
      break;
  }
  launched(call, ok, dtype);
}

struct AxisSplit {
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;
};

AxisSplit split_at_axis(const OpCall& call, const TensorView& x) {
  AxisSplit s;
  if (x.ndim == 0) return s;
  const int64_t axis = call.attrs().axis;
  if (axis < 0 || axis >= x.ndim)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cuda: ") + call.name() + ": axis " + std::to_string(axis) +
                                         " is outside 0.." + std::to_string(x.ndim - 1));
  for (int64_t d = 0; d < axis; ++d) s.outer *= x.shape[d];
  s.n = x.shape[axis];
  for (int64_t d = axis + 1; d < x.ndim; ++d) s.inner *= x.shape[d];
  return s;
}

// Reductions and softmax: dense input, dense output (scratch when the
// host's output is strided), one row kernel.
void row_op(const OpCall& call) {
  expect_arity(call, 1);
  const int32_t dtype = call.input(0).dtype;
  const int32_t op = call.op();
  const bool arg = op == BP_OP_ARGMAX || op == BP_OP_ARGMIN;
  const int32_t out_dtype = arg ? BP_DTYPE_I64 : dtype;
  const TensorView out = out_view(call, out_dtype);
  const TensorView x = in_view(call, 0, dtype);
  if (out.numel == 0) return;
  const AxisSplit s = split_at_axis(call, x);
  Scratch input_copy(call.device);
  Scratch output_copy(call.device);
  const void* in = dense(call, x, input_copy);
  void* dst = out.data;
  if (!out.contiguous)
    dst = output_copy.allocate(static_cast<uint64_t>(out.numel) * out.element_size,
                               std::string(call.name()) + ": output scratch");
  bool ok = false;
  if (op == BP_OP_SOFTMAX || op == BP_OP_LOG_SOFTMAX)
    ok = launch_softmax(call.kernels(), op == BP_OP_LOG_SOFTMAX, dtype, s.outer, s.n, s.inner, dst, in);
  else if (arg)
    ok = launch_arg_reduce(call.kernels(), op == BP_OP_ARGMAX, dtype, s.outer, s.n, s.inner,
                           static_cast<int64_t*>(dst), in);
  else
    ok = (op != BP_OP_MEAN || FloatDTypes::contains(dtype)) &&
         launch_reduce(call.kernels(), op, dtype, s.outer, s.n, s.inner, dst, in);
  launched(call, ok, dtype);
  if (!out.contiguous) scatter_dense(call, dst, out);
}

// index_select and gather: one kernel over the output's shape. x's offset
// without its axis, plus index * x's axis stride.
void take(const OpCall& call) {
  expect_arity(call, 2);
  const int32_t dtype = call.input(0).dtype;
  const TensorView out = out_view(call, dtype);
  const TensorView x = in_view(call, 0, dtype);
  const TensorView index = in_view(call, 1, BP_DTYPE_I64);
  if (out.numel == 0) return;
  const int64_t axis = call.attrs().axis;
  if (axis < 0 || axis >= x.ndim || out.ndim != x.ndim)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cuda: ") + call.name() + ": axis " + std::to_string(axis) +
                                         " does not fit x of ndim " + std::to_string(x.ndim));
  int64_t x_strides[kMaxMapDims] = {};
  int64_t index_strides[kMaxMapDims] = {};
  if (x.ndim > kMaxMapDims)
    fail(BP_STATUS_INVALID_ARGUMENT,
         std::string("cuda: ") + call.name() + ": more than " + std::to_string(kMaxMapDims) + " dimensions");
  for (int32_t d = 0; d < x.ndim; ++d) {
    x_strides[d] = d == axis ? 0 : x.strides[d];
    if (call.op() == BP_OP_GATHER)
      index_strides[d] = index.strides[d];
    else
      index_strides[d] = d == axis ? index.strides[0] : 0;
  }
  const int64_t* const s[3] = {out.strides, x_strides, index_strides};
  launched(call,
           launch_take(call.kernels(), out.element_size, make_index_map<3>(out.ndim, out.shape, s), out.numel,
                       out.data, x.data, index.as<const int64_t>(), x.strides[axis], x.shape[axis]),
           dtype);
}

}  // namespace

void expect_arity(const OpCall& call, int32_t inputs) {
  const bp_execute_args& a = call.args;
  if (a.num_inputs != inputs || a.num_outputs != 1 || (inputs > 0 && a.inputs == nullptr) ||
      a.outputs == nullptr) [[unlikely]]
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cuda: ") + call.name() + ": takes " +
                                         std::to_string(inputs) + " inputs and 1 output, got " +
                                         std::to_string(a.num_inputs) + " and " +
                                         std::to_string(a.num_outputs));
}

TensorView operand(const OpCall& call, const bp_tensor& t, int32_t dtype, Role role) {
  Buffer& b = live_buffer(t.buffer, call.name());
  if (b.device != call.device.ordinal()) [[unlikely]]
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cuda: ") + call.name() + ": " + role.to_string() +
                                         " lives on cuda:" + std::to_string(b.device) +
                                         ", not cuda:" + std::to_string(call.device.ordinal()));
  if (t.ndim > kMaxMapDims) [[unlikely]]
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cuda: ") + call.name() + ": " + role.to_string() + " has " +
                                         std::to_string(t.ndim) + " dimensions; the most is " +
                                         std::to_string(kMaxMapDims));
  TensorView v = plugin::make_view(t, dtype, static_cast<unsigned char*>(b.data), b.size, call.name(), role);
  call.device.order_after_comm(b);
  return v;
}

const void* dense(const OpCall& call, const TensorView& v, Scratch& scratch) {
  if (v.contiguous || v.numel == 0) return v.data;
  void* to = scratch.allocate(static_cast<uint64_t>(v.numel) * v.element_size,
                              std::string(call.name()) + ": dense copy of an input");
  int64_t strides[kMaxMapDims];
  dense_strides(v.ndim, v.shape, strides);
  const int64_t* const s[2] = {strides, v.strides};
  KernelContext k = call.kernels();
  launched(call, launch_copy(k, v.element_size, make_index_map<2>(v.ndim, v.shape, s), v.numel, to, v.data),
           v.dtype);
  return to;
}

void scatter_dense(const OpCall& call, const void* from, const TensorView& to) {
  int64_t strides[kMaxMapDims];
  dense_strides(to.ndim, to.shape, strides);
  const int64_t* const s[2] = {to.strides, strides};
  launched(call,
           launch_copy(call.kernels(), to.element_size, make_index_map<2>(to.ndim, to.shape, s), to.numel,
                       to.data, from),
           to.dtype);
}

void run_op(const OpCall& call) {
  switch (bp_op_info_of(call.op())->kind) {
    case BP_OP_KIND_BINARY:
      return binary(call);
    case BP_OP_KIND_COMPARE:
      return compare(call);
    case BP_OP_KIND_SELECT:
      return where(call);
    case BP_OP_KIND_UNARY:
      return unary(call);
    case BP_OP_KIND_UPDATE:
      return axpby(call);
    case BP_OP_KIND_COPY:
      return copy(call);
    case BP_OP_KIND_CAST:
      return cast(call);
    case BP_OP_KIND_CREATE:
    case BP_OP_KIND_RANGE:
      return create(call);
    case BP_OP_KIND_REDUCE:
    case BP_OP_KIND_ARG_REDUCE:
    case BP_OP_KIND_SOFTMAX:
      return row_op(call);
    case BP_OP_KIND_INDEX_SELECT:
    case BP_OP_KIND_GATHER:
      return take(call);
    case BP_OP_KIND_MATMUL:
      return run_matmul(call);
    default:
      fail(BP_STATUS_UNSUPPORTED,
           "cuda: execute: " + plugin::op_name(call.op()) + " is not an op of this plugin");
  }
}

}  // namespace backplane::cuda
