// Tensor handles: allocation through the plugin, host transfer, metadata.
#include "internal.hpp"
#include "op_common.hpp"

#include <backplane/log.hpp>
#include <backplane/ops.hpp>
#include <backplane/tensor.hpp>

#include <cstring>
#include <limits>

namespace backplane {
namespace detail {

namespace {

// The failure halves of the per-op allocation path, out of line so the
// success path stays small enough to inline. alloc_failed: a non-NULL status
// (thrown unless its code is OK), then a missing buffer.
[[gnu::cold, gnu::noinline]] void alloc_failed(const BackendImpl& backend, int32_t dev, uint64_t size, bp_status* st,
                                               bool no_buffer) {
  if (st != nullptr) backend.check(st, "buffer_alloc of " + std::to_string(size) + " bytes on " + backend.device_id(dev));
  if (no_buffer)
    throw Error(Errc::device_error, "backend \"" + backend.name + "\": buffer_alloc of " + std::to_string(size) +
                                        " bytes succeeded but returned no buffer");
}

[[gnu::cold, gnu::noinline]] void free_failed(const BackendImpl& backend, int32_t dev, bp_status* st) noexcept {
  // A destructor cannot throw: the failure is logged (abi.h: "the host logs a failure").
  try {
    backend.check(st, "buffer_free on " + backend.device_id(dev));
  } catch (const Error& e) {
    try {
      log(LogLevel::warning, e.message());
    } catch (...) {  // a throwing log handler loses the message, not the process
    }
  }
}

}  // namespace

Storage::Storage(std::shared_ptr<BackendImpl> b, int32_t dev, uint64_t size)
    : backend(std::move(b)), nbytes(size), device(dev) {
  bp_buffer_alloc_args args{};
  args.struct_size = sizeof(args);
  args.plugin = backend->plugin;
  args.device = dev;
  args.size = size;
  bp_status* st = backend->api.buffer_alloc(&args);
  if (st != nullptr || args.buffer == nullptr) [[unlikely]]
    alloc_failed(*backend, dev, size, st, args.buffer == nullptr);
  buffer = args.buffer;
}

Storage::Storage(std::shared_ptr<BackendImpl> b, int32_t dev, bp_buffer* adopted, uint64_t size) noexcept
    : backend(std::move(b)), buffer(adopted), nbytes(size), device(dev) {}

Storage::~Storage() {
  bp_buffer_free_args args{};
  args.struct_size = sizeof(args);
  args.plugin = backend->plugin;
  args.buffer = buffer;
  bp_status* st = backend->api.buffer_free(&args);
  if (st != nullptr) [[unlikely]]
    free_failed(*backend, device, st);
}

Shape contiguous_strides(const Shape& shape) {
  Shape s = shape;
  int64_t acc = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

namespace {

[[noreturn, gnu::cold, gnu::noinline]] void unknown_dtype(DType dtype, std::string_view what) {
  throw Error(Errc::invalid_argument,
              std::string(what) + ": unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

// The first negative extent, or else the overflow of the byte size.
[[noreturn, gnu::cold, gnu::noinline]] void bad_shape(const Shape& shape, DType dtype, std::string_view what) {
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] < 0)
      throw Error(Errc::invalid_argument, std::string(what) + ": shape " + shape.to_string() +
                                              " has a negative extent at dim " + std::to_string(i));
  }
  throw Error(Errc::invalid_argument, std::string(what) + ": shape " + shape.to_string() + " of " +
                                          std::string(to_string(dtype)) + " overflows the addressable size");
}

// checked_numel's body, inlined into allocate_tensor (every op's output).
[[gnu::always_inline]] inline int64_t numel_or_throw(const Shape& shape, DType dtype, std::string_view what) {
  const std::size_t elem = bp_dtype_size(static_cast<int32_t>(dtype));  // inline: on every op's path
  if (elem == 0) [[unlikely]]
    unknown_dtype(dtype, what);
  // Overflow is checked with the builtins rather than divisions: this runs on
  // every op's output and a 64-bit division costs tens of cycles.
  int64_t n = 1;
  bool negative = false, overflow = false, zero = false;
  for (int i = 0; i < shape.rank(); ++i) {
    negative |= shape[i] < 0;
    zero |= shape[i] == 0;
    overflow |= __builtin_mul_overflow(n, shape[i], &n);
  }
  if (negative) [[unlikely]]
    bad_shape(shape, dtype, what);
  if (zero) return 0;  // any zero extent: no elements, whatever the others
  int64_t bytes = 0;
  overflow |= __builtin_mul_overflow(n, static_cast<int64_t>(elem), &bytes);
  if (overflow) [[unlikely]]
    bad_shape(shape, dtype, what);
  return n;
}

}  // namespace

int64_t checked_numel(const Shape& shape, DType dtype, std::string_view what) {
  return numel_or_throw(shape, dtype, what);
}

TensorImpl::TensorImpl(const std::shared_ptr<BackendImpl>& backend, int32_t device, uint64_t bytes,
                       const Shape& shape_, DType dtype_)
    : owned(std::in_place, backend, device, bytes),
      storage(&*owned),
      shape(shape_),
      strides(contiguous_strides(shape_)),
      dtype(dtype_) {}

std::shared_ptr<TensorImpl> allocate_tensor(const std::shared_ptr<BackendImpl>& backend, int32_t device,
                                            const Shape& shape, DType dtype, std::string_view api) {
  // Output shapes computed by ops (broadcast, matmul) are checked here too.
  const uint64_t bytes =
      static_cast<uint64_t>(numel_or_throw(shape, dtype, api)) * bp_dtype_size(static_cast<int32_t>(dtype));
  // The dtype rule of abi.h: a device holds only the dtypes it flags. One
  // check here covers creation, every op's output, to() and copy-in import.
  if (!backend->holds(device, dtype)) [[unlikely]]
    backend->require_dtype_capability(device, dtype, api);
  return std::make_shared<TensorImpl>(backend, device, bytes, shape, dtype);
}

bool is_contiguous(const TensorImpl& t) noexcept {
  if (t.shape.numel() == 0) return true;
  int64_t expected = 1;
  for (int i = t.shape.rank() - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

std::shared_ptr<TensorImpl> make_view(const std::shared_ptr<TensorImpl>& t, const Shape& shape, const Shape& strides,
                                      uint64_t byte_offset) {
  auto v = std::make_shared<TensorImpl>();
  v->base = t->base ? t->base : std::shared_ptr<const TensorImpl>(t);
  v->storage = t->storage;
  v->shape = shape;
  v->strides = strides;
  v->byte_offset = byte_offset;
  v->dtype = t->dtype;
  return v;
}

}  // namespace detail

Tensor Tensor::empty(const Device& device, const Shape& shape, DType dtype) {
  const auto& backend = detail::usable(device, "Tensor::empty");
  detail::checked_numel(shape, dtype, "Tensor::empty");
  return Tensor(detail::allocate_tensor(backend, device.index(), shape, dtype, "Tensor::empty"));
}

Tensor Tensor::from_bytes(const Device& device, const Shape& shape, DType dtype, const void* data, std::size_t count) {
  const auto& backend = detail::usable(device, "Tensor::from_vector");
  const int64_t n = detail::checked_numel(shape, dtype, "Tensor::from_vector");
  if (static_cast<uint64_t>(n) != count) {
    throw Error(Errc::invalid_argument, "Tensor::from_vector: shape " + shape.to_string() + " holds " + std::to_string(n) +
                                            " elements but " + std::to_string(count) + " values were given");
  }
  auto t = detail::allocate_tensor(backend, device.index(), shape, dtype, "Tensor::from_vector");
  const uint64_t bytes = t->storage->nbytes;
  if (bytes > 0) backend->write(t->storage->buffer, 0, data, bytes, "buffer_write to " + device.id());
  return Tensor(std::move(t));
}

const detail::TensorImpl& Tensor::checked() const {
  if (!impl_) throw Error(Errc::invalid_argument, "use of an undefined Tensor (default-constructed or moved-from)");
  return *impl_;
}

const Shape& Tensor::shape() const { return checked().shape; }
const Shape& Tensor::strides() const { return checked().strides; }
DType Tensor::dtype() const { return checked().dtype; }
Device Tensor::device() const {
  const auto& s = *checked().storage;
  return Device(s.backend, s.device);
}
bool Tensor::is_contiguous() const { return detail::is_contiguous(checked()); }

Tensor Tensor::to(const Device& device) const {
  checked();
  return backplane::to(*this, device);
}

void Tensor::read_into(DType dtype, void* dst, std::size_t count) const {
  const auto& t = checked();
  if (dtype != t.dtype) {
    throw Error(Errc::dtype_mismatch, "Tensor::to_vector: the tensor holds " + std::string(backplane::to_string(t.dtype)) +
                                          " but " + std::string(backplane::to_string(dtype)) + " was requested");
  }
  if (count != static_cast<std::size_t>(t.shape.numel())) {
    throw Error(Errc::invalid_argument, "Tensor::read_into: destination holds " + std::to_string(count) +
                                            " elements, the tensor " + std::to_string(t.shape.numel()));
  }
  if (count == 0) return;
  if (!is_contiguous()) {
    Tensor(detail::copy_contiguous(t, "Tensor::to_vector")).read_into(dtype, dst, count);  // records no graph
    return;
  }
  const auto& s = *t.storage;
  // buffer_read synchronises an async device itself (abi.h).
  s.backend->read(s.buffer, t.byte_offset, dst, static_cast<uint64_t>(count) * dtype_size(dtype),
                  "buffer_read from " + s.backend->device_id(s.device));
}

std::string Tensor::to_string() const {
  if (!impl_) return "Tensor(undefined)";
  return "Tensor(shape=" + impl_->shape.to_string() + ", dtype=" + std::string(backplane::to_string(impl_->dtype)) +
         ", device=" + device().id() + ")";
}

}  // namespace backplane
