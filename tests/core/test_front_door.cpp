// What a new user meets first in the library: Tensor::to_string() with values
// (summarised like NumPy), a printable CollectiveFallback, and "did you mean"
// for a default_backend that names no backend.
#include "test_support.hpp"

#include <backplane/backplane.hpp>

#include <algorithm>
#include <numeric>
#include <sstream>

using namespace bptest;
using namespace backplane;

namespace {

Registry cpu_registry() { return load(config_json({backend_json("cpu", "backplane_cpu", true)})); }

std::size_t count(const std::string& text, std::string_view part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

}  // namespace

// ---- Tensor::to_string ---------------------------------------------------------

TEST_CASE("front door: to_string shows a small tensor's values with its shape, dtype and device") {
  Registry r = cpu_registry();
  const Device d = r.backend("cpu").device(0);
  CHECK(Tensor::from_vector<float>(d, {2, 3}, {1, 2.5f, 3, 4, 5, -6}).to_string() ==
        "Tensor([[ 1., 2.5,  3.],\n"
        "        [ 4.,  5., -6.]], shape=[2, 3], dtype=f32, device=cpu:0)");
  CHECK(Tensor::from_vector<int64_t>(d, {3}, {7, -8, 9}).to_string() ==
        "Tensor([ 7, -8,  9], shape=[3], dtype=i64, device=cpu:0)");
  CHECK(Tensor::from_vector<bool>(d, {2}, {true, false}).to_string() ==
        "Tensor([ true, false], shape=[2], dtype=bool, device=cpu:0)");
  CHECK(Tensor::from_vector<double>(d, {}, {2.5}).to_string() ==
        "Tensor(2.5, shape=[], dtype=f64, device=cpu:0)");
  CHECK(Tensor::from_vector<float>(d, {0}, {}).to_string() ==
        "Tensor([], shape=[0], dtype=f32, device=cpu:0)");
}

TEST_CASE("front door: to_string of a view shows the view's values") {
  Registry r = cpu_registry();
  const Device d = r.backend("cpu").device(0);
  const Tensor t = transpose(Tensor::from_vector<int32_t>(d, {2, 2}, {1, 2, 3, 4}), 0, 1);
  CHECK(t.to_string() == "Tensor([[1, 3],\n        [2, 4]], shape=[2, 2], dtype=i32, device=cpu:0)");
}

TEST_CASE("front door: to_string summarises a tensor of more than 1000 elements to 3 per edge") {
  Registry r = cpu_registry();
  const Device d = r.backend("cpu").device(0);
  std::vector<int32_t> values(40 * 50);
  std::iota(values.begin(), values.end(), 0);
  const std::string text = Tensor::from_vector<int32_t>(d, {40, 50}, values).to_string();
  INFO(text);
  CHECK(text.rfind("Tensor([[   0,    1,    2, ...,   47,   48,   49],\n", 0) == 0);
  BP_CHECK_CONTAINS(text, "        ...,\n");
  BP_CHECK_CONTAINS(text,
                    "[1950, 1951, 1952, ..., 1997, 1998, 1999]], shape=[40, 50], dtype=i32, device=cpu:0)");
  CHECK(count(text, "\n") == 6);  // between 6 rows and the "..." row
  CHECK(text.find("1000") == std::string::npos);

  // The same rule through a strided view, and at rank 3 (blank line between blocks).
  const Tensor view = transpose(Tensor::from_vector<int32_t>(d, {40, 50}, values), 0, 1);
  const std::string vt = view.to_string();
  INFO(vt);
  CHECK(vt.rfind("Tensor([[   0,   50,  100, ..., 1850, 1900, 1950],\n", 0) == 0);
  std::vector<float> cube(11 * 11 * 11, 0.5f);
  const std::string ct = Tensor::from_vector<float>(d, {11, 11, 11}, cube).to_string();
  INFO(ct);
  CHECK(count(ct, "0.5") == 6 * 6 * 6);
  BP_CHECK_CONTAINS(ct, "]],\n\n        [[");
}

TEST_CASE("front door: to_string reads a tensor of a device that is not host-visible") {
  Registry r = load(config_json({backend_json("opaque", "opaque", true)}));
  const Device d = r.backend("opaque").device(0);
  REQUIRE_FALSE(d.capabilities().has(Capability::host_visible));
  CHECK(Tensor::from_vector<float>(d, {3}, {1, 2, 3}).to_string() ==
        "Tensor([1., 2., 3.], shape=[3], dtype=f32, device=opaque:0)");
  std::vector<float> big(2000);
  std::iota(big.begin(), big.end(), 0.0f);
  CHECK(Tensor::from_vector<float>(d, {2000}, big).to_string() ==
        "Tensor([   0.,    1.,    2., ..., 1997., 1998., 1999.], shape=[2000], dtype=f32, device=opaque:0)");
}

TEST_CASE("front door: to_string shows NaN and infinities as NumPy does") {
  Registry r = cpu_registry();
  const Device d = r.backend("cpu").device(0);
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(Tensor::from_vector<double>(d, {3}, {std::nan(""), inf, -inf}).to_string() ==
        "Tensor([ nan,  inf, -inf], shape=[3], dtype=f64, device=cpu:0)");
}

// ---- CollectiveFallback --------------------------------------------------------

TEST_CASE("front door: CollectiveFallback prints with << and to_string as backends.json spells it") {
  CollectiveFallback host;
  host.kind = CollectiveFallback::Kind::host;
  host.host_backend = "cpu";
  std::ostringstream out;
  out << host << " " << CollectiveFallback{} << " " << CollectiveFallback::Kind::local;
  CHECK(out.str() == "host:cpu error local");
  CHECK(to_string(host) == "host:cpu");
  CHECK(to_string(CollectiveFallback::Kind::host) == "host");

  Registry r =
      load(config_json({backend_json("cpu", "backplane_cpu", true, R"("collective_fallback": "local")")}));
  std::ostringstream fb;
  fb << r.backend("cpu").collective_fallback();
  CHECK(fb.str() == "local");
}

// ---- did you mean ----------------------------------------------------------------

TEST_CASE("front door: Registry::backend for an unknown name suggests the closest one and lists them all") {
  Registry r = load(config_json({backend_json("cpu", "backplane_cpu"), backend_json("opaque", "opaque")}));
  const Error e = error_from([&] { (void)r.backend("cpuu"); });
  CHECK(e.code() == Errc::not_found);
  BP_CHECK_CONTAINS(e.message(), "no backend named \"cpuu\" in the config (did you mean \"cpu\"?)");
  BP_CHECK_CONTAINS(e.message(), "configured: cpu, opaque");
  const Error far = error_from([&] { (void)r.backend("something_else"); });
  CHECK(far.code() == Errc::not_found);
  CHECK(far.message().find("did you mean") == std::string::npos);
  BP_CHECK_CONTAINS(far.message(), "configured: cpu, opaque");
}

TEST_CASE("front door: a library not found suggests the closest plugin library in the folders searched") {
  Registry r = load(config_json({backend_json("cpu", "backplane_cpuu"), backend_json("far", "xyz_plugin")}));
  const std::string near = expect_failed(r.backend("cpu"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(near, "library \"backplane_cpuu\" not found (did you mean \"backplane_cpu\"?); tried:");
  const std::string far = expect_failed(r.backend("far"), Errc::plugin_load_failed);
  CHECK(far.find("did you mean") == std::string::npos);
}

TEST_CASE("front door: a default_backend naming no backend suggests the closest name") {
  const Error e = error_from([] {
    load(config_json({backend_json("cpu", "backplane_cpu"), backend_json("opaque", "opaque")},
                     R"("default_backend": "cpuu")"));
  });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "default_backend: \"cpuu\" is not the name of any entry in backends");
  BP_CHECK_CONTAINS(e.message(), "(did you mean \"cpu\"?)");
  BP_CHECK_CONTAINS(e.message(), "configured: \"cpu\", \"opaque\"");
  const Error far = error_from([] {
    load(config_json({backend_json("cpu", "backplane_cpu")}, R"("default_backend": "something_else")"));
  });
  CHECK(far.message().find("did you mean") == std::string::npos);
}
