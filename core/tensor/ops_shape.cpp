// Shape ops and placement: reshape, permute, transpose and slice as views
// sharing the buffer; cat (one strided COPY per input into the output);
// index_select and gather; contiguous; to(device) across backends.
#include "autograd/autograd.hpp"
#include "tensor/op_common.hpp"
#include "tensor/placement.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace backplane {
namespace {

using detail::TensorImpl;

const std::shared_ptr<TensorImpl>& impl_of(const Tensor& t, const char* api) {
  detail::operand(t, api, "the");
  return detail::Access::impl(t);
}

}  // namespace

static Tensor reshape_forward(const Tensor& t, const std::vector<int64_t>& shape) {
  const auto& x = impl_of(t, "reshape");
  if (shape.size() > static_cast<std::size_t>(Shape::kMaxRank)) {
    throw Error(Errc::invalid_argument, "reshape: target shape " + detail::list_to_string(shape) +
                                            " has rank " + std::to_string(shape.size()) +
                                            "; backplane supports at most " +
                                            std::to_string(Shape::kMaxRank) + " dimensions");
  }
  const int64_t numel = x->shape.numel();
  // The product of the given extents, saturating at INT64_MAX (it can then never match).
  int inferred = -1;
  bool has_zero = false;
  int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d == -1) {
      if (inferred >= 0)
        throw Error(Errc::invalid_argument, "reshape: target shape " + detail::list_to_string(shape) +
                                                " has more than one -1; at most one extent can be inferred");
      inferred = static_cast<int>(i);
    } else if (d < 0) {
      throw Error(Errc::invalid_argument, "reshape: target shape " + detail::list_to_string(shape) +
                                              " has a negative extent " + std::to_string(d) + " at dim " +
                                              std::to_string(i) + " (only -1, meaning inferred, is allowed)");
    } else if (d == 0) {
      has_zero = true;
    } else {
      known = known > INT64_MAX / d ? INT64_MAX : known * d;
    }
  }
  if (has_zero) known = 0;
  auto from = [&] {
    return "reshape: cannot reshape " + x->shape.to_string() + " (" + std::to_string(numel) +
           " elements) into " + detail::list_to_string(shape);
  };
  Shape target(shape);
  if (inferred >= 0) {
    if (known == 0)
      throw Error(Errc::invalid_argument,
                  from() + ": the -1 is ambiguous next to a zero extent; give every extent");
    if (numel % known != 0)
      throw Error(Errc::invalid_argument, from() + ": the other extents (product " + std::to_string(known) +
                                              ") do not divide the element count");
    target[inferred] = numel / known;
  } else if (known != numel) {
    throw Error(Errc::invalid_argument, from() + "; the element count must stay the same");
  }
  if (detail::is_contiguous(*x))
    return detail::Access::make_tensor(
        detail::make_view(x, target, detail::contiguous_strides(target), x->byte_offset));
  auto copy = detail::copy_contiguous(*x, "reshape");
  copy->shape = target;
  copy->strides = detail::contiguous_strides(target);
  return detail::Access::make_tensor(std::move(copy));
}

static Tensor permute_forward(const Tensor& t, const std::vector<int64_t>& dims) {
  const auto& x = impl_of(t, "permute");
  const int rank = x->shape.rank();
  if (dims.size() != static_cast<std::size_t>(rank)) {
    throw Error(Errc::invalid_argument, "permute: got " + std::to_string(dims.size()) + " dims " +
                                            detail::list_to_string(dims) + " for a tensor of rank " +
                                            std::to_string(rank) + "; give a permutation of 0.." +
                                            std::to_string(rank - 1));
  }
  Shape shape = x->shape, strides = x->strides;
  bool seen[Shape::kMaxRank] = {};
  for (int i = 0; i < rank; ++i) {
    const int d = detail::normalize_axis(dims[static_cast<std::size_t>(i)], rank, "permute", "dim");
    if (seen[d])
      throw Error(Errc::invalid_argument, "permute: dims " + detail::list_to_string(dims) + " name dim " +
                                              std::to_string(d) + " twice; give a permutation of 0.." +
                                              std::to_string(rank - 1));
    seen[d] = true;
    shape[i] = x->shape[d];
    strides[i] = x->strides[d];
  }
  return detail::Access::make_tensor(detail::make_view(x, shape, strides, x->byte_offset));
}

static Tensor transpose_forward(const Tensor& t, int64_t dim0, int64_t dim1) {
  const auto& x = impl_of(t, "transpose");
  const int rank = x->shape.rank();
  const int d0 = detail::normalize_axis(dim0, rank, "transpose", "dim0");
  const int d1 = detail::normalize_axis(dim1, rank, "transpose", "dim1");
  Shape shape = x->shape, strides = x->strides;
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  return detail::Access::make_tensor(detail::make_view(x, shape, strides, x->byte_offset));
}

static Tensor slice_forward(const Tensor& t, int64_t axis_arg, int64_t start, int64_t end, int64_t step) {
  const auto& x = impl_of(t, "slice");
  const int axis = detail::normalize_axis(axis_arg, x->shape.rank(), "slice");
  if (step <= 0) {
    throw Error(Errc::invalid_argument, "slice: step must be positive, got " + std::to_string(step) +
                                            " (to reverse, index_select with descending indices)");
  }
  const int64_t n = x->shape[axis];
  // Python's rules: negative bounds count from the end; both clamp to [0, n].
  auto clamp_bound = [n](int64_t v) {
    if (v < 0) v = v < -n ? 0 : v + n;
    return v > n ? n : v;
  };
  const int64_t lo = clamp_bound(start), hi = clamp_bound(end);
  const int64_t len = hi > lo ? (hi - lo - 1) / step + 1 : 0;
  Shape shape = x->shape, strides = x->strides;
  shape[axis] = len;
  // A step beyond the extent selects one element: cap it so the stride cannot overflow.
  strides[axis] = x->strides[axis] * std::min<int64_t>(step, std::max<int64_t>(n, 1));
  uint64_t offset = x->byte_offset;
  if (len > 0) offset += static_cast<uint64_t>(lo * x->strides[axis]) * dtype_size(x->dtype);
  return detail::Access::make_tensor(detail::make_view(x, shape, strides, offset));
}

static Tensor cat_forward(const std::vector<Tensor>& tensors, int64_t axis_arg) {
  if (tensors.empty())
    throw Error(Errc::invalid_argument, "cat: the list of tensors is empty; pass at least one");
  const TensorImpl& first = detail::operand(tensors[0], "cat", "the first");
  const int rank = first.shape.rank();
  const int axis = detail::normalize_axis(axis_arg, rank, "cat");
  Shape out_shape = first.shape;
  out_shape[axis] = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined())
      throw Error(Errc::invalid_argument, "cat: tensor " + std::to_string(i) + " is an undefined Tensor");
    const TensorImpl& x = *detail::Access::impl(tensors[i]);
    detail::same_device(first, x, "cat");
    detail::same_dtype(first, x, "cat");
    bool ok = x.shape.rank() == rank;
    for (int d = 0; ok && d < rank; ++d) ok = d == axis || x.shape[d] == first.shape[d];
    if (!ok) {
      throw Error(Errc::shape_mismatch,
                  "cat: tensor " + std::to_string(i) + " has shape " + x.shape.to_string() +
                      " but tensor 0 has " + first.shape.to_string() +
                      "; shapes must match except along axis " + std::to_string(axis_arg));
    }
    out_shape[axis] += x.shape[axis];
  }
  std::vector<const TensorImpl*> operands;
  operands.reserve(tensors.size());
  for (const Tensor& t : tensors) operands.push_back(detail::Access::impl(t).get());
  const detail::Placement p(BP_OP_COPY, first.dtype, first.dtype, "cat", operands.data(),
                            static_cast<int>(operands.size()));
  auto out = p.allocate(out_shape, first.dtype);
  const uint64_t step_bytes = static_cast<uint64_t>(out->strides[axis]) * dtype_size(first.dtype);
  int64_t at = 0;
  for (std::size_t i = 0; i < operands.size(); ++i) {
    const TensorImpl& x = p[static_cast<int>(i)];
    if (x.shape.numel() > 0) {
      // The slot of x inside out: x's shape, out's strides, offset along axis.
      bp_tensor dst = detail::describe(*out);
      dst.byte_offset = out->byte_offset + static_cast<uint64_t>(at) * step_bytes;
      dst.shape = x.shape.data();
      const bp_tensor src = detail::describe(x);
      p.execute(BP_OP_COPY, &src, 1, &dst);
    }
    at += x.shape[axis];
  }
  return detail::Access::make_tensor(std::move(out));
}

static Tensor index_select_forward(const Tensor& t, int64_t axis_arg, const Tensor& index) {
  const TensorImpl& x0 = detail::operand(t, "index_select", "the");
  const TensorImpl& i0 = detail::operand(index, "index_select", "the index");
  detail::same_device(x0, i0, "index_select");
  const int axis = detail::normalize_axis(axis_arg, x0.shape.rank(), "index_select");
  detail::require_dtype(i0.dtype == DType::i64, i0.dtype, "index_select", "the index", "an i64 index");
  if (i0.shape.rank() != 1) {
    throw Error(Errc::shape_mismatch, "index_select: the index has shape " + i0.shape.to_string() +
                                          "; it must be 1-D (reshape it with reshape(index, {-1}))");
  }
  Shape out_shape = x0.shape;
  out_shape[axis] = i0.shape[0];
  // Dense operands first (placed COPYs when strided), then the op, placed.
  const auto x = detail::as_contiguous(detail::Access::impl(t), "index_select");
  const auto i = detail::as_contiguous(detail::Access::impl(index), "index_select");
  const TensorImpl* operands[2] = {x.get(), i.get()};
  const detail::Placement p(BP_OP_INDEX_SELECT, x0.dtype, x0.dtype, "index_select", operands, 2);
  auto out = p.allocate(out_shape, x0.dtype);
  if (out_shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  const bp_tensor in[2] = {detail::describe(p[0]), detail::describe(p[1])};
  const bp_tensor o = detail::describe(*out);
  bp_op_attrs attrs = detail::make_attrs();
  attrs.axis = axis;
  p.execute(BP_OP_INDEX_SELECT, in, 2, &o, &attrs);
  return detail::Access::make_tensor(std::move(out));
}

static Tensor gather_forward(const Tensor& t, int64_t axis_arg, const Tensor& index) {
  const TensorImpl& x0 = detail::operand(t, "gather", "the");
  const TensorImpl& i0 = detail::operand(index, "gather", "the index");
  detail::same_device(x0, i0, "gather");
  const int rank = x0.shape.rank();
  const int axis = detail::normalize_axis(axis_arg, rank, "gather");
  detail::require_dtype(i0.dtype == DType::i64, i0.dtype, "gather", "the index", "an i64 index");
  bool ok = i0.shape.rank() == rank;
  for (int d = 0; ok && d < rank; ++d) ok = d == axis || i0.shape[d] <= x0.shape[d];
  if (!ok) {
    throw Error(Errc::shape_mismatch, "gather: the index has shape " + i0.shape.to_string() +
                                          " for an input of shape " + x0.shape.to_string() + " along axis " +
                                          std::to_string(axis_arg) +
                                          "; the index needs the input's rank and extents no larger than the "
                                          "input's on every other axis");
  }
  const auto x = detail::as_contiguous(detail::Access::impl(t), "gather");
  const auto i = detail::as_contiguous(detail::Access::impl(index), "gather");
  const TensorImpl* operands[2] = {x.get(), i.get()};
  const detail::Placement p(BP_OP_GATHER, x0.dtype, x0.dtype, "gather", operands, 2);
  auto out = p.allocate(i0.shape, x0.dtype);
  if (i0.shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  const bp_tensor in[2] = {detail::describe(p[0]), detail::describe(p[1])};
  const bp_tensor o = detail::describe(*out);
  bp_op_attrs attrs = detail::make_attrs();
  attrs.axis = axis;
  p.execute(BP_OP_GATHER, in, 2, &o, &attrs);
  return detail::Access::make_tensor(std::move(out));
}

static Tensor contiguous_forward(const Tensor& t) {
  return detail::Access::make_tensor(
      detail::copy_contiguous(detail::operand(t, "contiguous", "the"), "contiguous"));
}

namespace detail {

void copy_dense(const TensorImpl& x, const TensorImpl& out, std::string_view what) {
  const uint64_t bytes = static_cast<uint64_t>(x.shape.numel()) * dtype_size(x.dtype);
  copy_bytes(*x.storage, x.byte_offset, *out.storage, out.byte_offset, bytes, what);
  out.storage->invalidate_replica();
}

}  // namespace detail

static Tensor to_forward(const Tensor& t, const Device& device) {
  const TensorImpl& x0 = detail::operand(t, "to", "the");
  const auto& dst_backend = detail::usable(device, "to");
  const int32_t dst_device = device.index();
  // A tensor already belongs to its device wherever placement keeps its bytes.
  if (x0.storage->home_backend() == dst_backend.get() && x0.storage->home_index() == dst_device) return t;

  // Refused (capability_missing) when the target device lacks the dtype's
  // flag, unless its op_fallback holds such tensors for it.
  auto out = detail::allocate_on(dst_backend, dst_device, x0.shape, x0.dtype, "to");
  const uint64_t bytes = out->storage->nbytes;
  if (bytes == 0) return detail::Access::make_tensor(std::move(out));
  // Dense bytes on the source first (a COPY on the source device when strided).
  const auto x = detail::as_contiguous(detail::Access::impl(t), "to");
  detail::copy_dense(*x, *out, "to");
  return detail::Access::make_tensor(std::move(out));
}

// ---- autodiff: each op, then its node when an input requires grad ------------

Tensor reshape(const Tensor& t, const std::vector<int64_t>& shape) {
  Tensor out = reshape_forward(t, shape);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_reshape(t, out);
  return out;
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  Tensor out = permute_forward(t, dims);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_permute(t, dims, out);
  return out;
}

Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  Tensor out = transpose_forward(t, dim0, dim1);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_transpose(t, dim0, dim1, out);
  return out;
}

Tensor slice(const Tensor& t, int64_t axis, int64_t start, int64_t end, int64_t step) {
  Tensor out = slice_forward(t, axis, start, end, step);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_slice(t, axis, start, end, step, out);
  return out;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t axis) {
  Tensor out = cat_forward(tensors, axis);
  for (const Tensor& t : tensors) {
    if (detail::any_requires_grad(t)) [[unlikely]] {
      detail::record_cat(tensors, axis, out);
      break;
    }
  }
  return out;
}

Tensor index_select(const Tensor& t, int64_t axis, const Tensor& index) {
  Tensor out = index_select_forward(t, axis, index);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_index_select(t, axis, index, out);
  return out;
}

Tensor gather(const Tensor& t, int64_t axis, const Tensor& index) {
  Tensor out = gather_forward(t, axis, index);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_gather(t, axis, index, out);
  return out;
}

Tensor contiguous(const Tensor& t) {
  Tensor out = contiguous_forward(t);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_contiguous(t, out);
  return out;
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  const TensorImpl& dst = detail::operand(*this, "Tensor::copy_", "the destination");
  const TensorImpl& s0 = detail::operand(src, "Tensor::copy_", "the source");
  if (!(dst.shape == s0.shape))
    throw Error(Errc::shape_mismatch, "Tensor::copy_: the source has shape " + s0.shape.to_string() +
                                          " but the destination has shape " + dst.shape.to_string());
  if (dst.dtype != s0.dtype)
    throw Error(Errc::dtype_mismatch, "Tensor::copy_: the source is " +
                                          std::string(backplane::to_string(s0.dtype)) +
                                          " but the destination is " +
                                          std::string(backplane::to_string(dst.dtype)) + "; cast it first");
  if (!detail::is_contiguous(dst))
    throw Error(Errc::invalid_argument,
                "Tensor::copy_: the destination must be contiguous (it is a strided view)");
  if (&dst == &s0) return *this;
  const auto x = detail::as_contiguous(detail::Access::impl(src), "Tensor::copy_");
  detail::copy_dense(*x, dst, "Tensor::copy_");
  return *this;
}

Tensor to(const Tensor& t, const Device& device) {
  Tensor out = to_forward(t, device);
  if (detail::any_requires_grad(t)) [[unlikely]]
    detail::record_to(t, out);
  return out;
}

}  // namespace backplane
