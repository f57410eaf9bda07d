// Tests of the core's validation in front of the plugin (on the real cpu
// plugin): element counts, dtypes, shapes, broadcasting, devices. Kernel
// values live in test_ops.cpp; these are about what never reaches a kernel.
#include "test_support.hpp"

using namespace backplane;
using namespace bptest;

namespace {

struct Cpu {
  Registry registry =
      load(config_json({backend_json("cpu", "backplane_cpu"), backend_json("good", "good_c")}));
  Device device = registry.backend("cpu").device(0);
};

}  // namespace

TEST_CASE("tensor: from_vector with the wrong number of values throws invalid_argument") {
  Cpu cpu;
  Error e = error_from([&] { Tensor::from_vector<float>(cpu.device, {2, 3}, {1, 2, 3, 4, 5}); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "[2, 3]");
}

TEST_CASE("tensor: a negative extent throws invalid_argument") {
  Cpu cpu;
  Error e = error_from([&] { Tensor::empty(cpu.device, {2, -1}, DType::f32); });
  CHECK(e.code() == Errc::invalid_argument);
}

TEST_CASE("tensor: describes its shape dtype and device") {
  Cpu cpu;
  Tensor t = Tensor::from_vector<float>(cpu.device, {2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(t.defined());
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.strides() == Shape{3, 1});
  CHECK(t.rank() == 2);
  CHECK(t.numel() == 6);
  CHECK(t.dtype() == DType::f32);
  CHECK(t.nbytes() == 24);
  CHECK(t.is_contiguous());
  CHECK(t.device() == cpu.device);
  CHECK(t.to_string() ==
        "Tensor([[1., 2., 3.],\n        [4., 5., 6.]], shape=[2, 3], dtype=f32, device=cpu:0)");
  Tensor s = Tensor::from_vector<double>(cpu.device, {}, {2.5});
  CHECK(s.rank() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.to_vector<double>() == std::vector<double>{2.5});
}

TEST_CASE("tensor: an undefined tensor throws invalid_argument when used") {
  Tensor t;
  CHECK_FALSE(t.defined());
  Error e = error_from([&] { t.shape(); });
  CHECK(e.code() == Errc::invalid_argument);
}

TEST_CASE("tensor: to_vector of another element type throws dtype_mismatch") {
  Cpu cpu;
  Tensor t = Tensor::from_vector<float>(cpu.device, {2}, {1, 2});
  Error e = error_from([&] { t.to_vector<double>(); });
  CHECK(e.code() == Errc::dtype_mismatch);
  BP_CHECK_CONTAINS(e.message(), "f32");
  BP_CHECK_CONTAINS(e.message(), "f64");
}

TEST_CASE("tensor: read_into with a wrong count throws invalid_argument") {
  Cpu cpu;
  Tensor t = Tensor::from_vector<float>(cpu.device, {3}, {1, 2, 3});
  std::vector<float> out(2);
  Error e = error_from([&] { t.read_into(DType::f32, out.data(), out.size()); });
  CHECK(e.code() == Errc::invalid_argument);
}

TEST_CASE("tensor: adding f32 and f64 throws dtype_mismatch") {
  Cpu cpu;
  Tensor a = Tensor::from_vector<float>(cpu.device, {2}, {1, 2});
  Tensor b = Tensor::from_vector<double>(cpu.device, {2}, {1, 2});
  Error e = error_from([&] { add(a, b); });
  CHECK(e.code() == Errc::dtype_mismatch);
  BP_CHECK_CONTAINS(e.message(), "f32");
  BP_CHECK_CONTAINS(e.message(), "f64");
}

TEST_CASE("tensor: adding shapes that do not broadcast throws shape_mismatch naming both") {
  Cpu cpu;
  Tensor a = Tensor::from_vector<float>(cpu.device, {2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from_vector<float>(cpu.device, {4}, {1, 2, 3, 4});
  Error e = error_from([&] { add(a, b); });
  CHECK(e.code() == Errc::shape_mismatch);
  BP_CHECK_CONTAINS(e.message(), "[2, 3]");
  BP_CHECK_CONTAINS(e.message(), "[4]");
}

TEST_CASE("tensor: broadcast_shapes follows NumPy rules") {
  CHECK(broadcast_shapes({2, 1, 3}, {4, 1}) == Shape{2, 4, 3});
  CHECK(broadcast_shapes({3}, {}) == Shape{3});
  CHECK(broadcast_shapes({}, {}) == Shape{});
  CHECK(broadcast_shapes({5, 1}, {1, 0}) == Shape{5, 0});
  CHECK(broadcast_shapes({1}, {7}) == Shape{7});
  Error e = error_from([] { broadcast_shapes({2, 3}, {4}); });
  CHECK(e.code() == Errc::shape_mismatch);
  BP_CHECK_CONTAINS(e.message(), "[2, 3]");
  BP_CHECK_CONTAINS(e.message(), "[4]");
}

TEST_CASE("tensor: operands on different backends throw device_mismatch") {
  Cpu cpu;
  Device other = cpu.registry.backend("good").device(0);
  Tensor a = Tensor::from_vector<float>(cpu.device, {2}, {1, 2});
  Tensor b = Tensor::from_vector<float>(other, {2}, {3, 4});
  Error e = error_from([&] { add(a, b); });
  CHECK(e.code() == Errc::device_mismatch);
  BP_CHECK_CONTAINS(e.message(), "cpu:0");
  BP_CHECK_CONTAINS(e.message(), "good:0");
}

TEST_CASE("tensor: matmul of 2x3 by 2x3 throws shape_mismatch") {
  Cpu cpu;
  Tensor a = Tensor::from_vector<float>(cpu.device, {2, 3}, {1, 2, 3, 4, 5, 6});
  Error e = error_from([&] { matmul(a, a); });
  CHECK(e.code() == Errc::shape_mismatch);
  BP_CHECK_CONTAINS(e.message(), "[2, 3]");
}

TEST_CASE("tensor: matmul of a 1-D operand throws shape_mismatch") {
  Cpu cpu;
  Tensor a = Tensor::from_vector<float>(cpu.device, {3}, {1, 2, 3});
  Tensor b = Tensor::from_vector<float>(cpu.device, {3, 1}, {1, 2, 3});
  Error e = error_from([&] { matmul(a, b); });
  CHECK(e.code() == Errc::shape_mismatch);
}

TEST_CASE("tensor: the cpu plugin declares the documented capabilities") {
  Cpu cpu;
  const Capabilities caps = cpu.device.capabilities();
  CHECK(caps.has(Capability::host_visible));
  CHECK(caps.has(Capability::matmul));
  // Every dtype the core knows: the cpu plugin holds them all.
  for (Capability dtype :
       {Capability::f32, Capability::f64, Capability::i32, Capability::i64, Capability::bool_,
        Capability::f16, Capability::bf16, Capability::u8, Capability::i8})
    CHECK_MESSAGE(caps.has(dtype), to_string(dtype));
  CHECK(caps.has(Capability::collective));  // Gloo
  CHECK(cpu.device.id() == "cpu:0");
}
