// Exception isolation of plugin entries: a C++ plugin whose extern "C"
// entries throw (an int, or a std exception) without plugin.hpp's wrappers
// fails only its own backend at load, or only the one call afterwards, as
// Errc::internal; the rest of the registry and the process carry on.
#include "test_support.hpp"

using namespace backplane;
using namespace bptest;

namespace {

// A backend "thrower" using the throws_nonstd fixture, throwing in `entry`,
// beside a good C backend.
std::string thrower_config(std::string_view entry, bool required = false) {
  const std::string options = "\"options\": {\"throw_in\": " + json_string(entry) + "}";
  return config_json(
      {backend_json("thrower", "throws_nonstd", required, options), backend_json("good", "good_c")});
}

}  // namespace

TEST_CASE("plugin_exceptions: an int thrown from create fails only that backend, naming plugin and type") {
  Registry r = load(thrower_config("create"));
  const std::string message = expect_failed(r.backend("thrower"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(message, "backend \"thrower\"");
  BP_CHECK_CONTAINS(message, "throws_nonstd");
  BP_CHECK_CONTAINS(message, "plugin entry create threw a non-standard exception (of type int)");
  BP_CHECK_CONTAINS(message, "BP_DEFINE_PLUGIN");
  expect_loaded(r.backend("good"));
}

TEST_CASE("plugin_exceptions: a std exception from a raw create entry names its type and what()") {
  Registry r = load(thrower_config("create_std"));
  const std::string message = expect_failed(r.backend("thrower"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(
      message, "plugin entry create threw an exception (std::runtime_error: throws_nonstd: create exploded)");
  expect_loaded(r.backend("good"));
}

TEST_CASE("plugin_exceptions: an int thrown from device_count or device_info fails only that backend") {
  for (const char* entry : {"device_count", "device_info"}) {
    CAPTURE(entry);
    Registry r = load(thrower_config(entry));
    const std::string message = expect_failed(r.backend("thrower"), Errc::plugin_load_failed);
    BP_CHECK_CONTAINS(message, std::string("plugin entry ") + entry + " threw a non-standard exception");
    CHECK(r.backend("thrower").device_count() == 0);
    expect_loaded(r.backend("good"));
  }
}

TEST_CASE(
    "plugin_exceptions: a required backend whose entry throws fails from_config with a backplane::Error") {
  Error e = error_from([] { load(thrower_config("create", true), RequiredPolicy::throw_on_failure); });
  CHECK(e.code() == Errc::backend_unavailable);
  BP_CHECK_CONTAINS(e.message(), "threw a non-standard exception");
}

TEST_CASE("plugin_exceptions: after loading, a throwing entry fails that one call as internal") {
  SUBCASE("device_memory") {
    Registry r = load(thrower_config("device_memory"));
    Device d = r.backend("thrower").device(0);
    Error e = error_from([&] { (void)d.memory(); });
    CHECK(e.code() == Errc::internal);
    BP_CHECK_CONTAINS(e.message(), "plugin entry device_memory threw a non-standard exception (of type int)");
    // The backend is still usable for what does not throw.
    CHECK(d.capabilities().has(Capability::f32));
  }
  SUBCASE("supports_op") {
    Registry r = load(thrower_config("supports_op"));
    Device d = r.backend("thrower").device(0);
    Error e = error_from([&] { (void)d.supports(backplane::Op::add, DType::f32); });
    CHECK(e.code() == Errc::internal);
    BP_CHECK_CONTAINS(e.message(), "plugin entry supports_op threw a non-standard exception");
  }
  SUBCASE("buffer_write") {
    Registry r = load(thrower_config("buffer_write"));
    Device d = r.backend("thrower").device(0);
    Error e = error_from([&] { (void)Tensor::from_vector<float>(d, {2}, {1.0F, 2.0F}); });
    CHECK(e.code() == Errc::internal);
    BP_CHECK_CONTAINS(e.message(), "plugin entry buffer_write threw a non-standard exception");
    // The next call that does not throw still works.
    CHECK(d.memory().has_value());
  }
}

TEST_CASE(
    "plugin_exceptions: an int thrown from destroy when the registry goes away does not end the process") {
  {
    Registry r = load(thrower_config("destroy"));
    expect_loaded(r.backend("thrower"));
  }  // ~BackendImpl calls destroy, which throws: logged, never std::terminate
  Registry again = load(thrower_config("nothing"));
  expect_loaded(again.backend("thrower"));
}
