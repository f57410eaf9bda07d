// Tensor handles: allocation through the plugin, host transfer, metadata.
#include "tensor/op_common.hpp"
#include "tensor/placement.hpp"
#include "tensor/tensor_impl.hpp"

#include <backplane/log.hpp>
#include <backplane/ops.hpp>
#include <backplane/tensor.hpp>
#include <backplane_common/half.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

namespace backplane {
namespace detail {

namespace {

// The failure halves of the per-op allocation path, out of line so the
// success path stays small enough to inline. alloc_failed: a non-NULL status
// (thrown unless its code is OK), then a missing buffer.
[[gnu::cold, gnu::noinline]] void alloc_failed(const BackendImpl& backend, int32_t dev, uint64_t size,
                                               bp_status* st, bool no_buffer) {
  if (st != nullptr)
    backend.check(st, "buffer_alloc of " + std::to_string(size) + " bytes on " + backend.device_id(dev));
  if (no_buffer)
    throw Error(Errc::device_error, "backend \"" + backend.name + "\": buffer_alloc of " +
                                        std::to_string(size) + " bytes succeeded but returned no buffer");
}

[[gnu::cold, gnu::noinline]] void free_failed(const BackendImpl& backend, int32_t dev,
                                              bp_status* st) noexcept {
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

// Back to the pool Storage::replica took it from (defined with the pool). Out
// of line: only a storage that met placement has a slot, and inlined into
// ~Storage its destructor costs every other storage a larger frame.
[[gnu::noinline]] void free_replica_slot(Storage::ReplicaSlot* slot) noexcept;

[[gnu::cold, gnu::noinline]] void free_threw(const Error& e) noexcept {
  try {
    log(LogLevel::warning, e.message());
  } catch (...) {  // a throwing log handler loses the message, not the process
  }
}

}  // namespace

Storage::Storage(std::shared_ptr<BackendImpl> b, int32_t dev, uint64_t size)
    : backend(std::move(b)), nbytes(size), device(dev) {
  bp_buffer_alloc_args args{};
  args.struct_size = BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE;
  args.plugin = backend->plugin;
  args.device = dev;
  args.size = size;
  bp_status* st = call_entry(*backend, "buffer_alloc", Errc::internal, backend->api.buffer_alloc, &args);
  if (st != nullptr || args.buffer == nullptr) [[unlikely]]
    alloc_failed(*backend, dev, size, st, args.buffer == nullptr);
  buffer = args.buffer;
}

Storage::Storage(std::shared_ptr<BackendImpl> b, int32_t dev, bp_buffer* adopted, uint64_t size) noexcept
    : backend(std::move(b)), buffer(adopted), nbytes(size), device(dev) {}

Storage::~Storage() {
  // A replica may import these bytes: it goes first.
  if (ReplicaSlot* slot = replica_slot.load(std::memory_order_acquire)) [[unlikely]]
    free_replica_slot(slot);
  bp_buffer_free_args args{};
  args.struct_size = BP_BUFFER_FREE_ARGS_STRUCT_SIZE;
  args.plugin = backend->plugin;
  args.buffer = buffer;
  bp_status* st = nullptr;
  try {
    st = call_entry(*backend, "buffer_free", Errc::internal, backend->api.buffer_free, &args);
  } catch (const Error& e) {  // a throwing buffer_free: the buffer is abandoned, the failure logged
    free_threw(e);
    return;
  }
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
[[noreturn, gnu::cold, gnu::noinline]] void bad_shape(const Shape& shape, DType dtype,
                                                      std::string_view what) {
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

// TensorImpl blocks (allocate_shared's one allocation: the control block with
// the object) come from a per-thread free list. Every op's output is one; a
// malloc and free of it were about 4 of the core's 63 ns over the plugin for
// a small add (bench_dispatch). A block freed on another thread joins that thread's list; each list is
// bounded, and emptied when its thread ends. Under AddressSanitizer blocks go
// straight back to the heap, so that a use after free is still reported.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kPoolBlocks = false;
#else
constexpr bool kPoolBlocks = true;
#endif

class BlockList {
 public:
  static constexpr int kMaxBlocks = 256;
  void* pop() noexcept {
    Node* n = head_;
    if (n == nullptr) return nullptr;
    head_ = n->next;
    --count_;
    return n;
  }
  // False (the caller frees p) once closed, or when full.
  bool push(void* p) noexcept {
    if (state_ != State::open || count_ >= kMaxBlocks) return false;
    head_ = new (p) Node{head_};
    ++count_;
    return true;
  }
  // Whether the thread's closer has been set up (BlockPool::first_push).
  bool opened() const noexcept { return state_ != State::fresh; }
  void open() noexcept { state_ = State::open; }  // once, while fresh
  // At thread exit: frees what is held; later frees go to operator delete.
  void close(std::size_t size, std::align_val_t align) noexcept {
    state_ = State::closed;
    while (void* p = pop()) ::operator delete(p, size, align);
  }

 private:
  struct Node {
    Node* next;
  };
  enum class State : uint8_t { fresh, open, closed };
  Node* head_ = nullptr;
  int count_ = 0;
  State state_ = State::fresh;
};

template <class T>
struct BlockPool {
  static_assert(sizeof(T) >= sizeof(void*));
  // Constant-initialised and trivially destructible: one thread-local access
  // and no guard on every op's path, and still usable after the closer has
  // run (another thread_local's destructor may free a tensor). A guarded
  // thread_local here cost two __tls_get_addr calls per allocation and two
  // per free (this is a shared library: the general-dynamic TLS model).
  static BlockList& list() noexcept {
    static thread_local constinit BlockList l;
    return l;
  }
  // Keeps a freed block; false: the caller frees it. The fast path is one
  // thread-local access.
  static bool push(void* p) noexcept {
    if (list().push(p)) [[likely]]
      return true;
    return first_push(p);
  }
  // The list refused: it is full or closed, or this is the thread's first
  // free, which sets up the closer that empties the list when the thread ends.
  [[gnu::cold, gnu::noinline]] static bool first_push(void* p) noexcept {
    BlockList& l = list();
    if (l.opened()) return false;
    static thread_local Closer closer{&l};
    (void)closer;
    l.open();
    return l.push(p);
  }
  struct Closer {
    BlockList* l;
    ~Closer() { l->close(sizeof(T), std::align_val_t(alignof(T))); }
  };
};

template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() noexcept = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (kPoolBlocks && n == 1)
      if (void* p = BlockPool<T>::list().pop()) return static_cast<T*>(p);
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(alignof(T))));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (kPoolBlocks && n == 1 && BlockPool<T>::push(p)) return;
    ::operator delete(p, n * sizeof(T), std::align_val_t(alignof(T)));
  }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const noexcept {
    return true;
  }
};

[[gnu::noinline]] void free_replica_slot(Storage::ReplicaSlot* slot) noexcept {
  slot->~ReplicaSlot();
  PoolAllocator<Storage::ReplicaSlot>{}.deallocate(slot, 1);
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
  return std::allocate_shared<TensorImpl>(PoolAllocator<TensorImpl>{}, backend, device, bytes, shape, dtype);
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

std::shared_ptr<TensorImpl> new_impl() {
  return std::allocate_shared<TensorImpl>(PoolAllocator<TensorImpl>{});
}

Storage::ReplicaSlot& Storage::first_replica() const {
  ReplicaSlot* slot = replica_slot.load(std::memory_order_acquire);
  if (slot != nullptr) return *slot;  // another thread's, made since replica() looked
  PoolAllocator<ReplicaSlot> pool;
  ReplicaSlot* fresh = new (pool.allocate(1)) ReplicaSlot();
  if (replica_slot.compare_exchange_strong(slot, fresh, std::memory_order_acq_rel)) return *fresh;
  free_replica_slot(fresh);
  return *slot;  // another thread's
}

std::shared_ptr<TensorImpl> make_view(const std::shared_ptr<TensorImpl>& t, const Shape& shape,
                                      const Shape& strides, uint64_t byte_offset) {
  auto v = new_impl();
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
  return detail::Access::make_tensor(
      detail::allocate_on(backend, device.index(), shape, dtype, "Tensor::empty"));
}

namespace {

[[gnu::cold]] void write_failed(const detail::BackendImpl& b, const Device& device, bp_status* status) {
  b.check(status, "buffer_write to " + device.id());
}

}  // namespace

Tensor Tensor::from_bytes(const Device& device, const Shape& shape, DType dtype, const void* data,
                          std::size_t count) {
  const auto& backend = detail::usable(device, "Tensor::from_vector");
  const int64_t n = detail::checked_numel(shape, dtype, "Tensor::from_vector");
  if (static_cast<uint64_t>(n) != count) {
    throw Error(Errc::invalid_argument, "Tensor::from_vector: shape " + shape.to_string() + " holds " +
                                            std::to_string(n) + " elements but " + std::to_string(count) +
                                            " values were given");
  }
  auto t = detail::allocate_on(backend, device.index(), shape, dtype, "Tensor::from_vector");
  const uint64_t bytes = t->storage->nbytes;
  if (bytes > 0) {
    if (bp_status* st = t->storage->backend->write_status(t->storage->buffer, 0, data, bytes)) [[unlikely]]
      write_failed(*t->storage->backend, device, st);
  }
  return detail::Access::make_tensor(std::move(t));
}

const detail::TensorImpl& Tensor::checked() const {
  if (!impl_)
    throw Error(Errc::invalid_argument, "use of an undefined Tensor (default-constructed or moved-from)");
  return *impl_;
}

const Shape& Tensor::shape() const { return checked().shape; }
const Shape& Tensor::strides() const { return checked().strides; }
DType Tensor::dtype() const { return checked().dtype; }
Device Tensor::device() const {
  const auto& s = *checked().storage;
  return detail::Access::make_device(s.home ? s.home : s.backend, s.home_index());
}
bool Tensor::is_contiguous() const { return detail::is_contiguous(checked()); }

Tensor Tensor::to(const Device& device) const {
  checked();
  return backplane::to(*this, device);
}

namespace {

// read_into's and to_vector's refusals, out of their hot paths.
[[noreturn, gnu::cold]] void bad_read(const detail::TensorImpl& t, DType dtype, std::size_t count) {
  if (dtype != t.dtype) {
    throw Error(Errc::dtype_mismatch, "Tensor::to_vector: the tensor holds " +
                                          std::string(backplane::to_string(t.dtype)) + " but " +
                                          std::string(backplane::to_string(dtype)) + " was requested");
  }
  throw Error(Errc::invalid_argument, "Tensor::read_into: destination holds " + std::to_string(count) +
                                          " elements, the tensor " + std::to_string(t.shape.numel()));
}

void check_read(const detail::TensorImpl& t, DType dtype, std::size_t count) {
  if (dtype != t.dtype || count != static_cast<std::size_t>(t.shape.numel())) [[unlikely]]
    bad_read(t, dtype, count);
}

[[gnu::cold]] void read_failed(const detail::BackendImpl& b, int32_t device, bp_status* status) {
  b.check_on(status, "buffer_read from ", "", device);
}

}  // namespace

void Tensor::read_into(DType dtype, void* dst, std::size_t count) const {
  const auto& t = checked();
  check_read(t, dtype, count);
  if (count == 0) return;
  if (!detail::is_contiguous(t)) {
    detail::Access::make_tensor(detail::copy_contiguous(t, "Tensor::to_vector"))
        .read_into(dtype, dst, count);  // records no graph
    return;
  }
  const auto& s = *t.storage;
  const uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(dtype);
  // Host-visible memory is read through its address (abi.h), on this thread:
  // one memcpy, which a team of threads would not speed up on a busy machine.
  if (const std::byte* p = s.backend->host_pointer(s.device, s.buffer, "Tensor::read_into")) {
    s.backend->synchronize_if_async(s.device, "Tensor::read_into");
    std::memcpy(dst, p + t.byte_offset, static_cast<std::size_t>(bytes));
    return;
  }
  // buffer_read synchronises an async device itself (abi.h).
  if (bp_status* st = s.backend->read_status(s.buffer, t.byte_offset, dst, bytes)) [[unlikely]]
    read_failed(*s.backend, s.device, st);
}

const void* Tensor::host_elements(DType dtype, std::size_t count, std::size_t alignment) const {
  const auto& t = checked();
  check_read(t, dtype, count);
  if (count == 0 || !detail::is_contiguous(t)) return nullptr;
  const auto& s = *t.storage;
  const std::byte* p = s.backend->host_pointer(s.device, s.buffer, "Tensor::to_vector");
  if (p == nullptr) return nullptr;
  p += t.byte_offset;
  // Imported (DLPack) memory need not be aligned for the element type.
  if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) return nullptr;
  s.backend->synchronize_if_async(s.device, "Tensor::to_vector");
  return p;
}

namespace {

// NumPy's summary rule: past kSummariseAbove elements, each dimension longer
// than 2 * kEdgeItems shows its first and last kEdgeItems entries around "...".
constexpr int64_t kSummariseAbove = 1000;
constexpr int64_t kEdgeItems = 3;

std::string float_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  std::string text = buf;
  if (text.find_first_of(".e") == std::string::npos) text += '.';  // "1." as NumPy: a float, not an int
  return text;
}

// One element, from its bytes in the tensor's dtype.
std::string element_text(DType dtype, const unsigned char* p) {
  auto as = [p](auto zero) {
    std::memcpy(&zero, p, sizeof zero);
    return zero;
  };
  switch (dtype) {
    case DType::f32:
      return float_text(as(float{}));
    case DType::f64:
      return float_text(as(double{}));
    case DType::f16:
      return float_text(common::f16_to_f32(as(uint16_t{})));
    case DType::bf16:
      return float_text(common::bf16_to_f32(as(uint16_t{})));
    case DType::i32:
      return std::to_string(as(int32_t{}));
    case DType::i64:
      return std::to_string(as(int64_t{}));
    case DType::u8:
      return std::to_string(as(uint8_t{}));
    case DType::i8:
      return std::to_string(as(int8_t{}));
    case DType::bool_:
      return as(uint8_t{}) != 0 ? "true" : "false";
  }
  return "?";
}

// The indices shown along one dimension; -1 marks the "..." between the edges.
std::vector<int64_t> shown_indices(int64_t extent, bool summarise) {
  std::vector<int64_t> out;
  if (summarise && extent > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) out.push_back(i);
    out.push_back(-1);
    for (int64_t i = extent - kEdgeItems; i < extent; ++i) out.push_back(i);
  } else {
    for (int64_t i = 0; i < extent; ++i) out.push_back(i);
  }
  return out;
}

// Nested brackets over the shown indices; `texts` holds the shown elements in
// row-major order, right-aligned to one width; `indent` is the column of the
// outermost '['.
void format_level(const std::vector<std::vector<int64_t>>& shown, std::size_t dim,
                  const std::vector<std::string>& texts, std::size_t& next, std::size_t indent,
                  std::string& out) {
  out += '[';
  const std::vector<int64_t>& idx = shown[dim];
  const bool innermost = dim + 1 == shown.size();
  for (std::size_t k = 0; k < idx.size(); ++k) {
    if (k > 0) {
      out += ',';
      if (innermost) {
        out += ' ';
      } else {
        out.append(shown.size() - dim - 1, '\n');  // a blank line between blocks of rank >= 3
        out.append(indent + dim + 1, ' ');
      }
    }
    if (idx[k] < 0) {
      out += "...";
    } else if (innermost) {
      out += texts[next++];
    } else {
      format_level(shown, dim + 1, texts, next, indent, out);
    }
  }
  out += ']';
}

}  // namespace

std::string Tensor::to_string() const {
  if (!impl_) return "Tensor(undefined)";
  const std::string meta = "shape=" + impl_->shape.to_string() +
                           ", dtype=" + std::string(backplane::to_string(impl_->dtype)) +
                           ", device=" + device().id();
  try {
    const auto& t = *impl_;
    const std::size_t size = dtype_size(t.dtype);
    const int64_t n = t.shape.numel();
    const int rank = t.shape.rank();
    if (size == 0) return "Tensor(" + meta + ")";
    if (n == 0) return "Tensor([], " + meta + ")";
    const bool summarise = n > kSummariseAbove;
    std::vector<std::vector<int64_t>> shown;
    for (int d = 0; d < rank; ++d) shown.push_back(shown_indices(t.shape[d], summarise));

    std::vector<std::string> texts;
    if (!summarise) {
      // Small: the whole tensor through read_into (which synchronises the device).
      std::vector<unsigned char> bytes(static_cast<std::size_t>(n) * size);
      read_into(t.dtype, bytes.data(), static_cast<std::size_t>(n));
      texts.reserve(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) texts.push_back(element_text(t.dtype, bytes.data() + i * size));
    } else {
      // Large: only the shown elements, each run of the innermost dimension in
      // one buffer_read (synchronising, as read_into's), at most 6^rank values.
      const auto& s = *t.storage;
      const std::string what = "buffer_read from " + s.backend->device_id(s.device);
      std::vector<std::vector<int64_t>> outer;  // shown indices of dims 0..rank-2, without "..."
      for (int d = 0; d + 1 < rank; ++d) {
        outer.emplace_back();
        for (int64_t i : shown[static_cast<std::size_t>(d)])
          if (i >= 0) outer.back().push_back(i);
      }
      std::vector<int64_t> inner;
      for (int64_t i : shown.back())
        if (i >= 0) inner.push_back(i);
      const int64_t inner_stride = t.strides[rank - 1];
      std::vector<std::size_t> pos(outer.size(), 0);
      std::vector<unsigned char> run;
      while (true) {
        int64_t base = 0;
        for (std::size_t d = 0; d < outer.size(); ++d)
          base += outer[d][pos[d]] * t.strides[static_cast<int>(d)];
        for (std::size_t k = 0; k < inner.size();) {
          std::size_t len = 1;  // consecutive indices read together when the dimension is dense
          while (inner_stride == 1 && k + len < inner.size() &&
                 inner[k + len] == inner[k] + static_cast<int64_t>(len))
            ++len;
          run.resize(len * size);
          const int64_t first = base + inner[k] * inner_stride;
          s.backend->read(s.buffer, t.byte_offset + static_cast<uint64_t>(first) * size, run.data(),
                          len * size, what);
          for (std::size_t j = 0; j < len; ++j) texts.push_back(element_text(t.dtype, run.data() + j * size));
          k += len;
        }
        std::size_t d = outer.size();
        while (d > 0 && ++pos[d - 1] == outer[d - 1].size()) pos[--d] = 0;
        if (d == 0) break;
      }
    }
    std::size_t width = 0;
    for (const std::string& text : texts) width = std::max(width, text.size());
    for (std::string& text : texts) text.insert(0, width - text.size(), ' ');
    std::string values;
    if (rank == 0) {
      values = texts.at(0);
    } else {
      std::size_t next = 0;
      format_level(shown, 0, texts, next, std::string("Tensor(").size(), values);
    }
    return "Tensor(" + values + ", " + meta + ")";
  } catch (const std::exception&) {
    // Values that cannot be read (a device error, an undefined buffer): the metadata still helps.
    return "Tensor(" + meta + ")";
  }
}

}  // namespace backplane
