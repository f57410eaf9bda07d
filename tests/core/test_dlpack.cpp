// DLPack interop: to_dlpack / from_dlpack on the cpu plugin (zero-copy both
// ways, via buffer_pointer and buffer_import) and on the opaque fixture (host
// copies); every invalid input runs the producer's deleter exactly once.
#include <backplane/abi.h>  // the plugin-side names these tests check against
#include <backplane/dlpack.hpp>

#include <dlpack/dlpack.h>

#include "test_support.hpp"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <dlfcn.h>

using namespace backplane;
using namespace bptest;

namespace {

Registry& registry() {
  static Registry r =
      load(config_json({backend_json("cpu", "backplane_cpu", true), backend_json("opaque", "opaque")}));
  return r;
}
Device cpu() { return registry().backend("cpu").device(0); }
Device opaque() { return registry().backend("opaque").device(0); }

// A producer's DLManagedTensor over memory the test owns. The deleter only
// counts, so the test can check it ran exactly once and read the memory after.
struct Producer {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int deletes = 0;
};

void count_delete(DLManagedTensor* self) { ++static_cast<Producer*>(self->manager_ctx)->deletes; }

std::unique_ptr<Producer> produce(void* data, std::vector<int64_t> shape, DLDataType dtype,
                                  std::vector<int64_t> strides = {}, uint64_t byte_offset = 0) {
  auto p = std::make_unique<Producer>();
  p->shape = std::move(shape);
  p->strides = std::move(strides);
  DLTensor& t = p->managed.dl_tensor;
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int>(p->shape.size());
  t.dtype = dtype;
  t.shape = p->shape.empty() ? nullptr : p->shape.data();
  t.strides = p->strides.empty() ? nullptr : p->strides.data();
  t.byte_offset = byte_offset;
  p->managed.manager_ctx = p.get();
  p->managed.deleter = &count_delete;
  return p;
}

constexpr DLDataType kF32{kDLFloat, 32, 1};

// Frees an exported tensor at scope exit.
struct Exported {
  DLManagedTensor* m;
  explicit Exported(DLManagedTensor* p) : m(p) { REQUIRE(m != nullptr); }
  ~Exported() {
    if (m != nullptr) m->deleter(m);
  }
  Exported(const Exported&) = delete;
  Exported& operator=(const Exported&) = delete;
  const DLTensor& dl() const { return m->dl_tensor; }
  template <class T>
  T* data() const {
    return reinterpret_cast<T*>(static_cast<unsigned char*>(m->dl_tensor.data) + m->dl_tensor.byte_offset);
  }
};

std::vector<int64_t> dims(const DLTensor& t, const int64_t* p) { return {p, p + t.ndim}; }

// Bytes of a tensor, row-major, whatever its dtype.
std::vector<unsigned char> bytes_of(const Tensor& t) {
  std::vector<unsigned char> out(t.nbytes());
  t.read_into(t.dtype(), out.data(), static_cast<std::size_t>(t.numel()));
  return out;
}

struct DTypeCase {
  DType dtype;
  uint8_t code;
  uint8_t bits;
};

}  // namespace

TEST_CASE("dlpack: every dtype round-trips through to_dlpack and from_dlpack with its DLPack code") {
  const DTypeCase cases[] = {
      {DType::f32, kDLFloat, 32},   {DType::f64, kDLFloat, 64}, {DType::f16, kDLFloat, 16},
      {DType::bf16, kDLBfloat, 16}, {DType::i32, kDLInt, 32},   {DType::i64, kDLInt, 64},
      {DType::i8, kDLInt, 8},       {DType::u8, kDLUInt, 8},    {DType::bool_, kDLUInt, 8},
  };
  for (const Device& device : {cpu(), opaque()}) {
    for (const auto& c : cases) {
      CAPTURE(c.dtype);
      CAPTURE(device.id());
      // A device holds only the dtypes it flags (the opaque fixture: f32);
      // the refusal of the others is tested below.
      if (!device.capabilities().has(capability_for(c.dtype))) continue;
      const std::size_t esize = dtype_size(c.dtype);
      std::vector<unsigned char> values(6 * esize);
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<unsigned char>(i * 37 + 1);
      if (c.dtype == DType::bool_)
        for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<unsigned char>(i % 2);
      const Tensor t = Tensor::from_bytes(device, {2, 3}, c.dtype, values.data(), 6);
      DLManagedTensor* m = to_dlpack(t);
      REQUIRE(m != nullptr);
      CHECK(m->dl_tensor.dtype.code == c.code);
      CHECK(m->dl_tensor.dtype.bits == c.bits);
      CHECK(m->dl_tensor.dtype.lanes == 1);
      CHECK(m->dl_tensor.device.device_type == kDLCPU);
      CHECK(m->dl_tensor.device.device_id == 0);
      CHECK(std::memcmp(m->dl_tensor.data, values.data(), values.size()) == 0);
      const Tensor back = from_dlpack(m, device);  // consumes m
      CHECK(back.dtype() == c.dtype);              // bool too: the export remembers it
      CHECK(back.shape() == Shape{2, 3});
      CHECK(bytes_of(back) == values);
    }
  }
}

TEST_CASE("dlpack: foreign u8 imports as u8, DLPack 0.8's kDLBool (code 6) imports as bool") {
  std::vector<uint8_t> data{0, 1, 1, 0};
  auto u8 = produce(data.data(), {4}, {kDLUInt, 8, 1});
  CHECK(from_dlpack(&u8->managed, cpu()).dtype() == DType::u8);
  CHECK(u8->deletes == 1);
  auto b = produce(data.data(), {4}, {6, 8, 1});
  const Tensor t = from_dlpack(&b->managed, cpu());
  CHECK(t.dtype() == DType::bool_);
  CHECK(t.to_vector<bool>() == std::vector<bool>{false, true, true, false});
}

TEST_CASE("dlpack: to_dlpack on a host_visible device shares the tensor's memory") {
  Tensor t = Tensor::from_vector<float>(cpu(), {2, 3}, {1, 2, 3, 4, 5, 6});
  Exported e(to_dlpack(t));
  CHECK(e.dl().ndim == 2);
  CHECK(dims(e.dl(), e.dl().shape) == std::vector<int64_t>{2, 3});
  REQUIRE(e.dl().strides != nullptr);
  CHECK(dims(e.dl(), e.dl().strides) == std::vector<int64_t>{3, 1});
  CHECK(e.dl().byte_offset == 0);
  // A second export points at the same bytes.
  Exported again(to_dlpack(t));
  CHECK(again.dl().data == e.dl().data);
  // Writes through the DLPack pointer are the tensor's, and the reverse.
  e.data<float>()[4] = 42.0f;
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 42, 6});
  // The export keeps the storage alive after the last tensor is gone.
  t = Tensor();
  CHECK(e.data<float>()[0] == 1.0f);
  CHECK(e.data<float>()[4] == 42.0f);
}

TEST_CASE("dlpack: from_dlpack adopts producer memory, the deleter runs once, after the last tensor") {
  std::vector<float> data{1, 2, 3, 4, 5, 6};
  auto p = produce(data.data(), {2, 3}, kF32);
  Tensor t = from_dlpack(&p->managed, cpu());
  CHECK(p->deletes == 0);
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.dtype() == DType::f32);
  CHECK(t.is_contiguous());
  // The tensor sees the producer's writes: no copy was made.
  data[2] = 30.0f;
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 30, 4, 5, 6});
  // Re-exporting gives back the producer's own pointer.
  auto* re = to_dlpack(t);
  CHECK(re->dl_tensor.data == data.data());
  // Ops read the wrapped buffer like any other.
  CHECK(add(t, t).to_vector<float>() == std::vector<float>{2, 4, 60, 8, 10, 12});

  Tensor copy = t;
  Tensor reimported = from_dlpack(re, cpu());  // a second import of the same memory: shares it
  t = Tensor();
  CHECK(p->deletes == 0);
  copy = Tensor();
  CHECK(p->deletes == 0);  // `reimported` holds the re-export, which holds the storage
  CHECK(reimported.to_vector<float>() == std::vector<float>{1, 2, 30, 4, 5, 6});
  reimported = Tensor();
  CHECK(p->deletes == 1);
}

TEST_CASE("dlpack: views (slice, transpose) of an adopted tensor keep the producer's memory alive") {
  std::vector<float> data{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  auto p = produce(data.data(), {3, 4}, kF32);
  Tensor t = from_dlpack(&p->managed, cpu());
  Tensor rows = slice(t, 0, 1, 3);      // rows 1..2
  Tensor cols = transpose(rows, 0, 1);  // a view of a view
  t = Tensor();
  rows = Tensor();
  CHECK(p->deletes == 0);
  data[5] = 50.0f;  // row 1, column 1
  CHECK(cols.to_vector<float>() == std::vector<float>{4, 8, 50, 9, 6, 10, 7, 11});
  {
    // Exporting a view: data points at its first element, strides are the view's.
    Exported e(to_dlpack(cols));
    CHECK(e.dl().data == data.data() + 4);
    CHECK(e.dl().byte_offset == 0);
    CHECK(dims(e.dl(), e.dl().shape) == std::vector<int64_t>{4, 2});
    CHECK(dims(e.dl(), e.dl().strides) == std::vector<int64_t>{1, 4});
    cols = Tensor();
    CHECK(p->deletes == 0);  // the export still holds the view
  }
  CHECK(p->deletes == 1);
}

TEST_CASE("dlpack: a strided import is a view, the deleter waits for the view and its copies") {
  // A 2x3 row-major block read as its 3x2 transpose: shape [3, 2], strides [1, 3].
  std::vector<float> data{1, 2, 3, 4, 5, 6};
  auto p = produce(data.data(), {3, 2}, kF32, {1, 3});
  Tensor t = from_dlpack(&p->managed, cpu());
  CHECK(t.strides() == Shape{1, 3});
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
  data[1] = 20.0f;
  CHECK(t.to_vector<float>() == std::vector<float>{1, 4, 20, 5, 3, 6});
  CHECK(add(t, t).to_vector<float>() == std::vector<float>{2, 8, 40, 10, 6, 12});
  {
    Exported e(to_dlpack(t));
    CHECK(e.dl().data == data.data());
    CHECK(dims(e.dl(), e.dl().strides) == std::vector<int64_t>{1, 3});
  }
  Tensor copy = t;
  t = Tensor();
  CHECK(p->deletes == 0);
  copy = Tensor();
  CHECK(p->deletes == 1);
}

TEST_CASE("dlpack: byte_offset, negative and zero strides, and scalars import without copying") {
  std::vector<float> data{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  SUBCASE("byte_offset selects a slice") {
    auto p = produce(data.data(), {3}, kF32, {}, 2 * sizeof(float));
    const Tensor t = from_dlpack(&p->managed, cpu());
    CHECK(t.to_vector<float>() == std::vector<float>{2, 3, 4});
    Exported e(to_dlpack(t));
    CHECK(e.dl().data == data.data() + 2);
    CHECK(e.dl().byte_offset == 0);
  }
  SUBCASE("a negative stride reverses") {
    auto p = produce(data.data(), {4}, kF32, {-2}, 6 * sizeof(float));
    Tensor t = from_dlpack(&p->managed, cpu());
    CHECK(t.to_vector<float>() == std::vector<float>{6, 4, 2, 0});
    data[4] = 40.0f;
    CHECK(t.to_vector<float>() == std::vector<float>{6, 40, 2, 0});
    t = Tensor();
    CHECK(p->deletes == 1);
  }
  SUBCASE("a zero stride broadcasts") {
    auto p = produce(data.data(), {2, 3}, kF32, {0, 1});
    const Tensor t = from_dlpack(&p->managed, cpu());
    CHECK(t.to_vector<float>() == std::vector<float>{0, 1, 2, 0, 1, 2});
  }
  SUBCASE("a 0-d tensor has no shape array") {
    auto p = produce(data.data() + 7, {}, kF32);
    const Tensor t = from_dlpack(&p->managed, cpu());
    CHECK(t.rank() == 0);
    CHECK(t.to_vector<float>() == std::vector<float>{7});
  }
}

TEST_CASE("dlpack: a layout whose negative strides reach before data is refused, never read") {
  // The producer's allocation is exactly these four floats, data at its start:
  // strides {-1} would reach the three floats before it.
  const auto buffer = std::make_unique<float[]>(4);
  for (int i = 0; i < 4; ++i) buffer[i] = static_cast<float>(i);
  struct Case {
    const char* name;
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
    uint64_t byte_offset;
    const char* extent;
    const char* before;
  };
  const Case cases[] = {
      {"1-D, reversed from data", {4}, {-1}, 0, "elements [-3, 0]", "12 bytes before dl_tensor.data"},
      {"byte_offset covers part of it",
       {4},
       {-1},
       sizeof(float),
       "elements [-3, 0]",
       "8 bytes before dl_tensor.data"},
      {"2-D, inner dim reversed", {2, 2}, {2, -1}, 0, "elements [-1, 2]", "4 bytes before dl_tensor.data"},
      {"2-D, both reversed",
       {2, 2},
       {-2, -1},
       2 * sizeof(float),
       "elements [-3, 0]",
       "4 bytes before dl_tensor.data"},
  };
  for (const Device& device : {cpu(), opaque()}) {
    for (const auto& c : cases) {
      CAPTURE(c.name);
      CAPTURE(device.id());
      auto p = produce(buffer.get(), c.shape, kF32, c.strides, c.byte_offset);
      const Error e = error_from([&] { from_dlpack(&p->managed, device); });
      CHECK(e.code() == Errc::invalid_argument);
      BP_CHECK_CONTAINS(e.message(), "from_dlpack");
      BP_CHECK_CONTAINS(e.message(), "dl_tensor.strides");
      BP_CHECK_CONTAINS(e.message(), c.extent);
      BP_CHECK_CONTAINS(e.message(), c.before);
      CHECK(p->deletes == 1);
    }
  }
  // Misaligned data takes the copy path on every device; it is refused the same way.
  std::vector<unsigned char> raw(sizeof(float) * 4 + 1);
  auto p = produce(raw.data(), {4}, kF32, {-1}, 1);
  const Error e = error_from([&] { from_dlpack(&p->managed, cpu()); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "dl_tensor.strides");
  BP_CHECK_CONTAINS(e.message(), "elements [-3, 0]");
  CHECK(p->deletes == 1);
}

TEST_CASE("dlpack: negative strides inside the allocation import with their values, adopted or copied") {
  // data at the allocation's start, byte_offset at element [0]: the last float.
  const auto buffer = std::make_unique<float[]>(6);
  for (int i = 0; i < 6; ++i) buffer[i] = static_cast<float>(i + 1);
  SUBCASE("a reversed 1-D array is adopted as a view of the producer's memory") {
    auto p = produce(buffer.get(), {6}, kF32, {-1}, 5 * sizeof(float));
    Tensor t = from_dlpack(&p->managed, cpu());
    CHECK(p->deletes == 0);
    CHECK(t.strides() == Shape{-1});
    CHECK(t.to_vector<float>() == std::vector<float>{6, 5, 4, 3, 2, 1});
    buffer[0] = 10.0f;  // shared: the last element of the view
    CHECK(t.to_vector<float>() == std::vector<float>{6, 5, 4, 3, 2, 10});
    CHECK(add(t, t).to_vector<float>() == std::vector<float>{12, 10, 8, 6, 4, 20});
    t = Tensor();
    CHECK(p->deletes == 1);
  }
  SUBCASE("a reversed 1-D array is gathered onto a device that is not host_visible") {
    auto p = produce(buffer.get(), {6}, kF32, {-1}, 5 * sizeof(float));
    const Tensor t = from_dlpack(&p->managed, opaque());
    CHECK(p->deletes == 1);
    CHECK(t.is_contiguous());
    CHECK(t.to_vector<float>() == std::vector<float>{6, 5, 4, 3, 2, 1});
  }
  SUBCASE("a 2-D layout reversed in both dims, adopted and copied") {
    for (const Device& device : {cpu(), opaque()}) {
      CAPTURE(device.id());
      auto p = produce(buffer.get(), {2, 3}, kF32, {-3, -1}, 5 * sizeof(float));
      const Tensor t = from_dlpack(&p->managed, device);
      CHECK(t.to_vector<float>() == std::vector<float>{6, 5, 4, 3, 2, 1});
    }
  }
  SUBCASE("mixed signs: rows forward, columns reversed, misaligned so copied") {
    std::vector<unsigned char> raw(sizeof(float) * 6 + 1);
    std::memcpy(raw.data() + 1, buffer.get(), sizeof(float) * 6);
    auto p = produce(raw.data(), {2, 3}, kF32, {3, -1}, 1 + 2 * sizeof(float));
    const Tensor t = from_dlpack(&p->managed, cpu());
    CHECK(p->deletes == 1);
    CHECK(t.to_vector<float>() == std::vector<float>{3, 2, 1, 6, 5, 4});
  }
}

TEST_CASE("dlpack: a re-exported negative-stride view imports again, bounded by its allocation") {
  const auto buffer = std::make_unique<float[]>(4);
  for (int i = 0; i < 4; ++i) buffer[i] = static_cast<float>(i);
  auto p = produce(buffer.get(), {4}, kF32, {-1}, 3 * sizeof(float));
  Tensor reversed = from_dlpack(&p->managed, cpu());
  SUBCASE("to_dlpack points data at element [0], the last in memory; from_dlpack takes it back") {
    for (const Device& device : {cpu(), opaque()}) {
      CAPTURE(device.id());
      DLManagedTensor* m = to_dlpack(reversed);
      CHECK(m->dl_tensor.data == buffer.get() + 3);
      CHECK(m->dl_tensor.byte_offset == 0);
      CHECK(m->dl_tensor.strides[0] == -1);
      const Tensor back = from_dlpack(m, device);
      CHECK(back.to_vector<float>() == std::vector<float>{3, 2, 1, 0});
    }
  }
  SUBCASE("strides altered to leave the exported allocation are refused") {
    for (const Device& device : {cpu(), opaque()}) {
      for (const int64_t stride : {int64_t{-2}, int64_t{2}}) {
        CAPTURE(device.id());
        CAPTURE(stride);
        const Tensor compact = Tensor::from_vector<float>(cpu(), {4}, {1, 2, 3, 4});
        DLManagedTensor* m = to_dlpack(stride < 0 ? reversed : compact);
        m->dl_tensor.strides[0] = stride;
        const Error e = error_from([&] { from_dlpack(m, device); });
        CHECK(e.code() == Errc::invalid_argument);
        BP_CHECK_CONTAINS(e.message(), "dl_tensor.strides");
        BP_CHECK_CONTAINS(e.message(), "outside the exported allocation");
      }
    }
  }
  reversed = Tensor();
  CHECK(p->deletes == 1);
}

TEST_CASE("dlpack: copies instead of adopting, and deletes at once, when memory cannot be shared") {
  std::vector<float> data{1, 2, 3, 4, 5, 6};
  SUBCASE("a device that is not host_visible") {
    auto p = produce(data.data(), {2, 3}, kF32);
    const Tensor t = from_dlpack(&p->managed, opaque());
    CHECK(p->deletes == 1);
    CHECK(t.device() == opaque());
    data[0] = 100.0f;  // not seen: it is a copy
    CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(add(t, t).to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
  }
  SUBCASE("a strided layout onto a device that is not host_visible is gathered") {
    auto p = produce(data.data(), {3, 2}, kF32, {1, 3});
    const Tensor t = from_dlpack(&p->managed, opaque());
    CHECK(p->deletes == 1);
    CHECK(t.is_contiguous());
    CHECK(t.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
  }
  SUBCASE("data not aligned to the element size") {
    std::vector<unsigned char> raw(sizeof(float) * 3 + 1);
    const float v[3] = {1.5f, -2.5f, 3.5f};
    std::memcpy(raw.data() + 1, v, sizeof v);
    auto p = produce(raw.data(), {3}, kF32, {}, 1);
    const Tensor t = from_dlpack(&p->managed, cpu());
    CHECK(p->deletes == 1);
    CHECK(t.to_vector<float>() == std::vector<float>{1.5f, -2.5f, 3.5f});
  }
  SUBCASE("an empty tensor, with NULL data") {
    auto p = produce(nullptr, {0, 3}, kF32);
    const Tensor t = from_dlpack(&p->managed, cpu());
    CHECK(p->deletes == 1);
    CHECK(t.shape() == Shape{0, 3});
    CHECK(t.numel() == 0);
  }
}

TEST_CASE("dlpack: to_dlpack on a device that is not host_visible returns a compact host copy") {
  const Tensor t = Tensor::from_vector<float>(opaque(), {2, 2}, {1, 2, 3, 4});
  Exported e(to_dlpack(t));
  CHECK(e.dl().device.device_type == kDLCPU);
  CHECK(dims(e.dl(), e.dl().strides) == std::vector<int64_t>{2, 1});
  CHECK(reinterpret_cast<uintptr_t>(e.dl().data) % 256 == 0);
  CHECK(std::vector<float>(e.data<float>(), e.data<float>() + 4) == std::vector<float>{1, 2, 3, 4});
  e.data<float>()[0] = 9.0f;  // the copy is the consumer's; the tensor is unchanged
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  // An empty tensor still gets a non-NULL data pointer.
  Exported empty(to_dlpack(Tensor::from_vector<float>(opaque(), {0}, {})));
  CHECK(empty.dl().data != nullptr);
}

TEST_CASE("dlpack: to_dlpack of an undefined tensor is invalid_argument") {
  CHECK(error_from([] { to_dlpack(Tensor()); }).code() == Errc::invalid_argument);
}

TEST_CASE("dlpack: invalid imports throw, naming the field, and run the deleter exactly once") {
  std::vector<float> data(16, 1.0f);
  struct Case {
    const char* name;
    void (*mutate)(DLTensor&);
    Errc code;
    const char* field;
  };
  // clang-format off
  const Case cases[] = {
      {"vector lanes", [](DLTensor& t) { t.dtype.lanes = 4; }, Errc::dtype_mismatch, "dl_tensor.dtype"},
      {"complex", [](DLTensor& t) { t.dtype = {kDLComplex, 64, 1}; }, Errc::dtype_mismatch, "dl_tensor.dtype"},
      {"int16", [](DLTensor& t) { t.dtype = {kDLInt, 16, 1}; }, Errc::dtype_mismatch, "dl_tensor.dtype"},
      {"uint32", [](DLTensor& t) { t.dtype = {kDLUInt, 32, 1}; }, Errc::dtype_mismatch, "dl_tensor.dtype"},
      {"float8", [](DLTensor& t) { t.dtype = {kDLFloat, 8, 1}; }, Errc::dtype_mismatch, "dl_tensor.dtype"},
      {"opaque handle", [](DLTensor& t) { t.dtype = {kDLOpaqueHandle, 64, 1}; }, Errc::dtype_mismatch,
       "dl_tensor.dtype"},
      {"unknown code", [](DLTensor& t) { t.dtype = {200, 32, 1}; }, Errc::dtype_mismatch, "dl_tensor.dtype"},
      {"negative ndim", [](DLTensor& t) { t.ndim = -1; }, Errc::invalid_argument, "dl_tensor.ndim"},
      {"ndim above 8", [](DLTensor& t) { t.ndim = 9; }, Errc::invalid_argument, "dl_tensor.ndim"},
      {"NULL shape", [](DLTensor& t) { t.shape = nullptr; }, Errc::invalid_argument, "dl_tensor.shape"},
      {"negative extent", [](DLTensor& t) { t.shape[1] = -2; }, Errc::invalid_argument, "dl_tensor.shape"},
      {"extent overflow", [](DLTensor& t) { t.shape[0] = INT64_MAX / 2; }, Errc::invalid_argument,
       "dl_tensor.shape"},
      {"NULL data", [](DLTensor& t) { t.data = nullptr; }, Errc::invalid_argument, "dl_tensor.data"},
      {"CUDA memory", [](DLTensor& t) { t.device = {kDLCUDA, 0}; }, Errc::invalid_argument,
       "dl_tensor.device"},
      {"stride overflow", [](DLTensor& t) { t.strides[0] = INT64_MAX / 2; }, Errc::invalid_argument,
       "dl_tensor.strides"},
      {"stride below address 0", [](DLTensor& t) { t.strides[0] = -(INT64_MAX / 8); }, Errc::invalid_argument,
       "dl_tensor.strides"},
      {"byte_offset past the address space", [](DLTensor& t) { t.byte_offset = UINT64_MAX - 2; },
       Errc::invalid_argument, "dl_tensor.byte_offset"},
  };
  // clang-format on
  for (const Device& device : {cpu(), opaque()}) {
    for (const auto& c : cases) {
      CAPTURE(c.name);
      CAPTURE(device.id());
      auto p = produce(data.data(), {2, 4}, kF32, {4, 1});
      c.mutate(p->managed.dl_tensor);
      const Error e = error_from([&] { from_dlpack(&p->managed, device); });
      CHECK(e.code() == c.code);
      BP_CHECK_CONTAINS(e.message(), c.field);
      BP_CHECK_CONTAINS(e.message(), "from_dlpack");
      CHECK(p->deletes == 1);
    }
  }
}

TEST_CASE("dlpack: NULL tensor, invalid device, NULL deleter") {
  CHECK(error_from([] { from_dlpack(nullptr, cpu()); }).code() == Errc::invalid_argument);

  std::vector<float> data{1, 2};
  auto p = produce(data.data(), {2}, kF32);
  CHECK(error_from([&] { from_dlpack(&p->managed, Device()); }).code() == Errc::invalid_argument);
  CHECK(p->deletes == 1);

  // A producer without a deleter (allowed by DLPack): nothing to call, nothing breaks.
  auto q = produce(data.data(), {2}, kF32);
  q->managed.deleter = nullptr;
  Tensor t = from_dlpack(&q->managed, cpu());
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2});
  t = Tensor();
  CHECK(error_from([&] { from_dlpack(&q->managed, Device()); }).code() == Errc::invalid_argument);
  CHECK(q->deletes == 0);
}

namespace {

void count_release(void* ctx) { ++*static_cast<int*>(ctx); }
void ignore_log(void*, int32_t, const char*) {}

// Reads a status's code and frees it; BP_STATUS_OK for NULL. The message of
// a failure is logged with the test's output.
int32_t code_of(const bp_plugin_api* api, bp_status* st) {
  if (st == nullptr) return BP_STATUS_OK;
  const int32_t code = api->status_code(st);
  const char* message = api->status_message(st);
  MESSAGE("status " << code << ": " << std::string(message != nullptr ? message : ""));
  api->status_free(st);
  return code;
}

}  // namespace

TEST_CASE("dlpack: the cpu plugin's imported buffers share memory and release exactly once, refusals never") {
  // A private copy of the plugin, so calling its entry does not touch the
  // instance the registry loaded (its host log pointer is per library).
  TempDir dir;
  const fs::path copy = dir / "libbackplane_cpu_import_test.so";
  fs::copy_file(plugin_dir() / "libbackplane_cpu.so", copy);
  // The plugin loads its kernel library from its own folder.
  if (fs::exists(plugin_dir() / "libbackplane_cpu_engine.so"))
    fs::copy_file(plugin_dir() / "libbackplane_cpu_engine.so", dir / "libbackplane_cpu_engine.so");
  void* lib = ::dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  REQUIRE_MESSAGE(lib != nullptr, ::dlerror());
  auto entry = reinterpret_cast<bp_plugin_entry_fn>(::dlsym(lib, BP_PLUGIN_ENTRY_SYMBOL));
  REQUIRE((entry != nullptr));
  static const bp_host_api host{
      BP_HOST_API_STRUCT_SIZE, BP_ABI_MAJOR, BP_ABI_MINOR, nullptr, &ignore_log, nullptr, nullptr};
  const bp_plugin_api* api = entry(&host);
  REQUIRE(api != nullptr);
  REQUIRE((api->buffer_import != nullptr));
  REQUIRE((api->buffer_pointer != nullptr));
  bp_create_args create{BP_CREATE_ARGS_STRUCT_SIZE, "cpu", "{}", &host, nullptr};
  REQUIRE(code_of(api, api->create(&create)) == BP_STATUS_OK);
  bp_plugin* plugin = create.plugin;
  REQUIRE(plugin != nullptr);
  bp_device_count_args count{BP_DEVICE_COUNT_ARGS_STRUCT_SIZE, plugin,
                             0};  // enumeration comes before any use of a device
  REQUIRE(code_of(api, api->device_count(&count)) == BP_STATUS_OK);
  REQUIRE(count.num_devices >= 1);

  auto import = [&](int32_t dl_type, void* data, uint64_t size, int* releases, bp_buffer** out) {
    bp_buffer_import_args a{};
    a.struct_size = BP_BUFFER_IMPORT_ARGS_STRUCT_SIZE;
    a.plugin = plugin;
    a.device = 0;
    a.dl_device_type = dl_type;
    a.data = data;
    a.size = size;
    a.release = &count_release;
    a.release_ctx = releases;
    const int32_t code = code_of(api, api->buffer_import(&a));
    *out = a.buffer;
    return code;
  };
  auto free_buffer = [&](bp_buffer* b) {
    bp_buffer_free_args a{BP_BUFFER_FREE_ARGS_STRUCT_SIZE, plugin, b};
    return code_of(api, api->buffer_free(&a));
  };
  auto copy_args = [&](bp_buffer* b, uint64_t offset, uint64_t size) {
    bp_buffer_copy_args a{};
    a.struct_size = BP_BUFFER_COPY_ARGS_STRUCT_SIZE;
    a.plugin = plugin;
    a.buffer = b;
    a.offset = offset;
    a.size = size;
    return a;
  };

  std::vector<float> data{1, 2, 3, 4};  // 16 bytes the plugin must never free
  int releases = 0;
  bp_buffer* buffer = nullptr;
  REQUIRE(import(BP_DL_CPU, data.data(), 16, &releases, &buffer) == BP_STATUS_OK);
  REQUIRE(buffer != nullptr);
  bp_buffer_pointer_args where{};
  where.struct_size = BP_BUFFER_POINTER_ARGS_STRUCT_SIZE;
  where.plugin = plugin;
  where.buffer = buffer;
  REQUIRE(code_of(api, api->buffer_pointer(&where)) == BP_STATUS_OK);
  CHECK(where.data == data.data());
  CHECK(where.dl_device_type == BP_DL_CPU);

  float out[2] = {0, 0};
  bp_buffer_copy_args read = copy_args(buffer, 8, 8);
  read.dst = out;
  CHECK(code_of(api, api->buffer_read(&read)) == BP_STATUS_OK);
  CHECK(out[0] == 3.0f);
  CHECK(out[1] == 4.0f);
  const float in[1] = {30.0f};
  bp_buffer_copy_args write = copy_args(buffer, 8, 4);
  write.src = in;
  CHECK(code_of(api, api->buffer_write(&write)) == BP_STATUS_OK);
  CHECK(data[2] == 30.0f);

  // Ops read the imported buffer like an owned one.
  bp_buffer_alloc_args alloc{};
  alloc.struct_size = BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE;
  alloc.plugin = plugin;
  alloc.size = 16;
  REQUIRE(code_of(api, api->buffer_alloc(&alloc)) == BP_STATUS_OK);
  const int64_t shape4[1] = {4}, unit[1] = {1};
  bp_op_attrs attrs{};
  attrs.struct_size = BP_OP_ATTRS_STRUCT_SIZE;
  const bp_tensor src{buffer, 0, 0, BP_DTYPE_F32, 1, 0, shape4, unit};
  const bp_tensor dst{alloc.buffer, 0, 0, BP_DTYPE_F32, 1, 0, shape4, unit};
  bp_execute_args exec{};
  exec.struct_size = BP_EXECUTE_ARGS_STRUCT_SIZE;
  exec.plugin = plugin;
  exec.op = BP_OP_COPY;
  exec.inputs = &src;
  exec.outputs = &dst;
  exec.num_inputs = 1;
  exec.num_outputs = 1;
  exec.attrs = &attrs;
  CHECK(code_of(api, api->execute(&exec)) == BP_STATUS_OK);
  float copied[4] = {};
  bp_buffer_copy_args back = copy_args(alloc.buffer, 0, 16);
  back.dst = copied;
  CHECK(code_of(api, api->buffer_read(&back)) == BP_STATUS_OK);
  CHECK(copied[2] == 30.0f);
  CHECK(free_buffer(alloc.buffer) == BP_STATUS_OK);
  CHECK(releases == 0);

  CHECK(free_buffer(buffer) == BP_STATUS_OK);
  CHECK(releases == 1);
  CHECK(data[3] == 4.0f);  // still ours (ASan would report a free of it at scope exit)

  // Memory it cannot use is refused as unsupported, and never released: the
  // caller keeps it (and may still copy from it).
  buffer = nullptr;
  int refused_releases = 0;
  CHECK(import(BP_DL_CUDA, data.data(), 16, &refused_releases, &buffer) == BP_STATUS_UNSUPPORTED);
  CHECK(buffer == nullptr);
  CHECK(refused_releases == 0);
  CHECK(data[3] == 4.0f);
  CHECK(releases == 1);
  // An empty imported buffer is a distinct, freeable handle.
  REQUIRE(import(BP_DL_CPU, nullptr, 0, &releases, &buffer) == BP_STATUS_OK);
  REQUIRE(buffer != nullptr);
  CHECK(releases == 1);
  CHECK(free_buffer(buffer) == BP_STATUS_OK);
  CHECK(releases == 2);
  CHECK(refused_releases == 0);
  api->destroy(plugin);
}
