// The tensor's private types: a plugin buffer (Storage, with its placement
// replica) and the impl behind a Tensor, and the helpers that make and
// describe them. Never installed; plugins and host applications cannot see it.
#ifndef BACKPLANE_CORE_TENSOR_TENSOR_IMPL_HPP_
#define BACKPLANE_CORE_TENSOR_TENSOR_IMPL_HPP_

#include "common/access.hpp"
#include "registry/backend_impl.hpp"

#include <backplane/abi.h>
#include <backplane/distributed.hpp>
#include <backplane/shape.hpp>
#include <backplane/tensor.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

namespace backplane::detail {

struct GradNode;  // autograd/autograd.hpp

// A plugin buffer; freed through its plugin when the last view goes away.
// (backend, device) is where the bytes are. A tensor's device (the one the
// user asked for, Tensor::device()) is `home` when set: op_fallback put the
// bytes on the fallback host's device (placement.hpp). All of this is fixed
// at creation, except `replica`.
struct Storage {
  std::shared_ptr<BackendImpl> backend;
  bp_buffer* buffer = nullptr;
  uint64_t nbytes = 0;
  int32_t device = 0;
  int32_t home_device = 0;
  std::shared_ptr<BackendImpl> home;  // null: the bytes are on the tensor's own device
  // For bytes a placed op produced: that op and dtype, so that copying them
  // back to `home` is charged to it in the fallback report.
  int16_t made_by_op = 0;
  int16_t made_by_dtype = 0;
  // The same bytes on the other device of the pair (home and its fallback
  // host): a copy, or a zero-copy import between host_visible devices.
  // Made on demand by placement (the slot too, so a tensor that never
  // meets placement pays one null pointer), dropped by every in-place write
  // (invalidate_replica).
  struct ReplicaSlot {
    std::mutex mutex;
    std::shared_ptr<TensorImpl> replica;  // guarded by mutex; laid out as the operand that made it
    std::shared_ptr<TensorImpl> view;     // guarded by mutex: the last other layout asked for, over replica
    bool alias = false;                   // the replica imports these very bytes
    // The replica while it is an import (alias), for placement's look-up
    // without the lock or a reference count (pinned_replica). An import is
    // never freed before this storage: one that is replaced (the fallback
    // target changed) moves to `retired`, so the pointer stays valid while
    // any tensor over this storage lives.
    std::atomic<const TensorImpl*> pinned{nullptr};
    std::vector<std::shared_ptr<TensorImpl>> retired;  // guarded by mutex
  };
  mutable std::atomic<ReplicaSlot*> replica_slot{nullptr};

  BackendImpl* home_backend() const noexcept { return home ? home.get() : backend.get(); }
  int32_t home_index() const noexcept { return home ? home_device : device; }
  // Called after the bytes were written in place (copy_, collectives).
  void invalidate_replica() const noexcept;
  ReplicaSlot& first_replica() const;  // replica()'s first call on this storage
  // The replica slot, made on first use (one thread wins a race; the others'
  // go back): from a per-thread pool, as TensorImpls are.
  ReplicaSlot& replica() const {
    if (ReplicaSlot* slot = replica_slot.load(std::memory_order_acquire)) [[likely]]
      return *slot;
    return first_replica();
  }

  Storage(std::shared_ptr<BackendImpl> b, int32_t dev, uint64_t size);
  // Takes ownership of `adopted`, a buffer the plugin already made (e.g. by
  // buffer_import for DLPack import); never allocates, never throws.
  Storage(std::shared_ptr<BackendImpl> b, int32_t dev, bp_buffer* adopted, uint64_t size) noexcept;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

// One allocation per fresh tensor: the storage lives inside the impl that
// created it, and `storage` points at it. A view (reshape, permute,
// transpose, slice) has no `owned`; `base` keeps the root owner alive (a view
// of a view points at the root, never at the intermediate view) and
// `storage` points at the root's storage.
struct TensorImpl {
  // User-provided, so make_shared does not zero the whole object first.
  TensorImpl() noexcept {}
  // A fresh owner: allocates `bytes` on (backend, device), contiguous strides.
  TensorImpl(const std::shared_ptr<BackendImpl>& backend, int32_t device, uint64_t bytes, const Shape& shape_,
             DType dtype_);

  std::optional<Storage> owned;
  std::shared_ptr<const TensorImpl> base;  // the root owner of *storage; null for an owner
  Storage* storage = nullptr;              // &*owned, or &*base->owned
  Shape shape;
  Shape strides;  // in elements
  uint64_t byte_offset = 0;
  DType dtype = DType::f32;
  std::optional<DistributedParams> distributed;
  // Autodiff: the leaf node (require_grad) or the node of the op that made
  // this tensor; null when it does not require grad. Never copied to views.
  std::shared_ptr<GradNode> grad_node;
};

// Row-major strides for `shape`.
Shape contiguous_strides(const Shape& shape);
// Validates a user-given shape (non-negative extents, no overflow of the
// byte size) and returns its element count.
int64_t checked_numel(const Shape& shape, DType dtype, std::string_view what);
// Allocates an uninitialised contiguous tensor on (backend, device). Every
// tensor the core creates on a device (ops, to(), copy-in import) passes
// here, so this is where the dtype flag is enforced: Errc::capability_missing
// when the device lacks the dtype's flag. `api` names the caller in errors.
std::shared_ptr<TensorImpl> allocate_tensor(const std::shared_ptr<BackendImpl>& backend, int32_t device,
                                            const Shape& shape, DType dtype,
                                            std::string_view api = "allocate");
// A bp_tensor describing `t` (borrows t's shape and strides).
inline bp_tensor describe(const TensorImpl& t) noexcept {
  bp_tensor d;
  d.buffer = t.storage->buffer;
  d.byte_offset = t.byte_offset;
  d.device = t.storage->device;
  d.dtype = static_cast<int32_t>(t.dtype);
  d.ndim = t.shape.rank();
  d.reserved_ = 0;
  d.shape = t.shape.data();
  d.strides = t.strides.data();
  return d;
}
// True when t's elements lie densely in row-major order from byte_offset
// (strides of extent-1 dims are ignored; an empty tensor is contiguous).
bool is_contiguous(const TensorImpl& t) noexcept;
// An empty TensorImpl (no storage yet) from the per-thread pool every op's
// output comes from: for views and replicas, which the caller fills in.
std::shared_ptr<TensorImpl> new_impl();
// A view of `t`'s storage with the given layout, keeping the root owner alive.
std::shared_ptr<TensorImpl> make_view(const std::shared_ptr<TensorImpl>& t, const Shape& shape,
                                      const Shape& strides, uint64_t byte_offset);

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_TENSOR_TENSOR_IMPL_HPP_
