// The op front-end: validate devices, dtypes and shapes, compute the output
// shape, then hand the plugin a well-formed request. Nothing here touches
// plugin memory.
#include "internal.hpp"

#include <backplane/ops.hpp>

namespace backplane {
namespace {

const char* op_name(int32_t op) {
  switch (op) {
    case BP_OP_ADD: return "add";
    case BP_OP_SUB: return "sub";
    case BP_OP_MUL: return "mul";
    case BP_OP_DIV: return "div";
    case BP_OP_MATMUL: return "matmul";
    case BP_OP_COPY: return "copy";
    default: return "op";
  }
}

const detail::TensorImpl& operand(const Tensor& t, int32_t op, const char* which) {
  if (!t.defined())
    throw Error(Errc::invalid_argument, std::string(op_name(op)) + ": " + which + " operand is an undefined Tensor");
  return *t.impl();
}

void same_device(const detail::TensorImpl& a, const detail::TensorImpl& b, int32_t op) {
  if (a.storage->backend == b.storage->backend && a.storage->device == b.storage->device) return;
  throw Error(Errc::device_mismatch, std::string(op_name(op)) + ": operands are on different devices (" +
                                         a.storage->backend->device_id(a.storage->device) + " and " +
                                         b.storage->backend->device_id(b.storage->device) +
                                         "); both operands of an op must live on one device");
}

void same_dtype(const detail::TensorImpl& a, const detail::TensorImpl& b, int32_t op) {
  if (a.dtype == b.dtype) return;
  throw Error(Errc::dtype_mismatch, std::string(op_name(op)) + ": operand dtypes differ (" +
                                        std::string(to_string(a.dtype)) + " and " + std::string(to_string(b.dtype)) +
                                        "); cast one operand first");
}

void require_support(detail::BackendImpl& backend, int32_t device, int32_t op, DType dtype) {
  if (backend.supports(device, op, static_cast<int32_t>(dtype))) return;
  throw Error(Errc::unsupported_op, "backend \"" + backend.name + "\" (" + backend.device_id(device) +
                                        ") does not support " + op_name(op) + " on " + std::string(to_string(dtype)));
}

// Strides that read `t` as if it had shape `out` (NumPy broadcasting): 0 on
// dimensions that t lacks or has as 1.
Shape broadcast_strides(const detail::TensorImpl& t, const Shape& out) {
  Shape s = out;
  const int lead = out.rank() - t.shape.rank();
  for (int i = 0; i < out.rank(); ++i) {
    const int j = i - lead;
    s[i] = (j < 0 || t.shape[j] == 1) ? 0 : t.strides[j];
  }
  return s;
}

void execute(detail::BackendImpl& backend, int32_t device, int32_t op, const bp_tensor* inputs, int32_t num_inputs,
             const bp_tensor* output) {
  static const bp_op_attrs kNoAttrs = {sizeof(bp_op_attrs), 0, 0, 0, 0.0, 0.0, 0, nullptr, 0};
  bp_execute_args args{};
  args.struct_size = sizeof(args);
  args.device = device;
  args.op = op;
  args.inputs = inputs;
  args.num_inputs = num_inputs;
  args.num_outputs = 1;
  args.outputs = output;
  args.attrs = &kNoAttrs;
  bp_status* st = backend.api.execute(backend.plugin, &args);
  if (st != nullptr) backend.check(st, std::string("execute ") + op_name(op) + " on " + backend.device_id(device));
}

Tensor binary(int32_t op, const Tensor& a, const Tensor& b) {
  const detail::TensorImpl& x = operand(a, op, "left");
  const detail::TensorImpl& y = operand(b, op, "right");
  same_device(x, y, op);
  same_dtype(x, y, op);
  const Shape out_shape = x.shape == y.shape ? x.shape : broadcast_shapes(x.shape, y.shape);
  const auto& backend = x.storage->backend;
  const int32_t device = x.storage->device;
  require_support(*backend, device, op, x.dtype);

  auto out = detail::allocate_tensor(backend, device, out_shape, x.dtype);
  if (out_shape.numel() == 0) return Tensor(std::move(out));
  bp_tensor in[2] = {detail::describe(x), detail::describe(y)};
  // Operands already of the output's shape pass their own strides; others
  // are described as broadcast views (stride 0), never materialised.
  Shape xs, ys;
  if (!(x.shape == out_shape)) {
    xs = broadcast_strides(x, out_shape);
    in[0].ndim = out_shape.rank();
    in[0].shape = out->shape.data();
    in[0].strides = xs.data();
  }
  if (!(y.shape == out_shape)) {
    ys = broadcast_strides(y, out_shape);
    in[1].ndim = out_shape.rank();
    in[1].shape = out->shape.data();
    in[1].strides = ys.data();
  }
  const bp_tensor o = detail::describe(*out);
  execute(*backend, device, op, in, 2, &o);
  return Tensor(std::move(out));
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  Shape out = a.rank() >= b.rank() ? a : b;
  for (int i = 0; i < rank; ++i) {
    const int ia = i - (rank - a.rank());
    const int ib = i - (rank - b.rank());
    const int64_t da = ia < 0 ? 1 : a[ia];
    const int64_t db = ib < 0 ? 1 : b[ib];
    if (da != db && da != 1 && db != 1) {
      throw Error(Errc::shape_mismatch, "shapes " + a.to_string() + " and " + b.to_string() +
                                            " cannot be broadcast together (dimension " + std::to_string(i) + ": " +
                                            std::to_string(da) + " vs " + std::to_string(db) + ")");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(BP_OP_ADD, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BP_OP_SUB, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BP_OP_MUL, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BP_OP_DIV, a, b); }

Tensor matmul(const Tensor& a, const Tensor& b) {
  const detail::TensorImpl& x = operand(a, BP_OP_MATMUL, "left");
  const detail::TensorImpl& y = operand(b, BP_OP_MATMUL, "right");
  same_device(x, y, BP_OP_MATMUL);
  same_dtype(x, y, BP_OP_MATMUL);
  if (x.shape.rank() != 2 || y.shape.rank() != 2) {
    throw Error(Errc::shape_mismatch, "matmul: expects 2-D operands, got " + x.shape.to_string() + " and " +
                                          y.shape.to_string());
  }
  if (x.shape[1] != y.shape[0]) {
    throw Error(Errc::shape_mismatch, "matmul: inner dimensions differ: " + x.shape.to_string() + " x " +
                                          y.shape.to_string() + " (" + std::to_string(x.shape[1]) +
                                          " != " + std::to_string(y.shape[0]) + ")");
  }
  const auto& backend = x.storage->backend;
  const int32_t device = x.storage->device;
  require_support(*backend, device, BP_OP_MATMUL, x.dtype);
  auto out = detail::allocate_tensor(backend, device, Shape{x.shape[0], y.shape[1]}, x.dtype);
  if (out->shape.numel() == 0) return Tensor(std::move(out));
  const bp_tensor in[2] = {detail::describe(x), detail::describe(y)};
  const bp_tensor o = detail::describe(*out);
  execute(*backend, device, BP_OP_MATMUL, in, 2, &o);
  return Tensor(std::move(out));
}

Tensor contiguous(const Tensor& t) {
  const detail::TensorImpl& x = operand(t, BP_OP_COPY, "the");
  const auto& backend = x.storage->backend;
  const int32_t device = x.storage->device;
  require_support(*backend, device, BP_OP_COPY, x.dtype);
  auto out = detail::allocate_tensor(backend, device, x.shape, x.dtype);
  if (x.shape.numel() == 0) return Tensor(std::move(out));
  const bp_tensor in = detail::describe(x);
  const bp_tensor o = detail::describe(*out);
  execute(*backend, device, BP_OP_COPY, &in, 1, &o);
  return Tensor(std::move(out));
}

}  // namespace backplane
