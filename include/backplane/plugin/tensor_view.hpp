// A validated view of a bp_tensor for plugins whose buffers the plugin can
// address (host memory, or device memory it indexes itself), plus the
// byte-size arithmetic every plugin needs.
//
// The host validates every request before it crosses the ABI (abi.h, "Trust
// contract"), so an in-process plugin need not re-check shapes. make_view()
// still checks what is cheap and what a wrong view would turn into memory
// corruption: the dtype the op expects, ndim, alignment, and that every
// element the view can reach lies inside the buffer. It runs in O(ndim) and
// builds no string unless it fails.
#ifndef BACKPLANE_PLUGIN_TENSOR_VIEW_HPP_
#define BACKPLANE_PLUGIN_TENSOR_VIEW_HPP_

#include <backplane/abi.h>
#include <backplane/plugin/dtype.hpp>
#include <backplane/plugin/status.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace backplane::plugin {

// The most dimensions a view may have; the host's own limit is lower
// (Shape::kMaxRank), so every view the host sends fits.
inline constexpr int kMaxDims = 64;

// ---- byte-size arithmetic (overflow-checked; nullopt on overflow) ---------

inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) noexcept {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) noexcept {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
// Elements of a shape; nullopt for a negative extent or an overflow.
inline std::optional<int64_t> element_count(int32_t ndim, const int64_t* shape) noexcept {
  int64_t n = 1;
  for (int32_t d = 0; d < ndim; ++d)
    if (shape[d] < 0 || __builtin_mul_overflow(n, shape[d], &n)) return std::nullopt;
  return n;
}
// Bytes of a dense tensor of `shape` and `dtype`; nullopt on overflow or an unknown dtype.
inline std::optional<uint64_t> dense_bytes(int32_t ndim, const int64_t* shape, int32_t dtype) noexcept {
  const auto n = element_count(ndim, shape);
  const size_t size = bp_dtype_size(dtype);
  if (!n || size == 0) return std::nullopt;
  return checked_mul(static_cast<uint64_t>(*n), size);
}
// True when [offset, offset + size) lies inside a buffer of `capacity` bytes.
inline bool range_inside(uint64_t offset, uint64_t size, uint64_t capacity) noexcept {
  return offset <= capacity && size <= capacity - offset;
}

// "[2,3,4]"
inline std::string describe_shape(int32_t ndim, const int64_t* values) {
  std::string s = "[";
  for (int32_t d = 0; d < ndim; ++d) {
    if (d > 0) s += ",";
    s += std::to_string(values[d]);
  }
  return s + "]";
}

// Which operand a message is about: inputs[1], outputs[0].
struct Role {
  const char* list;  // "inputs" or "outputs"
  int index;
  std::string to_string() const { return std::string(list) + "[" + std::to_string(index) + "]"; }
};

// A view of a tensor's elements in memory the plugin addresses.
struct TensorView {
  unsigned char* data = nullptr;  // element [0, ..., 0]; meaningful only when numel > 0
  int64_t numel = 0;
  uintptr_t first = 0;  // bytes the view touches: [first, last); both 0 when numel == 0
  uintptr_t last = 0;
  int32_t ndim = 0;
  int32_t dtype = BP_DTYPE_INVALID;
  int32_t element_size = 0;
  const int64_t* shape = nullptr;    // borrowed from the bp_tensor
  const int64_t* strides = nullptr;  // in elements
  bool contiguous = true;            // row-major dense (dimensions of extent 1 ignored)
  bool scalar = true;                // every stride 0 (or extent 1): one element broadcast

  template <class T>
  T* as() const noexcept {
    return reinterpret_cast<T*>(data);
  }
  // True when the two views can touch a common byte.
  bool overlaps(const TensorView& o) const noexcept {
    return numel > 0 && o.numel > 0 && first < o.last && o.first < last;
  }
  // True when both views address exactly the same elements in the same order.
  bool same_elements(const TensorView& o) const noexcept {
    if (data != o.data || ndim != o.ndim || element_size != o.element_size) return false;
    for (int32_t d = 0; d < ndim; ++d)
      if (shape[d] != o.shape[d] || (shape[d] != 1 && strides[d] != o.strides[d])) return false;
    return true;
  }
  bool same_shape(const TensorView& o) const noexcept {
    if (ndim != o.ndim) return false;
    for (int32_t d = 0; d < ndim; ++d)
      if (shape[d] != o.shape[d]) return false;
    return true;
  }
  std::string shape_string() const { return describe_shape(ndim, shape); }
};

enum class ViewError {
  none,
  dtype,
  ndim,
  null_arrays,
  misaligned,
  negative_extent,
  count_overflow,
  out_of_bounds
};

namespace detail {

// The checks of check_view one at a time, in their order, naming the first
// that fails: the cold half, run only once the fast pass has found a fault.
[[gnu::cold, gnu::noinline]] inline ViewError classify_view(const bp_tensor& t, int32_t dtype) noexcept {
  if (t.dtype != dtype) return ViewError::dtype;
  const int esize = static_cast<int>(bp_dtype_size(dtype));
  if (esize == 0) return ViewError::dtype;
  if (t.ndim < 0 || t.ndim > kMaxDims) return ViewError::ndim;
  if (t.ndim > 0 && (t.shape == nullptr || t.strides == nullptr)) return ViewError::null_arrays;
  if ((t.byte_offset & static_cast<uint64_t>(esize - 1)) != 0) return ViewError::misaligned;
  int64_t numel = 1;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] < 0) return ViewError::negative_extent;
    if (__builtin_mul_overflow(numel, t.shape[d], &numel)) return ViewError::count_overflow;
  }
  return ViewError::out_of_bounds;
}

}  // namespace detail

// The checks of make_view without building a message (this runs for every
// operand of every op). `base`/`capacity`: the buffer's memory and size.
// Faults are gathered into flags, so the accepted case (all of them, in
// practice) takes one branch per phase; which check failed is worked out
// afterwards (detail::classify_view).
// Always inlined: where the caller's dtype is a constant, the element size
// and the alignment mask fold away and the view's fields stay in registers.
[[gnu::always_inline]] inline ViewError check_view(const bp_tensor& t, int32_t dtype, unsigned char* base,
                                                   uint64_t capacity, TensorView& v) noexcept {
  const int esize = static_cast<int>(bp_dtype_size(dtype));
  const int32_t ndim = t.ndim;
  const int64_t* shape = t.shape;
  const int64_t* strides = t.strides;
  const uint64_t offset = t.byte_offset;
  // dtype, ndim in 0..kMaxDims, the arrays present, the offset aligned: the
  // loop below reads the arrays, so these are settled first.
  if ((t.dtype != dtype) | (esize == 0) | (static_cast<uint32_t>(ndim) > static_cast<uint32_t>(kMaxDims)) |
      (ndim > 0 && (shape == nullptr || strides == nullptr)) |
      ((offset & static_cast<uint64_t>(esize - 1)) != 0)) [[unlikely]] {
    v = TensorView{};  // every path writes all of v before any call: a caller's own initialisation folds away
    return detail::classify_view(t, dtype);
  }

  // numel and the layout flags. Locals, not v's fields: stores through v
  // could alias shape/strides and force reloads.
  int64_t numel = 1;
  bool contiguous = true;
  bool scalar = true;
  bool bad = false;  // a negative extent or an element count overflow
  for (int32_t d = ndim - 1; d >= 0; --d) {
    const int64_t n = shape[d];
    const int64_t stride = strides[d];
    bad |= n < 0;
    if (n != 1) {
      contiguous = contiguous && stride == numel;
      scalar = scalar && stride == 0;
    }
    bad |= __builtin_mul_overflow(numel, n, &numel);
  }
  if (bad) [[unlikely]] {
    v = TensorView{};
    return detail::classify_view(t, dtype);
  }
  v = TensorView{base, numel, 0, 0, ndim, dtype, esize, shape, strides, contiguous, scalar};
  if (numel == 0) return ViewError::none;

  // The bytes the view reaches, [first, last). Row-major dense reaches exactly
  // numel elements from the offset; any other layout (strides may be
  // negative) is walked once more for its lowest and highest element.
  int64_t first = static_cast<int64_t>(offset);
  int64_t last = 0;
  bool overflow = false;
  if (contiguous) [[likely]] {
    overflow = __builtin_mul_overflow(numel, static_cast<int64_t>(esize), &last) ||
               __builtin_add_overflow(last, static_cast<int64_t>(offset), &last);
  } else {
    int64_t low = 0;
    int64_t high = 0;
    for (int32_t d = ndim - 1; d >= 0; --d) {
      int64_t span = 0;
      overflow |= __builtin_mul_overflow(shape[d] - 1, strides[d], &span);  // shape[d] >= 1: numel > 0
      // Two plain branches: selecting the address (&low or &high) would force both
      // into memory on every dimension.
      if (span < 0)
        overflow |= __builtin_add_overflow(low, span, &low);
      else
        overflow |= __builtin_add_overflow(high, span, &high);
    }
    overflow |= __builtin_mul_overflow(low, esize, &first) ||
                __builtin_add_overflow(first, static_cast<int64_t>(offset), &first);
    overflow |= __builtin_add_overflow(high, 1, &last) || __builtin_mul_overflow(last, esize, &last) ||
                __builtin_add_overflow(last, static_cast<int64_t>(offset), &last);
  }
  if (overflow || first < 0 || static_cast<uint64_t>(last) > capacity) [[unlikely]]
    return ViewError::out_of_bounds;
  // Through uintptr_t: pointer arithmetic here makes GCC 12 warn (-Warray-bounds)
  // when this is inlined over a small array, though the range was checked above.
  v.data = reinterpret_cast<unsigned char*>(reinterpret_cast<uintptr_t>(base) + offset);
  v.first = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(first);
  v.last = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(last);
  return ViewError::none;
}

[[noreturn, gnu::cold, gnu::noinline]] inline void view_fail(ViewError error, const bp_tensor& t,
                                                             const char* what, Role role, int32_t dtype,
                                                             uint64_t capacity) {
  const std::string where = std::string(what) + ": " + role.to_string() + ": ";
  switch (error) {
    case ViewError::dtype:
      if (bp_dtype_size(dtype) == 0)
        fail(BP_STATUS_UNSUPPORTED,
             where + "dtype " + dtype_name(dtype) + " is not one this plugin was built with");
      fail(BP_STATUS_INVALID_ARGUMENT,
           where + "dtype " + dtype_name(t.dtype) + " differs from the expected " + dtype_name(dtype));
    case ViewError::ndim:
      fail(BP_STATUS_INVALID_ARGUMENT,
           where + "ndim " + std::to_string(t.ndim) + " is outside 0.." + std::to_string(kMaxDims));
    case ViewError::null_arrays:
      fail(BP_STATUS_INVALID_ARGUMENT, where + "shape or strides is NULL");
    case ViewError::misaligned:
      fail(BP_STATUS_INVALID_ARGUMENT,
           where + "byte_offset " + std::to_string(t.byte_offset) + " is not a multiple of the element size");
    case ViewError::negative_extent:
      fail(BP_STATUS_INVALID_ARGUMENT,
           where + "shape " + describe_shape(t.ndim, t.shape) + " has a negative extent");
    case ViewError::count_overflow:
      fail(BP_STATUS_INVALID_ARGUMENT,
           where + "shape " + describe_shape(t.ndim, t.shape) + ": element count overflows");
    case ViewError::out_of_bounds:
      fail(BP_STATUS_INVALID_ARGUMENT, where + "shape " + describe_shape(t.ndim, t.shape) + ", strides " +
                                           describe_shape(t.ndim, t.strides) + " at byte_offset " +
                                           std::to_string(t.byte_offset) + " reach outside the buffer of " +
                                           std::to_string(capacity) + " bytes");
    case ViewError::none:
      break;
  }
  fail(BP_STATUS_INTERNAL, where + "unexpected view error");
}

// A checked view of `t` over a buffer at `base` of `capacity` bytes, whose
// dtype must be `dtype`. `what` names the op for messages ("add").
inline TensorView make_view(const bp_tensor& t, int32_t dtype, unsigned char* base, uint64_t capacity,
                            const char* what, Role role) {
  TensorView v;
  const ViewError error = check_view(t, dtype, base, capacity, v);
  if (error != ViewError::none) [[unlikely]]
    view_fail(error, t, what, role, dtype, capacity);
  return v;
}

}  // namespace backplane::plugin

#endif  // BACKPLANE_PLUGIN_TENSOR_VIEW_HPP_
