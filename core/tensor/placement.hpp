// Op placement: where one op runs. A device that lacks an (op, dtype), the
// 'matmul' flag or a dtype's flag sends that op to its backend's op_fallback
// (device 0 of "host:<backend>"); the result still belongs to the device the
// user asked for (Storage::home) while its bytes stay on the fallback device
// until an op or a read needs them elsewhere.
//
// Cost model: the fast path (every operand's bytes on its own device, which
// runs the op and holds the result's dtype) is a few loads and compares, no allocation, nothing locked.
// Everything else is out of line in placement.cpp: the decision, copies (or zero-copy imports between
// host_visible devices) of operands, the report's counters.
#ifndef BACKPLANE_CORE_PLACEMENT_HPP_
#define BACKPLANE_CORE_PLACEMENT_HPP_

#include "tensor/op_common.hpp"

#include <bit>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace backplane::detail {

// The slow path's state: made only for an op that is not on the fast path.
// Held inside the Placement (no allocation); `exec` and `home` point at
// shared_ptrs that outlive the op (an operand's storage, the creation op's
// backend, or the fallback target kept by OpFallbackState).
struct PlacedState {
  static constexpr int kInline = 4;                    // operands held inline; cat's longer lists take `more`
  const std::shared_ptr<BackendImpl>* exec = nullptr;  // runs the op
  const std::shared_ptr<BackendImpl>* home = nullptr;  // the device the user asked for
  int32_t home_device = 0;
  int32_t op = 0;
  DType dtype = DType::f32;
  bool placed = false;  // exec is not home: the op fell back
  bool timed = false;   // a placed op whose time the report samples (start is set)
  uint8_t held = 0;     // bit i: inline operand i is constructed
  uint8_t lent = 0;     // bit i: operand i is lent_operands[i], an import its storage keeps (no count)
  std::chrono::steady_clock::time_point start;
  std::unique_ptr<std::shared_ptr<const TensorImpl>[]> more;  // operands kInline.. when n > kInline
  const TensorImpl* lent_operands[kInline];

  // Constructed only when set: a placed op with one replica pays for one
  // shared_ptr, not for zeroing all of them (a few ns on every placed op).
  PlacedState() noexcept {}
  PlacedState(const PlacedState&) = delete;
  PlacedState& operator=(const PlacedState&) = delete;
  ~PlacedState() {
    for (unsigned h = held; h != 0; h &= h - 1) operands[std::countr_zero(h)].~shared_ptr();
  }
  // Operand i's bytes on exec (a replica, or a view of one); null: the
  // caller's operand as it is.
  const TensorImpl* operand(int i) const noexcept {
    if (i >= kInline) return more[static_cast<std::size_t>(i - kInline)].get();
    if ((lent >> i & 1U) != 0) return lent_operands[i];
    return (held >> i & 1U) != 0 ? operands[i].get() : nullptr;
  }
  // Operand i (< kInline) is `v`, which outlives the op without a count.
  void lend_operand(int i, const TensorImpl* v) noexcept {
    lent_operands[i] = v;
    lent = static_cast<uint8_t>(lent | 1U << i);
  }
  void set_operand(int i, std::shared_ptr<const TensorImpl> v) noexcept {
    if (i >= kInline) {
      more[static_cast<std::size_t>(i - kInline)] = std::move(v);
    } else if ((held >> i & 1U) != 0) {
      operands[i] = std::move(v);
    } else {
      new (&operands[i]) std::shared_ptr<const TensorImpl>(std::move(v));
      held = static_cast<uint8_t>(held | 1U << i);
    }
  }

 private:
  union {
    std::shared_ptr<const TensorImpl> operands[kInline];
  };
};

// One op's placement; lives for the op (construct, allocate the result,
// describe the operands, execute). Operands are borrowed: the caller keeps
// them alive until the Placement is gone.
class Placement {
 public:
  // An op on operands[0..n) (n >= 1, one device, checked by the caller with
  // same_device). `dtype` is the dtype supports_op is asked about,
  // `out_dtype` the result's (CAST is also asked about `out_dtype`).
  Placement(int32_t op, DType dtype, DType out_dtype, const char* api, const TensorImpl* const* operands,
            int n)
      : operands_(operands), n_(n) {
    if (!on_own_device(op, dtype, out_dtype)) [[unlikely]]
      place_slow(op, dtype, out_dtype, api, false);
  }
  // An op that writes operands[0] in place (axpby_). Placed by the same
  // rule, but it runs only where its operand 0 is operands[0]'s own memory:
  // on the device holding those bytes, or on one that imports them without a
  // copy (both host_visible). When the rule picks a device that would need a
  // copy, or no device runs the op, ok() is false, nothing was thrown and the
  // op is not counted as a fallback: the caller composes it from others.
  struct InPlace {};
  Placement(InPlace, int32_t op, DType dtype, const char* api, const TensorImpl* const* operands, int n)
      : operands_(operands), n_(n) {
    if (!on_own_device(op, dtype, dtype)) [[unlikely]]
      place_slow(op, dtype, dtype, api, true);
  }
  // A creation op (no operands) on `device` of `backend`.
  Placement(int32_t op, DType dtype, const std::shared_ptr<BackendImpl>& backend, int32_t device,
            const char* api)
      : operands_(nullptr), n_(0) {
    if (backend->support_ready(device, op, static_cast<int32_t>(dtype))) [[likely]] {
      exec_ = &backend;
      device_ = device;
      return;
    }
    place(op, dtype, dtype, api, &backend, device);
  }
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;
  ~Placement() {
    if (state_) [[unlikely]]
      finish();
  }

  // False only for an InPlace op that runs nowhere in place (see there).
  bool ok() const noexcept { return exec_ != nullptr; }
  // The device that runs the op.
  const std::shared_ptr<BackendImpl>& backend() const noexcept { return *exec_; }
  int32_t device() const noexcept { return device_; }
  // Operand i with its bytes on the device that runs the op (the operand
  // itself, or a view of its replica there).
  const TensorImpl& operator[](int i) const noexcept {
    if (state_) [[unlikely]]
      return placed_operand(i);
    return *operands_[i];
  }
  // A fresh contiguous result on the device that runs the op, belonging to
  // the device the user asked for.
  std::shared_ptr<TensorImpl> allocate(const Shape& shape, DType dtype) const {
    auto out = allocate_tensor(*exec_, device_, shape, dtype);
    if (state_) [[unlikely]]
      stamp(*out);
    return out;
  }
  // Runs the op there; a failure on the fallback device names both devices.
  void execute(int32_t op, const bp_tensor* inputs, int32_t num_inputs, const bp_tensor* output,
               const bp_op_attrs* attrs = nullptr) const {
    if (state_) [[unlikely]] {
      execute_placed(op, inputs, num_inputs, output, attrs);
      return;
    }
    detail::execute(**exec_, device_, op, inputs, num_inputs, output, attrs);
  }

 private:
  // The fast path: every operand's bytes on its own device, one device, which
  // runs (op, dtype) and holds out_dtype (the cached answers: a few loads).
  bool on_own_device(int32_t op, DType dtype, DType out_dtype) noexcept {
    const Storage& s = *operands_[0]->storage;
    BackendImpl& b = *s.backend;
    const int32_t d = s.device;
    bool fast =
        s.home == nullptr && b.support_ready(d, op, static_cast<int32_t>(dtype)) && b.holds(d, out_dtype);
    if (op == BP_OP_CAST) fast = fast && b.support_ready(d, op, static_cast<int32_t>(out_dtype));
    for (int i = 1; fast && i < n_; ++i) {
      const Storage& o = *operands_[i]->storage;
      fast = o.backend.get() == &b && o.device == d && o.home == nullptr;
    }
    if (!fast) return false;
    exec_ = &s.backend;
    device_ = d;
    return true;
  }
  void place_slow(int32_t op, DType dtype, DType out_dtype, const char* api, bool in_place) {
    const Storage& s = *operands_[0]->storage;
    place(op, dtype, out_dtype, api, s.home ? &s.home : &s.backend, s.home_index(), in_place);
  }
  // Out of line but not cold: a backend with an op_fallback takes this path
  // on most of its ops, so it is compiled for speed like the rest.
  [[gnu::noinline]] void place(int32_t op, DType dtype, DType out_dtype, const char* api,
                               const std::shared_ptr<BackendImpl>* home, int32_t home_device,
                               bool in_place = false);
  [[gnu::noinline]] void finish() noexcept;
  const TensorImpl& placed_operand(int i) const noexcept;
  void stamp(TensorImpl& out) const;
  void execute_placed(int32_t op, const bp_tensor* inputs, int32_t num_inputs, const bp_tensor* output,
                      const bp_op_attrs* attrs) const;

  const TensorImpl* const* operands_;
  int n_;
  const std::shared_ptr<BackendImpl>* exec_ = nullptr;
  int32_t device_ = 0;
  std::optional<PlacedState> state_;
};

// A fresh contiguous tensor for the device the user named (creation,
// from_vector, to(), copy-in import): on that device when it holds the
// dtype, else held on its op_fallback device for it, else
// Errc::capability_missing naming the flag, backend and device.
std::shared_ptr<TensorImpl> allocate_on(const std::shared_ptr<BackendImpl>& backend, int32_t device,
                                        const Shape& shape, DType dtype, std::string_view api);

// Copies `bytes` from (src, src_offset) to (dst, dst_offset) between any two
// devices: memmove between host-visible ones, buffer_read/buffer_write
// otherwise. Synchronises both devices first. `what` (the caller's name, a
// literal: nothing is built unless a call fails) prefixes errors, which name
// the device that failed.
void copy_bytes(const Storage& src, uint64_t src_offset, const Storage& dst, uint64_t dst_offset,
                uint64_t bytes, std::string_view what);

// x's bytes on (backend, device): x itself when they are there, else a view
// of x's replica there (made on demand). Counted in the fallback report as
// a move of the op that made them; a trace names `needed_by` as the one that
// needed the copy.
std::shared_ptr<const TensorImpl> bytes_on(const std::shared_ptr<TensorImpl>& x,
                                           const std::shared_ptr<BackendImpl>& backend, int32_t device,
                                           const char* needed_by);

// True when BACKPLANE_OP_FALLBACK=error: every op fallback is off.
bool op_fallback_disabled() noexcept;
// What turns op fallback off for this thread now ("BACKPLANE_OP_FALLBACK=error",
// "an OpFallbackOff on this thread"), or nullptr.
const char* op_fallback_off_reason() noexcept;

// ---- the one rule ----------------------------------------------------------------
// "Does device d run op o on dtype t, and if not, where does it run?" is
// answered here and nowhere else: Placement (dispatch), allocate_on,
// training_support's pre-check (core/autograd/requirements.cpp), the report
// and the errors all ask lacks() and op_fallback_host().

// What a device lacks to run an op; none(): it runs it.
struct Lack {
  bool not_loaded = false;   // the backend did not load, or there is no such device
  bool matmul = false;       // MATMUL on a device without the 'matmul' flag (abi.h's matmul rule)
  uint32_t dtypes = 0;       // bit t: no flag for dtype t (abi.h's dtype rule)
  bool unsupported = false;  // supports_op says no (asked only about dtypes the device holds)
  bool none() const noexcept { return !not_loaded && !matmul && dtypes == 0 && !unsupported; }
  // "no 'matmul' flag, no 'f64' flag; supports_op says no too", "not supported", "not loaded", "".
  std::string text() const;
};

// What device d of b lacks to run `op` on `dtype` (what supports_op is asked
// about) with a result of `out_dtype` (CAST is asked about it too) and
// operands of `operands`.
Lack lacks(BackendImpl& b, int32_t d, int32_t op, DType dtype, DType out_dtype,
           std::span<const DType> operands = {});

// The device-0 backend b's ops fall back to now, or null: no op_fallback,
// BACKPLANE_OP_FALLBACK=error, an OpFallbackOff on this thread, or a target
// that failed to load or has no device. Loads an optional target on first use.
std::shared_ptr<BackendImpl> op_fallback_host(const BackendImpl& b);

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_PLACEMENT_HPP_
