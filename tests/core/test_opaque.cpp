// Tests against the `opaque` fixture, whose bp_buffer* values are small
// integer ids the host would crash on if it dereferenced them: the core must
// move data only through buffer_write / buffer_read / execute. A crash here is
// a core bug (it touched plugin memory directly).
#include "test_support.hpp"

#include <backplane/abi.h>  // the plugin-side names these tests check against

using namespace backplane;
using namespace bptest;

namespace {

Device opaque_device(const Registry& r) {
  Backend b = r.backend("opaque");
  expect_loaded(b);
  return b.device(0);
}

}  // namespace

TEST_CASE("opaque: the device does not declare host_visible, only that it holds f32") {
  Registry r = load(config_json({backend_json("opaque", "opaque")}));
  Device d = opaque_device(r);
  CHECK(d.name() == "opaque:0");
  CHECK_FALSE(d.capabilities().has(Capability::host_visible));
  CHECK(d.capabilities().has(Capability::f32));
  CHECK(d.capabilities() == Capabilities(BP_CAP_F32));
  CHECK(d.supports(backplane::Op::add, DType::f32));
  CHECK(d.supports(backplane::Op::mul, DType::f32));
  CHECK_FALSE(d.supports(backplane::Op::add, DType::f64));
}

TEST_CASE("opaque: from_vector and to_vector round-trip through the ABI") {
  Registry r = load(config_json({backend_json("opaque", "opaque")}));
  Device d = opaque_device(r);
  const std::vector<float> values{1.5f, -2.0f, 3.25f, 0.0f, 1e6f, -7.0f};
  Tensor t = Tensor::from_vector<float>(d, {2, 3}, values);
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.dtype() == DType::f32);
  CHECK(t.device() == d);
  CHECK(t.to_vector<float>() == values);
}

TEST_CASE("opaque: add and mul with broadcasting give the right values") {
  Registry r = load(config_json({backend_json("opaque", "opaque")}));
  Device d = opaque_device(r);
  Tensor a = Tensor::from_vector<float>(d, {2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from_vector<float>(d, {3}, {10, 20, 30});
  Tensor s = add(a, b);
  CHECK(s.shape() == Shape{2, 3});
  CHECK(s.to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  Tensor col = Tensor::from_vector<float>(d, {2, 1}, {2, -1});
  Tensor p = mul(a, col);
  CHECK(p.to_vector<float>() == std::vector<float>{2, 4, 6, -4, -5, -6});
  // Chained ops: (a + b) * a, all on plugin memory.
  CHECK((s * a).to_vector<float>() == std::vector<float>{11, 44, 99, 56, 125, 216});
  // Inputs are unchanged.
  CHECK(a.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("opaque: contiguous and read_into work without host pointers") {
  Registry r = load(config_json({backend_json("opaque", "opaque")}));
  Device d = opaque_device(r);
  Tensor a = Tensor::from_vector<float>(d, {3}, {4, 5, 6});
  Tensor c = contiguous(a);
  CHECK(c.is_contiguous());
  CHECK(c.to_vector<float>() == std::vector<float>{4, 5, 6});
  float out[3] = {0, 0, 0};
  a.read_into(DType::f32, out, 3);
  CHECK(out[0] == 4);
  CHECK(out[1] == 5);
  CHECK(out[2] == 6);
}

TEST_CASE("opaque: tensors outlive the registry") {
  Tensor t;
  {
    Registry r = load(config_json({backend_json("opaque", "opaque")}));
    Device d = opaque_device(r);
    t = add(Tensor::from_vector<float>(d, {2}, {1, 2}), Tensor::from_vector<float>(d, {2}, {0.5f, 0.25f}));
  }
  CHECK(t.to_vector<float>() == std::vector<float>{1.5f, 2.25f});
}

TEST_CASE("opaque: a dtype the device does not flag is refused before anything reaches the plugin") {
  Registry r = load(config_json({backend_json("opaque", "opaque")}));
  Device d = opaque_device(r);
  Error e = error_from([&] { Tensor::from_vector<double>(d, {2}, {1.0, 2.0}); });
  CHECK(e.code() == Errc::capability_missing);
  BP_CHECK_CONTAINS(e.message(), "f64");
  BP_CHECK_CONTAINS(e.message(), "opaque:0");
  // The device is unharmed: f32 still round-trips.
  CHECK(Tensor::from_vector<float>(d, {2}, {1, 2}).to_vector<float>() == std::vector<float>{1, 2});
}
