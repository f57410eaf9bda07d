// Tensor: a handle to a typed, shaped view of a plugin buffer on one device.
//
// Copies of a Tensor share the same data (like torch.Tensor); the plugin
// buffer is freed when the last tensor viewing it goes away. Distinct
// tensors may be used from different threads; one tensor handle must not be
// mutated (e.g. by set_distributed_params) while another thread reads it.
//
// const qualifies the handle, not what it shares (as std::shared_ptr's
// operator* is const): a const Tensor always names the same shape, dtype and
// device, but copy_() overwrites the elements that every copy of the handle
// and every view of the storage sees, and require_grad() marks the tensor for
// every copy of the handle. Both are const so that parameters held as
// const Tensor& (an optimizer's list, a lambda's capture) can be updated and
// marked in place.
#ifndef BACKPLANE_TENSOR_HPP_
#define BACKPLANE_TENSOR_HPP_

#include <backplane/export.hpp>

#include <backplane/dtype.hpp>
#include <backplane/error.hpp>
#include <backplane/registry.hpp>
#include <backplane/shape.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace backplane {

namespace detail {
struct TensorImpl;
struct Access;  // the core's way to the private plumbing below
}  // namespace detail
class Gradients;         // <backplane/autograd.hpp>
struct BackwardOptions;  // <backplane/autograd.hpp>

class BACKPLANE_API Tensor {
 public:
  Tensor() = default;  // an undefined tensor; defined() is false

  // A tensor of the given shape whose contents are unspecified.
  static Tensor empty(const Device& device, const Shape& shape, DType dtype);
  // Copies `values` (row-major; values.size() must equal shape's element
  // count) into a new tensor on `device`.
  template <class T>
  static Tensor from_vector(const Device& device, const Shape& shape, const std::vector<T>& values) {
    return from_bytes(device, shape, dtype_of_v<T>, values.data(), values.size());
  }
  static Tensor from_bytes(const Device& device, const Shape& shape, DType dtype, const void* data,
                           std::size_t count);

  bool defined() const noexcept { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;  // in elements
  int rank() const { return shape().rank(); }
  int64_t numel() const { return shape().numel(); }
  DType dtype() const;
  Device device() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
  // Dense row-major from its first element (strides of extent-1 dims are
  // ignored). Views from permute, transpose and slice usually are not.
  bool is_contiguous() const;

  // Reads the elements back to the host, row-major. T must match dtype()
  // (Errc::dtype_mismatch otherwise). Synchronises the device. One copy on
  // a host_visible device: straight from its memory into the new vector.
  template <class T>
  std::vector<T> to_vector() const {
    const auto n = static_cast<std::size_t>(numel());
    if (const T* first = static_cast<const T*>(host_elements(dtype_of_v<T>, n, alignof(T))))
      return std::vector<T>(first, first + n);
    std::vector<T> out(n);
    read_into(dtype_of_v<T>, out.data(), out.size());
    return out;
  }
  // Reads into caller memory; count must equal numel().
  void read_into(DType dtype, void* dst, std::size_t count) const;

  // A copy on `device` (any backend); *this when it already lives there.
  Tensor to(const Device& device) const;

  // "Tensor(shape=[2, 3], dtype=f32, device=cpu:0)"
  std::string to_string() const;

  // Overwrites this tensor's elements with src's, in place (src may live on
  // any device): every copy of this handle and every view of the same storage
  // sees the new values, though the method is const (see the top of this
  // file). Same shape and dtype (Errc::shape_mismatch / dtype_mismatch), and
  // this tensor must be contiguous (Errc::invalid_argument). For optimizer
  // updates of parameters; not recorded by autodiff, so a graph that saved
  // this tensor must have run backward first. Synchronises both devices.
  const Tensor& copy_(const Tensor& src) const;

  // ---- autodiff (the contract is in <backplane/autograd.hpp>) ----
  // Marks this tensor, and so every copy of the handle though the method is
  // const, as a leaf whose gradient backward() computes; returns it. Mark a
  // tensor before other threads use it. f32/f64 only (Errc::dtype_mismatch
  // otherwise). A tensor that already requires grad is left as it is.
  Tensor require_grad() const;
  // True for a leaf marked with require_grad() and for the output of an op
  // recorded from one; false for an undefined tensor.
  bool requires_grad() const noexcept;
  // The same data, outside any graph: does not require grad.
  Tensor detach() const;
  // Gradients of this tensor (the root) with respect to every leaf it
  // depends on. Errc::invalid_argument when it does not require grad or its
  // graph was freed by an earlier backward(); Errc::shape_mismatch for a
  // root of more than one element without options.gradient, and
  // shape/dtype/device_mismatch for a gradient that does not match it.
  Gradients backward() const;
  Gradients backward(const BackwardOptions& options) const;

 private:
  friend struct detail::Access;
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<detail::TensorImpl>& impl() const noexcept { return impl_; }

  const detail::TensorImpl& checked() const;
  // to_vector's source: the host address of the first element when the
  // elements are contiguous in host_visible memory (an async device
  // synchronised) at an address aligned to `alignment`; nullptr otherwise
  // and for no elements. Checks dtype and count as read_into does.
  const void* host_elements(DType dtype, std::size_t count, std::size_t alignment) const;
  std::shared_ptr<detail::TensorImpl> impl_;
};

// std::vector<bool> is bit-packed: go through one byte per element.
template <>
inline Tensor Tensor::from_vector<bool>(const Device& device, const Shape& shape,
                                        const std::vector<bool>& values) {
  const std::vector<uint8_t> bytes(values.begin(), values.end());
  return from_bytes(device, shape, DType::bool_, bytes.data(), bytes.size());
}

template <>
inline std::vector<bool> Tensor::to_vector<bool>() const {
  const auto n = static_cast<std::size_t>(numel());
  if (const auto* first = static_cast<const uint8_t*>(host_elements(DType::bool_, n, 1)))
    return std::vector<bool>(first, first + n);
  std::vector<uint8_t> bytes(n);
  read_into(DType::bool_, bytes.data(), bytes.size());
  return {bytes.begin(), bytes.end()};
}

}  // namespace backplane

#endif  // BACKPLANE_TENSOR_HPP_
