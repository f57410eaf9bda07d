// The core's way into the public handles (Device, Backend, Tensor): shared
// by every subsystem. Never installed; plugins and host applications cannot
// see it.
#ifndef BACKPLANE_CORE_COMMON_ACCESS_HPP_
#define BACKPLANE_CORE_COMMON_ACCESS_HPP_

#include <backplane/registry.hpp>
#include <backplane/tensor.hpp>

#include <cstdint>
#include <memory>
#include <utility>

namespace backplane::detail {

struct BackendImpl;  // registry/backend_impl.hpp
struct TensorImpl;   // tensor/tensor_impl.hpp

// The core's way to the private plumbing of the public handles (each names it
// a friend): the impl behind a Device, Backend or Tensor, and a handle made
// from one. Host code cannot reach it: this header is never installed.
struct Access {
  static const std::shared_ptr<BackendImpl>& impl(const Device& d) noexcept { return d.impl(); }
  static const std::shared_ptr<BackendImpl>& impl(const Backend& b) noexcept { return b.impl(); }
  static const std::shared_ptr<TensorImpl>& impl(const Tensor& t) noexcept { return t.impl(); }
  static Device make_device(std::shared_ptr<BackendImpl> backend, int32_t index) {
    return Device(std::move(backend), index);
  }
  static Backend make_backend(std::shared_ptr<BackendImpl> backend) { return Backend(std::move(backend)); }
  static Tensor make_tensor(std::shared_ptr<TensorImpl> impl) { return Tensor(std::move(impl)); }
};

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_COMMON_ACCESS_HPP_
