// DLPack export (to_dlpack) and import (from_dlpack); see dlpack.hpp for the
// contract. Export shares the buffer where buffer_pointer says it lives;
// import adopts producer memory through the plugin's buffer_import, whose
// release callback runs the producer's deleter. The plugin owns the memory
// only once buffer_import succeeds; after a failure the host still does.
#include <backplane/dlpack.hpp>

#include <dlpack/dlpack.h>

#include "tensor/dlpack_dtype.hpp"
#include "tensor/placement.hpp"
#include "tensor/tensor_impl.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#if defined(DLPACK_VERSION) && DLPACK_VERSION < 60
#error "backplane needs DLPack >= 0.6 (Debian: libdlpack-dev)"
#endif

namespace backplane {

namespace detail {

DLDataType to_dl_dtype(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return {kDLFloat, 16, 1};
    case DType::f32:
      return {kDLFloat, 32, 1};
    case DType::f64:
      return {kDLFloat, 64, 1};
    case DType::bf16:
      return {kDLBfloat, 16, 1};
    case DType::i8:
      return {kDLInt, 8, 1};
    case DType::i32:
      return {kDLInt, 32, 1};
    case DType::i64:
      return {kDLInt, 64, 1};
    case DType::u8:
      return {kDLUInt, 8, 1};
    case DType::bool_:
      return {kDLUInt, 8, 1};  // DLPack 0.6 has no boolean code
  }
  throw Error(Errc::internal,
              "to_dlpack: the tensor has an unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace detail

namespace {

using detail::to_dl_dtype;

// kDLBool, added in DLPack 0.8; absent from the 0.6 header this builds against.
constexpr uint8_t kDLBoolCode = 6;

// Host copies are aligned as dlpack.h asks of `data` ("aligned to 256 bytes").
constexpr std::size_t kHostCopyAlignment = 256;

struct FreeDeleter {
  void operator()(void* p) const noexcept { std::free(p); }
};

// Owns everything a DLManagedTensor from to_dlpack points to: its shape and
// strides arrays, and either a reference to the tensor (zero-copy) or the host
// copy. `managed.manager_ctx` points back at this object.
struct ExportContext {
  std::shared_ptr<const detail::TensorImpl> keep;  // zero-copy: keeps the storage alive
  std::unique_ptr<void, FreeDeleter> copy;         // host copy: the bytes
  DType dtype = DType::f32;                        // restores bool on re-import
  int64_t shape[Shape::kMaxRank] = {};
  int64_t strides[Shape::kMaxRank] = {};
  // The allocation `data` points into (the storage's buffer, or the copy):
  // on re-import, the one case where the producer's allocation is known.
  uintptr_t alloc_begin = 0;
  uint64_t alloc_bytes = 0;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* self) noexcept {
  if (self == nullptr) return;
  std::unique_ptr<ExportContext>(static_cast<ExportContext*>(self->manager_ctx));
}

bool is_ours(const DLManagedTensor* m) noexcept { return m->deleter == &delete_export; }

std::string describe_dl_dtype(const DLDataType& d) {
  return "{code " + std::to_string(d.code) + ", bits " + std::to_string(d.bits) + ", lanes " +
         std::to_string(d.lanes) + "}";
}

DType from_dl_dtype(const DLManagedTensor* m) {
  const DLDataType& d = m->dl_tensor.dtype;
  const auto unsupported = [&](const std::string& why) -> Error {
    return Error(Errc::dtype_mismatch, "from_dlpack: dl_tensor.dtype " + describe_dl_dtype(d) + ": " + why +
                                           " (backplane takes f16/f32/f64, bf16, i8/i32/i64, u8 and bool, "
                                           "lanes 1); cast it on the producer's side first");
  };
  if (d.lanes != 1) throw unsupported("vector lanes are not supported");
  switch (d.code) {
    case kDLFloat:
      if (d.bits == 16) return DType::f16;
      if (d.bits == 32) return DType::f32;
      if (d.bits == 64) return DType::f64;
      break;
    case kDLBfloat:
      if (d.bits == 16) return DType::bf16;
      break;
    case kDLInt:
      if (d.bits == 8) return DType::i8;
      if (d.bits == 32) return DType::i32;
      if (d.bits == 64) return DType::i64;
      break;
    case kDLUInt:
      if (d.bits == 8) {
        // Our own export of a bool tensor comes back as bool.
        if (is_ours(m) && m->manager_ctx != nullptr &&
            static_cast<const ExportContext*>(m->manager_ctx)->dtype == DType::bool_)
          return DType::bool_;
        return DType::u8;
      }
      break;
    case kDLBoolCode:
      if (d.bits == 8) return DType::bool_;
      break;
    default:
      throw unsupported("unknown or unsupported type code");
  }
  throw unsupported("unsupported width for this type code");
}

// Owns an imported DLManagedTensor until release(): runs its deleter once.
class Adopted {
 public:
  explicit Adopted(DLManagedTensor* m) noexcept : m_(m) {}
  Adopted(const Adopted&) = delete;
  Adopted& operator=(const Adopted&) = delete;
  ~Adopted() {
    if (m_ != nullptr && m_->deleter != nullptr) m_->deleter(m_);
  }
  DLManagedTensor* release() noexcept { return std::exchange(m_, nullptr); }

 private:
  DLManagedTensor* m_;
};

// The release callback given to buffer_import, with the DLManagedTensor as
// its release_ctx. abi.h passes ownership to the plugin only on success, so
// release runs only for an imported buffer, once, when the plugin frees it.
void release_import(void* ctx) noexcept {
  auto* m = static_cast<DLManagedTensor*>(ctx);
  if (m->deleter != nullptr) m->deleter(m);
}

bool is_host_memory(int32_t type) noexcept {
  return type == kDLCPU || type == kDLCUDAHost || type == kDLROCMHost;
}

const std::shared_ptr<detail::BackendImpl>& usable(const Device& device, const char* what) {
  if (!device.valid())
    throw Error(Errc::invalid_argument, std::string(what) + ": invalid (default-constructed) Device");
  detail::Access::impl(device)->require_loaded();
  return detail::Access::impl(device);
}

// The element range a strided layout reaches, relative to element [0,...,0]:
// [low, high] in elements (low <= 0 <= high; negative strides lower `low`).
// Every element's offset sum(index[d] * strides[d]) lies in [low, high], so
// once this succeeds no partial sum of a walk over the layout overflows.
// Assumes numel > 0.
struct Extent {
  int64_t low = 0;
  int64_t high = 0;
};

bool strided_extent(const Shape& shape, const Shape& strides, Extent& out) noexcept {
  bool overflow = false;
  for (int d = 0; d < shape.rank(); ++d) {
    int64_t span = 0;
    overflow |= __builtin_mul_overflow(shape[d] - 1, strides[d], &span);
    if (span < 0) {
      overflow |= __builtin_add_overflow(out.low, span, &out.low);
    } else {
      overflow |= __builtin_add_overflow(out.high, span, &out.high);
    }
  }
  return !overflow;
}

// The bytes an imported layout reaches: [begin, begin + bytes), which holds
// `elems` elements, element [0,...,0] `below` bytes after begin
// (below = -low * esize). Both the adopt path and the copy path use exactly
// this region.
struct Region {
  uint64_t begin = 0;
  uint64_t bytes = 0;
  uint64_t below = 0;
  int64_t low = 0;
  int64_t high = 0;
  int64_t elems = 0;
};

// Computes the region of (shape, strides) around element0, every step
// overflow-checked; false when it does not fit the address space.
bool layout_region(uint64_t element0, const Shape& shape, const Shape& strides, int64_t esize,
                   Region& out) noexcept {
  Extent extent;
  int64_t elems = 0;
  int64_t bytes = 0;
  int64_t low_bytes = 0;
  if (!strided_extent(shape, strides, extent) || __builtin_sub_overflow(extent.high, extent.low, &elems) ||
      __builtin_add_overflow(elems, 1, &elems) || __builtin_mul_overflow(elems, esize, &bytes) ||
      __builtin_mul_overflow(extent.low, esize, &low_bytes))
    return false;
  // low_bytes is in [-(INT64_MAX - esize), 0], so its negation is representable.
  const uint64_t below = static_cast<uint64_t>(-low_bytes);
  uint64_t end = 0;
  if (below > element0 || __builtin_add_overflow(element0 - below, static_cast<uint64_t>(bytes), &end))
    return false;
  out.begin = element0 - below;
  out.bytes = static_cast<uint64_t>(bytes);
  out.below = below;
  out.low = extent.low;
  out.high = extent.high;
  out.elems = elems;
  return true;
}

// True when `strides` lay `shape` out compact and row-major (extent-1 dims ignored).
bool is_compact(const Shape& shape, const Shape& strides) noexcept {
  int64_t expected = 1;
  for (int d = shape.rank() - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

// Copies a strided host layout into a compact row-major array, element by
// element. Reads only inside `region` (see layout_region): each element's
// offset from element [0,...,0] lies in [region.low, region.high], so its
// position from the region's start, offset - low, is in [0, region.elems).
void gather(const unsigned char* region_begin, const Region& region, const Shape& shape, const Shape& strides,
            std::size_t esize, unsigned char* dst) {
  const int rank = shape.rank();
  int64_t index[Shape::kMaxRank] = {};
  const int64_t n = shape.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < rank; ++d) offset += index[d] * strides[d];
    if (offset < region.low || offset > region.high)
      throw Error(Errc::internal, "from_dlpack: element offset " + std::to_string(offset) +
                                      " lies outside the layout's extent [" + std::to_string(region.low) +
                                      ", " + std::to_string(region.high) + "]");
    const auto position = static_cast<uint64_t>(offset - region.low);
    std::memcpy(dst + static_cast<std::size_t>(i) * esize, region_begin + position * esize, esize);
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& t) {
  if (!t.defined())
    throw Error(Errc::invalid_argument,
                "to_dlpack: the tensor is undefined (default-constructed or moved-from)");
  const detail::TensorImpl& impl = *detail::Access::impl(t);
  const detail::Storage& storage = *impl.storage;
  const auto& backend = storage.backend;
  const int32_t dev = storage.device;
  // The remote rule of abi.h: its memory is on another machine, so there is
  // nothing to share in this process.
  if (backend->has(dev, Capability::remote))
    throw Error(
        Errc::invalid_argument,
        "to_dlpack: " + t.to_string() + " lives on " + backend->device_id(dev) +
            ", a 'remote' device whose memory is on another machine; DLPack shares memory within this "
            "process only: copy it to a local device with to() first");

  auto ctx = std::make_unique<ExportContext>();
  ctx->dtype = impl.dtype;
  const int rank = impl.shape.rank();
  std::copy(impl.shape.begin(), impl.shape.end(), ctx->shape);
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.device = {kDLCPU, 0};
  dl.ndim = rank;
  dl.dtype = to_dl_dtype(impl.dtype);
  dl.shape = ctx->shape;
  dl.strides = ctx->strides;
  dl.byte_offset = 0;

  const std::string what = "to_dlpack of " + t.to_string();
  if (backend->api.buffer_pointer != nullptr && t.numel() > 0) {
    // The async rule: the consumer reads the memory directly, so queued work
    // must have landed (buffer_pointer synchronises too; this says so here).
    backend->synchronize_if_async(dev, what);
    bp_buffer_pointer_args where{};
    where.struct_size = BP_BUFFER_POINTER_ARGS_STRUCT_SIZE;
    where.plugin = backend->plugin;
    where.buffer = storage.buffer;
    backend->check(
        detail::call_entry(*backend, "buffer_pointer", Errc::internal, backend->api.buffer_pointer, &where),
        what + ": buffer_pointer on " + backend->device_id(dev));
    if (where.data == nullptr)
      throw Error(Errc::device_error, "to_dlpack: backend \"" + backend->name +
                                          "\": buffer_pointer returned no address for a live buffer on " +
                                          backend->device_id(dev) + "; the plugin breaks the ABI");
    dl.device = {static_cast<DLDeviceType>(where.dl_device_type), where.dl_device_id};
    std::copy(impl.strides.begin(), impl.strides.end(), ctx->strides);
    dl.data = static_cast<unsigned char*>(where.data) + impl.byte_offset;
    ctx->alloc_begin = reinterpret_cast<uintptr_t>(where.data);
    ctx->alloc_bytes = storage.nbytes;
    ctx->keep = detail::Access::impl(t);
  } else {
    // Not addressable (or empty): a compact host copy.
    const std::size_t bytes = t.nbytes();
    const std::size_t rounded = (bytes / kHostCopyAlignment + 1) * kHostCopyAlignment;  // never 0
    ctx->copy.reset(std::aligned_alloc(kHostCopyAlignment, rounded));
    if (ctx->copy == nullptr)
      throw Error(Errc::out_of_memory, "to_dlpack: cannot allocate a host copy of " + std::to_string(bytes) +
                                           " bytes for " + t.to_string());
    if (t.numel() > 0) t.read_into(impl.dtype, ctx->copy.get(), static_cast<std::size_t>(t.numel()));
    const Shape compact = detail::contiguous_strides(impl.shape);
    std::copy(compact.begin(), compact.end(), ctx->strides);
    dl.data = ctx->copy.get();
    ctx->alloc_begin = reinterpret_cast<uintptr_t>(ctx->copy.get());
    ctx->alloc_bytes = bytes;
  }
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = &delete_export;
  return &ctx.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* m, const Device& device) {
  Adopted owner(m);  // the deleter runs once on every path that does not hand m to the plugin
  if (m == nullptr) throw Error(Errc::invalid_argument, "from_dlpack: the DLManagedTensor is NULL");
  const DLTensor& dl = m->dl_tensor;
  const auto& backend = usable(device, "from_dlpack");
  const int32_t dev = device.index();

  const DType dtype = from_dl_dtype(m);
  const auto esize = static_cast<int64_t>(dtype_size(dtype));
  if (dl.ndim < 0 || dl.ndim > Shape::kMaxRank)
    throw Error(Errc::invalid_argument, "from_dlpack: dl_tensor.ndim is " + std::to_string(dl.ndim) +
                                            "; backplane supports 0 to " + std::to_string(Shape::kMaxRank) +
                                            " dimensions");
  if (dl.ndim > 0 && dl.shape == nullptr)
    throw Error(Errc::invalid_argument,
                "from_dlpack: dl_tensor.shape is NULL with ndim " + std::to_string(dl.ndim));
  const Shape shape(std::span<const int64_t>(dl.shape, static_cast<std::size_t>(dl.ndim)));
  const int64_t numel = detail::checked_numel(shape, dtype, "from_dlpack: dl_tensor.shape");
  const int32_t type = static_cast<int32_t>(dl.device.device_type);
  const bool host_memory = is_host_memory(type);
  if (!host_memory && type != kDLCUDA)
    throw Error(Errc::invalid_argument,
                "from_dlpack: dl_tensor.device.device_type is " + std::to_string(type) +
                    "; backplane imports host memory (kDLCPU, kDLCUDAHost, kDLROCMHost) "
                    "and CUDA memory (kDLCUDA, on a device whose plugin accepts it): "
                    "copy it to the host on the producer's side first");
  // The dtype rule of abi.h: refused before anything is shared or copied.
  backend->require_dtype_capability(dev, dtype, "from_dlpack");

  // Nothing to share in an empty tensor: make a fresh one (the deleter runs now).
  if (numel == 0)
    return detail::Access::make_tensor(detail::allocate_on(backend, dev, shape, dtype, "from_dlpack"));

  if (dl.data == nullptr)
    throw Error(Errc::invalid_argument, "from_dlpack: dl_tensor.data is NULL but the tensor has " +
                                            std::to_string(numel) + " elements");
  const Shape compact = detail::contiguous_strides(shape);
  const Shape strides = dl.strides != nullptr
                            ? Shape(std::span<const int64_t>(dl.strides, static_cast<std::size_t>(dl.ndim)))
                            : compact;

  // The bytes the layout reaches: [region.begin, region.begin + region.bytes),
  // holding element [0,...,0] at element0 = data + byte_offset. Addresses as
  // integers, so that a bad layout is an error rather than pointer overflow.
  uint64_t element0 = 0;
  if (__builtin_add_overflow(reinterpret_cast<uintptr_t>(dl.data), dl.byte_offset, &element0))
    throw Error(Errc::invalid_argument, "from_dlpack: dl_tensor.byte_offset " +
                                            std::to_string(dl.byte_offset) +
                                            " added to dl_tensor.data overflows the address space");
  Region layout;
  if (!layout_region(element0, shape, strides, esize, layout))
    throw Error(Errc::invalid_argument, "from_dlpack: dl_tensor.strides " + strides.to_string() +
                                            " with shape " + shape.to_string() + ", data and byte_offset " +
                                            std::to_string(dl.byte_offset) +
                                            " reach outside the address space");
  const std::string extent_text = "elements [" + std::to_string(layout.low) + ", " +
                                  std::to_string(layout.high) + "] from data + byte_offset (byte_offset " +
                                  std::to_string(dl.byte_offset) + ", " + std::to_string(esize) +
                                  "-byte elements)";
  // The producer's allocation is known only for a tensor to_dlpack made; any
  // other producer's starts at data at the latest (DLPack carries no size),
  // so a layout reaching below data is the producer's error.
  const auto* const ours =
      is_ours(m) && m->manager_ctx != nullptr ? static_cast<const ExportContext*>(m->manager_ctx) : nullptr;
  if (ours != nullptr) {
    const uint64_t alloc_end = ours->alloc_begin + ours->alloc_bytes;
    if (layout.begin < ours->alloc_begin || layout.begin + layout.bytes > alloc_end) {
      // Byte offsets from the allocation's start; the region may begin before it.
      const auto from_alloc = [&](uint64_t address) {
        return address >= ours->alloc_begin ? std::to_string(address - ours->alloc_begin)
                                            : "-" + std::to_string(ours->alloc_begin - address);
      };
      throw Error(Errc::invalid_argument,
                  "from_dlpack: dl_tensor.strides " + strides.to_string() + " with shape " +
                      shape.to_string() + " reach " + extent_text + ", bytes [" + from_alloc(layout.begin) +
                      ", " + from_alloc(layout.begin + layout.bytes) + ") of the exported allocation of " +
                      std::to_string(ours->alloc_bytes) + " bytes, outside the exported allocation");
    }
  } else if (layout.begin < reinterpret_cast<uintptr_t>(dl.data)) {
    throw Error(Errc::invalid_argument,
                "from_dlpack: dl_tensor.strides " + strides.to_string() + " with shape " + shape.to_string() +
                    " reach " + extent_text + ", whose lowest byte lies " +
                    std::to_string(reinterpret_cast<uintptr_t>(dl.data) - layout.begin) +
                    " bytes before dl_tensor.data; DLPack carries no allocation size, so data must be at or "
                    "below every element: point data at the allocation and byte_offset at element [0,...,0]");
  }
  auto* const region = reinterpret_cast<unsigned char*>(layout.begin);
  const int64_t region_elems = layout.elems;
  const auto region_bytes = layout.bytes;
  const uint64_t below = layout.below;
  const bool aligned = element0 % static_cast<uint64_t>(esize) == 0;
  const bool compact_layout = is_compact(shape, strides);

  // The remote rule of abi.h: a remote device is never offered imported
  // memory; host memory is copied to it instead.
  const bool offer =
      backend->api.buffer_import != nullptr && !backend->has(dev, Capability::remote) && aligned;
  const std::string where_from = host_memory ? "host memory" : "CUDA memory (kDLCUDA)";
  std::string refusal;  // the plugin's reason when it refused the memory as unsupported
  if (offer) {
    // Everything that can throw before the plugin owns m happens first.
    // A compact layout is the root tensor itself; any other is a view of a
    // root spanning the region.
    auto root = std::make_shared<detail::TensorImpl>();
    root->dtype = dtype;
    if (compact_layout) {
      root->shape = shape;
      root->strides = compact;
    } else {
      root->shape = Shape{region_elems};
      root->strides = Shape{1};
    }
    const std::string what = "buffer_import of " + std::to_string(region_bytes) + " bytes of " + where_from +
                             " on " + backend->device_id(dev);
    bp_buffer_import_args args{};
    args.struct_size = BP_BUFFER_IMPORT_ARGS_STRUCT_SIZE;
    args.plugin = backend->plugin;
    args.device = dev;
    args.dl_device_type = type;
    args.dl_device_id = dl.device.device_id;
    args.data = region;
    args.size = region_bytes;
    args.release = &release_import;
    args.release_ctx = m;
    // A buffer_import that throws did not succeed: m stays the host's.
    bp_status* st =
        detail::call_entry(*backend, "buffer_import", Errc::internal, backend->api.buffer_import, &args);
    if (st == nullptr) {
      // From here the plugin owns m: release runs the deleter when the buffer is freed.
      owner.release();
      // A plugin that reports success without a buffer broke the ABI; whether
      // it still calls release is unknowable, so m is left to it.
      if (args.buffer == nullptr)
        throw Error(Errc::device_error, "from_dlpack: backend \"" + backend->name + "\": " + what +
                                            " succeeded but returned no buffer");
      root->storage = &root->owned.emplace(backend, dev, args.buffer, region_bytes);
      if (compact_layout) return detail::Access::make_tensor(std::move(root));
      return detail::Access::make_tensor(detail::make_view(root, shape, strides, below));
    }
    // Failed: m stays the host's (the plugin never calls release), and
    // `owner` runs its deleter after the copy below or on the error.
    // UNSUPPORTED: host memory is copied in below; CUDA memory is refused
    // with the plugin's reason. Any other failure is the plugin's error.
    const detail::BackendImpl& b = *backend;
    if (detail::call_entry(b, "status_code", Errc::internal, b.api.status_code, st) != BP_STATUS_UNSUPPORTED)
      b.check(st, "from_dlpack: " + what);
    const char* raw = detail::call_entry(b, "status_message", Errc::internal, b.api.status_message, st);
    refusal = raw != nullptr ? raw : "";
    detail::call_entry(b, "status_free", Errc::internal, b.api.status_free, st);
  }
  if (!host_memory)
    throw Error(
        Errc::invalid_argument,
        "from_dlpack: dl_tensor.device is " + where_from + ", which cannot be imported on " +
            backend->device_id(dev) + ": " +
            (backend->api.buffer_import == nullptr   ? "its plugin has no buffer_import"
             : backend->has(dev, Capability::remote) ? "it is a 'remote' device"
             : !aligned                              ? "data + byte_offset is not aligned to the element size"
                                                     : "its plugin refused it (" + refusal + ")") +
            ", and the host cannot copy device memory; import it on the device it lives on, or copy it "
            "to the host on the producer's side first");

  // Copy in, reading only the region: a compact layout straight from the
  // producer (its region is exactly its numel elements from element0), any
  // other gathered first.
  auto t = detail::allocate_on(backend, dev, shape, dtype, "from_dlpack");
  const auto bytes = static_cast<uint64_t>(numel * esize);
  std::vector<unsigned char> staged;
  if (!compact_layout) {
    staged.resize(static_cast<std::size_t>(bytes));
    gather(region, layout, shape, strides, static_cast<std::size_t>(esize), staged.data());
  } else if (below != 0 || region_bytes != bytes) {
    throw Error(Errc::internal, "from_dlpack: a compact layout of " + std::to_string(bytes) +
                                    " bytes has a region of " + std::to_string(region_bytes) +
                                    " bytes starting " + std::to_string(below) +
                                    " bytes before element [0,...,0]");
  }
  t->storage->backend->write(t->storage->buffer, 0,
                             compact_layout ? static_cast<const void*>(region) : staged.data(), bytes,
                             "buffer_write to " + device.id() + " (from_dlpack copy)");
  return detail::Access::make_tensor(std::move(t));  // `owner` runs the deleter now
}

}  // namespace backplane
