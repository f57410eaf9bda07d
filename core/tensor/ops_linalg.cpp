// matmul: [...,M,K] x [...,K,N] -> [...,M,N] with NumPy-broadcast batch dims.
// 2-D operands pass with their own strides; batched ones are described with
// the output's batch dims (stride 0 where an operand is broadcast) and their
// own strides on the last two dims, so nothing is materialised.
#include "autograd/autograd.hpp"
#include "tensor/op_common.hpp"
#include "tensor/placement.hpp"

namespace backplane {
namespace {

using detail::TensorImpl;

// The batch dims of a [...,R,C] shape.
Shape batch_of(const Shape& s) { return Shape(std::span<const int64_t>(s.begin(), s.size() - 2)); }

// `t` read with the output's batch dims: shape batch + t's last two,
// broadcast strides on the batch dims.
void describe_batched(const TensorImpl& t, const Shape& batch, Shape& shape, Shape& strides, bp_tensor& d) {
  std::vector<int64_t> sh(batch.begin(), batch.end()), st(batch.begin(), batch.end());
  const int tb = t.shape.rank() - 2;
  const int lead = batch.rank() - tb;
  for (int i = 0; i < batch.rank(); ++i) {
    const int j = i - lead;
    st[static_cast<std::size_t>(i)] = (j < 0 || t.shape[j] == 1) ? 0 : t.strides[j];
  }
  for (int k = tb; k < tb + 2; ++k) {
    sh.push_back(t.shape[k]);
    st.push_back(t.strides[k]);
  }
  shape = Shape(sh);
  strides = Shape(st);
  d = detail::describe(t);
  d.ndim = shape.rank();
  d.shape = shape.data();
  d.strides = strides.data();
}

}  // namespace

static Tensor matmul_forward(const Tensor& a, const Tensor& b) {
  const TensorImpl& x = detail::operand(a, "matmul", "left");
  const TensorImpl& y = detail::operand(b, "matmul", "right");
  detail::same_device(x, y, "matmul");
  detail::same_dtype(x, y, "matmul");
  detail::require_op_dtype(BP_OP_MATMUL, x.dtype, "matmul", "the operands");
  if (x.shape.rank() < 2 || y.shape.rank() < 2) {
    throw Error(Errc::shape_mismatch,
                "matmul: expects operands of rank >= 2 ([M,K] x [K,N], optionally with leading "
                "batch dims), got " +
                    x.shape.to_string() + " and " + y.shape.to_string() +
                    "; reshape a vector to [1,K] or [K,1] first");
  }
  const int xr = x.shape.rank(), yr = y.shape.rank();
  const int64_t m = x.shape[xr - 2], k = x.shape[xr - 1], k2 = y.shape[yr - 2], n = y.shape[yr - 1];
  if (k != k2) {
    throw Error(Errc::shape_mismatch, "matmul: inner dimensions differ: " + x.shape.to_string() + " x " +
                                          y.shape.to_string() + " (" + std::to_string(k) +
                                          " != " + std::to_string(k2) +
                                          "); the left's last dim must equal the right's "
                                          "second-to-last");
  }
  Shape batch;
  try {
    batch = broadcast_shapes(batch_of(x.shape), batch_of(y.shape));
  } catch (const Error&) {
    throw Error(Errc::shape_mismatch,
                "matmul: batch dims " + batch_of(x.shape).to_string() + " of " + x.shape.to_string() +
                    " and " + batch_of(y.shape).to_string() + " of " + y.shape.to_string() +
                    " cannot be broadcast together (each must match or be 1, NumPy rules)");
  }
  // The batch dims, then [m, n]: on the stack (a vector here was a malloc per matmul).
  int64_t out_dims[Shape::kMaxRank + 2];
  const std::size_t out_rank = batch.size() + 2;
  std::copy(batch.begin(), batch.end(), out_dims);
  out_dims[batch.size()] = m;
  out_dims[batch.size() + 1] = n;
  const Shape out_shape(std::span<const int64_t>(out_dims, out_rank));

  const TensorImpl* operands[2] = {&x, &y};
  const detail::Placement p(BP_OP_MATMUL, x.dtype, x.dtype, "matmul", operands, 2);
  auto out = p.allocate(out_shape, x.dtype);
  if (out_shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  const bp_tensor o = detail::describe(*out);
  if (xr == 2 && yr == 2) {
    const bp_tensor in[2] = {detail::describe(p[0]), detail::describe(p[1])};
    p.execute(BP_OP_MATMUL, in, 2, &o);
    return detail::Access::make_tensor(std::move(out));
  }
  Shape shapes[2], strides[2];
  bp_tensor in[2];
  describe_batched(p[0], batch, shapes[0], strides[0], in[0]);
  describe_batched(p[1], batch, shapes[1], strides[1], in[1]);
  p.execute(BP_OP_MATMUL, in, 2, &o);
  return detail::Access::make_tensor(std::move(out));
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  Tensor out = matmul_forward(a, b);
  if (detail::any_requires_grad(a, b)) [[unlikely]]
    detail::record_matmul(a, b, out);
  return out;
}

}  // namespace backplane
