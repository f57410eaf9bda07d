// Exception isolation of plugin entries: a C++ plugin whose extern "C"
// entries throw (an int, or a std exception) without plugin.hpp's wrappers
// fails only its own backend at load, or only the one call afterwards, as
// Errc::internal; the rest of the registry and the process carry on.
#include "test_support.hpp"

#include <dlpack/dlpack.h>

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

TEST_CASE("plugin_exceptions: execute, buffer and DLPack entries that throw fail that call as internal") {
  Registry r = load(thrower_config("nothing"));  // the fixture's good path, for comparison
  expect_adds(r.backend("good").device(0));
  CHECK(r.backend("thrower").device(0).capabilities().has(Capability::collective));

  // Each throwing entry, the call that reaches it, and what must still work afterwards.
  struct Case {
    const char* entry;
    void (*call)(const Device& thrower, const Device& good);
  };
  const Case cases[] = {
      {"execute",
       [](const Device& d, const Device&) {
         const Tensor a = Tensor::from_vector<float>(d, {2}, {1.0F, 2.0F});
         (void)add(a, a);
       }},
      {"buffer_alloc", [](const Device& d, const Device&) { (void)Tensor::empty(d, {4}, DType::f32); }},
      {"buffer_read",
       [](const Device& d, const Device&) {
         (void)Tensor::from_vector<float>(d, {2}, {1.0F, 2.0F}).to_vector<float>();
       }},
      {"buffer_pointer",
       [](const Device& d, const Device&) {
         DLManagedTensor* m = to_dlpack(Tensor::from_vector<float>(d, {2}, {1.0F, 2.0F}));
         if (m != nullptr && m->deleter != nullptr) m->deleter(m);  // not reached: to_dlpack throws
       }},
      {"buffer_import",
       [](const Device& d, const Device& good) {
         // Host memory from the good backend offered to the thrower; its deleter still runs once.
         (void)from_dlpack(to_dlpack(Tensor::from_vector<float>(good, {2}, {1.0F, 2.0F})), d);
       }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.entry);
    Registry reg = load(thrower_config(c.entry));
    const Device d = reg.backend("thrower").device(0);
    const Device good = reg.backend("good").device(0);
    const Error e = error_from([&] { c.call(d, good); });
    CHECK(e.code() == Errc::internal);
    BP_CHECK_CONTAINS(e.message(), "backend \"thrower\"");
    BP_CHECK_CONTAINS(e.message(), "throws_nonstd");
    BP_CHECK_CONTAINS(e.message(), std::string("plugin entry ") + c.entry +
                                       " threw a non-standard exception (of type int)");
    // The process goes on: the other backend computes, and so does this one where nothing throws.
    expect_adds(good);
    CHECK(d.memory().has_value());
  }
}

TEST_CASE("plugin_exceptions: a buffer_pointer that throws while copying between devices fails as internal") {
  Registry r = load(thrower_config("buffer_pointer"));
  const Tensor t = Tensor::from_vector<float>(r.backend("thrower").device(0), {2}, {1.0F, 2.0F});
  const Error e = error_from([&] { (void)t.to(r.backend("good").device(0)); });
  CHECK(e.code() == Errc::internal);
  BP_CHECK_CONTAINS(e.message(), "plugin entry buffer_pointer threw a non-standard exception");
  expect_adds(r.backend("good").device(0));
}

TEST_CASE("plugin_exceptions: a failed copy between devices names the call, the step and the device") {
  // cpp_throws fails buffer_read with a status (its exception, through the
  // SDK) and is not host_visible then: to() and copy_ read through it.
  Registry r = load(
      config_json({backend_json("throws", "cpp_throws", false, R"("options": {"throw_in": "buffer_read"})"),
                   backend_json("good", "good_c")}));
  const Device good = r.backend("good").device(0);
  const Tensor t = Tensor::from_vector<float>(r.backend("throws").device(0), {2}, {1.0F, 2.0F});
  const Error to_error = error_from([&] { (void)t.to(good); });
  BP_CHECK_CONTAINS(to_error.message(), "to: buffer_read from throws:0");
  BP_CHECK_CONTAINS(to_error.message(), "cpp_throws: buffer_read exploded");
  const Tensor dst = zeros(good, {2});
  const Error copy_error = error_from([&] { dst.copy_(t); });
  BP_CHECK_CONTAINS(copy_error.message(), "Tensor::copy_: buffer_read from throws:0");
  CHECK(dst.to_vector<float>() == std::vector<float>{0.0F, 0.0F});  // nothing half-written
}

TEST_CASE("plugin_exceptions: a buffer_free that throws is logged when the tensor goes away") {
  LogCapture log(LogLevel::warning);
  {
    Registry r = load(thrower_config("buffer_free"));
    const Tensor t = Tensor::empty(r.backend("thrower").device(0), {4}, DType::f32);
  }  // ~Storage calls buffer_free, which throws: logged, never std::terminate
  const std::vector<std::string> warned = log.at(LogLevel::warning, "plugin entry buffer_free threw");
  REQUIRE(warned.size() == 1);
  BP_CHECK_CONTAINS(warned[0], "backend \"thrower\"");
}

TEST_CASE(
    "plugin_exceptions: a collective entry that throws fails that call as internal and aborts the group") {
  using namespace std::chrono_literals;
  struct Case {
    const char* entry;
    void (*call)(ProcessGroup& group, const Tensor& t);
  };
  const Case cases[] = {
      {"all_reduce", [](ProcessGroup& g, const Tensor& t) { (void)g.all_reduce(t, ReduceOp::sum); }},
      {"all_reduce",
       [](ProcessGroup& g, const Tensor& t) {
         Tensor in_place = t;
         g.all_reduce_(in_place, ReduceOp::sum);
       }},
      {"broadcast", [](ProcessGroup& g, const Tensor& t) { (void)g.broadcast(t, 0); }},
      {"all_gather", [](ProcessGroup& g, const Tensor& t) { (void)g.all_gather(t); }},
      {"reduce_scatter", [](ProcessGroup& g, const Tensor& t) { (void)g.reduce_scatter(t, ReduceOp::sum); }},
      {"barrier", [](ProcessGroup& g, const Tensor&) { g.barrier(); }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.entry);
    Registry r = load(thrower_config(c.entry));
    const Device d = r.backend("thrower").device(0);
    ProcessGroup group = ProcessGroup::create(d, Rendezvous::single_process(5s));
    REQUIRE(!group.is_local());
    const Tensor t = Tensor::from_vector<float>(d, {1, 2}, {1.0F, 2.0F});  // leading axis = world_size
    const Error e = error_from([&] { c.call(group, t); });
    CHECK(e.code() == Errc::internal);
    BP_CHECK_CONTAINS(e.message(), std::string("plugin entry ") + c.entry +
                                       " threw a non-standard exception (of type int)");
    // The communicator is in an unknown state: the group was aborted, and says why.
    const Error next = error_from([&] { group.barrier(); });
    CHECK(next.code() == Errc::collective_error);
    BP_CHECK_CONTAINS(next.message(), std::string("plugin entry ") + c.entry + " threw");
    // The process goes on: the data is intact and the device computes.
    CHECK(t.to_vector<float>() == std::vector<float>{1.0F, 2.0F});
    expect_adds(r.backend("good").device(0));
  }
}

TEST_CASE("plugin_exceptions: a comm_create that throws fails ProcessGroup::create as internal") {
  using namespace std::chrono_literals;
  Registry r = load(thrower_config("comm_create"));
  const Error e = error_from(
      [&] { (void)ProcessGroup::create(r.backend("thrower").device(0), Rendezvous::single_process(5s)); });
  CHECK(e.code() == Errc::internal);
  BP_CHECK_CONTAINS(e.message(), "plugin entry comm_create threw a non-standard exception (of type int)");
  expect_adds(r.backend("good").device(0));
}

TEST_CASE("plugin_exceptions: a comm_abort or comm_destroy that throws is logged, never std::terminate") {
  using namespace std::chrono_literals;
  for (const char* entry : {"comm_abort", "comm_destroy"}) {
    CAPTURE(entry);
    LogCapture log(LogLevel::warning);
    Registry r = load(thrower_config(entry));
    {
      ProcessGroup group =
          ProcessGroup::create(r.backend("thrower").device(0), Rendezvous::single_process(5s));
      group.abort();  // calls comm_abort; the group is destroyed (comm_destroy) at the end of the scope
      CHECK(error_from([&] { group.barrier(); }).code() == Errc::collective_error);
    }
    const std::vector<std::string> warned =
        log.at(LogLevel::warning, std::string("plugin entry ") + entry + " threw");
    CHECK(warned.size() == 1);
    expect_adds(r.backend("good").device(0));
  }
}
