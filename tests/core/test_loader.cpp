// Tests of the plugin loader: a C plugin loads and computes; every way a
// plugin can fail to load, and every rule of ABI 2 a plugin can break, leaves
// a failed backend with a typed code and a precise reason while its
// neighbours keep working; an unreachable device set leaves an unavailable
// backend; libraries are found in the documented order.
#include "test_support.hpp"

#include <backplane/abi.h>  // the plugin-side names these tests check against

#include <algorithm>
#include <atomic>
#include <cctype>
#include <thread>

using namespace backplane;
using namespace bptest;

namespace {

// A config with a working "good" backend and the backend under test,
// loaded without throwing; checks that "good" still works.
Registry load_next_to_good(const std::string& backend_under_test) {
  Registry r = load(config_json({backend_json("good", "good_c"), backend_under_test}));
  REQUIRE(r.backends().size() == 2);
  expect_loaded(r.backend("good"));
  expect_adds(r.backend("good").device(0));
  return r;
}

// {"schema_version": 1, "plugin_dirs": [dirs...], "backends": [{"name": "b", "library": library}]}
std::string resolution_config(const std::string& library, const std::vector<std::string>& plugin_dirs = {}) {
  std::string dirs;
  for (const auto& d : plugin_dirs) dirs += (dirs.empty() ? "" : ", ") + json_string(d);
  return "{\"schema_version\": 1, \"plugin_dirs\": [" + dirs + "], \"backends\": [" +
         backend_json("b", library) + "]}";
}

// This host's ABI version, "2.2".
std::string host_abi() { return std::to_string(BP_ABI_MAJOR) + "." + std::to_string(BP_ABI_MINOR); }

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// Whether a loader message names device `index` of `backend`: by index
// ("device 1") or by id ("backend:1").
bool names_device(const std::string& msg, const std::string& backend, int index) {
  const std::string i = std::to_string(index);
  return msg.find("device " + i) != std::string::npos || msg.find(backend + ":" + i) != std::string::npos;
}

// CHECKs that `text` does not contain `part` (the counterpart of BP_CHECK_CONTAINS).
#define BP_CHECK_ABSENT(text, part)                                          \
  do {                                                                       \
    const std::string bp_text_ = (text);                                     \
    const std::string bp_part_ = (part);                                     \
    CHECK_MESSAGE(bp_text_.find(bp_part_) == std::string::npos,              \
                  "did not expect \"" << bp_part_ << "\" in: " << bp_text_); \
  } while (0)

// The fixtures' never-called entries log this at error level when called.
constexpr const char* kNeverCalled = "must never be called";

// Loads a one-backend config with from_json and returns where "b" resolved.
fs::path resolved(const std::string& json, const fs::path& base_dir) {
  Registry r = Registry::from_json(json, base_dir, "resolution", RequiredPolicy::report);
  Backend b = r.backend("b");
  expect_loaded(b);
  return b.library_path();
}

}  // namespace

TEST_CASE("loader: a plugin written in C loads and describes itself and its device") {
  Registry r = load(config_json({backend_json("good", "good_c")}));
  Backend b = r.backend("good");
  expect_loaded(b);
  CHECK(b.name() == "good");
  CHECK(b.library() == "good_c");
  CHECK(fs::equivalent(b.library_path(), fixture("good_c")));
  CHECK(b.version() == "1.2.3");
  CHECK(b.abi_version() == host_abi());
  CHECK_FALSE(b.required());
  REQUIRE(b.device_count() == 1);
  CHECK(b.devices().size() == 1);
  CHECK(b.capabilities() == Capabilities(BP_CAP_HOST_VISIBLE | BP_CAP_F32));

  Device d = b.device(0);
  CHECK(d.valid());
  CHECK(d.index() == 0);
  CHECK(d.id() == "good:0");
  CHECK(d.name() == "fixture:0");
  CHECK(d.capabilities() == Capabilities(BP_CAP_HOST_VISIBLE | BP_CAP_F32));
  CHECK(d.capabilities().has(Capability::host_visible));
  CHECK(d.capabilities().has(Capability::f32));
  CHECK_FALSE(d.capabilities().has(Capability::f64));
  CHECK_FALSE(d.capabilities().has(Capability::collective));
  CHECK(d.backend().name() == "good");
  CHECK(d == b.devices()[0]);
  CHECK(d.supports(backplane::Op::add, DType::f32));
  CHECK_FALSE(d.supports(backplane::Op::mul, DType::f32));
  CHECK_FALSE(d.supports(backplane::Op::add, DType::f64));
  // device_memory is NULL in its table: not supported, never called.
  CHECK_FALSE(d.memory().has_value());
}

TEST_CASE("loader: a plugin written in C computes a broadcast add") {
  Registry r = load(config_json({backend_json("good", "good_c")}));
  Device d = r.backend("good").device(0);
  expect_adds(d);
  // A broadcast on both sides: [2,1] + [1,3] -> [2,3].
  Tensor col = Tensor::from_vector<float>(d, {2, 1}, {1, 2});
  Tensor row = Tensor::from_vector<float>(d, {1, 3}, {10, 20, 30});
  Tensor sum = add(col, row);
  CHECK(sum.shape() == Shape{2, 3});
  CHECK(sum.to_vector<float>() == std::vector<float>{11, 21, 31, 12, 22, 32});
  // FILL through the argument struct's attributes.
  CHECK(full(d, {3}, 2.5).to_vector<float>() == std::vector<float>{2.5f, 2.5f, 2.5f});
  CHECK(zeros(d, {2}, DType::f32).to_vector<float>() == std::vector<float>{0, 0});
}

TEST_CASE("loader: an op the device cannot run throws unsupported_op") {
  Registry r = load(config_json({backend_json("good", "good_c")}));
  Device d = r.backend("good").device(0);
  Tensor a = Tensor::from_vector<float>(d, {2}, {1, 2});
  Error e = error_from([&] { mul(a, a); });
  CHECK(e.code() == Errc::unsupported_op);
  BP_CHECK_CONTAINS(e.message(), "f32");
  BP_CHECK_CONTAINS(e.message(), "good");
}

TEST_CASE("loader: a device index out of range throws not_found") {
  Registry r = load(config_json({backend_json("good", "good_c")}));
  Error e = error_from([&] { r.backend("good").device(1); });
  CHECK(e.code() == Errc::not_found);
}

TEST_CASE("loader: a missing library fails with the spec and every location tried") {
  Registry r = load_next_to_good(backend_json("gone", "no_such_plugin_xyz"));
  Backend b = r.backend("gone");
  const std::string msg = expect_failed(b, Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "no_such_plugin_xyz");
  BP_CHECK_CONTAINS(msg, "not found");
  BP_CHECK_CONTAINS(msg, fixture_dir().string());
  BP_CHECK_CONTAINS(msg, plugin_dir().string());
  CHECK(b.library_path().empty());
  CHECK(b.version().empty());
}

TEST_CASE("loader: a file that is not a shared object fails with the path and the dlerror text") {
  const fs::path path = fixture("not_elf");
  REQUIRE(fs::exists(path));
  Registry r = load_next_to_good(backend_json("text", path.string()));
  const std::string msg = expect_failed(r.backend("text"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, path.string());
  CHECK_MESSAGE((msg.find("invalid ELF header") != std::string::npos ||
                 msg.find("file too short") != std::string::npos),
                "expected the dlerror text in: " << msg);
}

TEST_CASE("loader: a library without the entry symbol fails naming bp_plugin_entry") {
  Registry r = load_next_to_good(backend_json("noentry", "no_entry"));
  const std::string msg = expect_failed(r.backend("noentry"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "bp_plugin_entry");
}

TEST_CASE("loader: an entry that returns NULL fails saying so") {
  Registry r = load_next_to_good(backend_json("null", "entry_null"));
  const std::string msg = expect_failed(r.backend("null"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "NULL");
}

TEST_CASE("loader: a newer ABI major fails with abi_mismatch naming both versions") {
  Registry r = load_next_to_good(backend_json("future", "abi_major"));
  Backend b = r.backend("future");
  const std::string msg = expect_failed(b, Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "3.1");
  BP_CHECK_CONTAINS(msg, host_abi());
  CHECK(b.abi_version() == "3.1");
}

TEST_CASE("loader: a plugin built against ABI 1 is refused naming 1.1, this host's version and the remedy") {
  Registry r = load_next_to_good(backend_json("old", "abi1_plugin"));
  Backend b = r.backend("old");
  const std::string msg = expect_failed(b, Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "1.1");
  BP_CHECK_CONTAINS(msg, host_abi());
  BP_CHECK_CONTAINS(lower(msg), "rebuild");
  CHECK(b.abi_version() == "1.1");
  // Refused on the version alone: none of its 1.x entries ran (each one
  // would fail with a message saying so).
  BP_CHECK_ABSENT(msg, "a 1.x entry was called");
  CHECK(b.device_count() == 0);
}

TEST_CASE(
    "loader: a plugin built against a newer minor of this major loads, reading only the fields this host "
    "knows") {
  LogCapture logs;
  Registry r = load_next_to_good(backend_json("newer", "abi_newer_minor"));
  Backend b = r.backend("newer");
  expect_loaded(b);
  CHECK(b.abi_version() == std::to_string(BP_ABI_MAJOR) + "." + std::to_string(BP_ABI_MINOR + 3));
  Device d = b.device(0);
  CHECK(d.capabilities() == Capabilities(BP_CAP_HOST_VISIBLE | BP_CAP_F32));
  expect_adds(d);
  d.synchronize();
  CHECK(logs.at(LogLevel::error, kNeverCalled).empty());
}

TEST_CASE("loader: required entries left NULL are rejected naming each of them and no other") {
  Registry r = load_next_to_good(backend_json("holes", "missing_entries"));
  Backend b = r.backend("holes");
  const std::string msg = expect_failed(b, Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "device_count");
  BP_CHECK_CONTAINS(msg, "buffer_read");
  for (const char* set :
       {"buffer_write", "buffer_alloc", "device_info", "supports_op", "execute", "status_free"})
    BP_CHECK_ABSENT(msg, set);
  CHECK(b.device_count() == 0);
}

TEST_CASE("loader: a table whose struct_size hides required entries fails with abi_mismatch") {
  Registry r = load_next_to_good(backend_json("small", "struct_small"));
  const std::string msg = expect_failed(r.backend("small"), Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "struct_size");
}

TEST_CASE(
    "loader: a table cut short after the required entries loads, and the entries beyond it are never "
    "called") {
  // struct_short's struct_size ends after execute; the memory beyond holds
  // non-NULL entries that log an error when called. The host must read them
  // as NULL: a synchronous device's synchronize() then calls nothing.
  LogCapture logs;
  Registry r = load_next_to_good(backend_json("short", "struct_short"));
  Backend b = r.backend("short");
  expect_loaded(b);
  CHECK(b.abi_version() == host_abi());
  REQUIRE(b.device_count() == 1);
  Device d = b.device(0);
  CHECK(d.capabilities() == Capabilities(BP_CAP_HOST_VISIBLE | BP_CAP_F32));
  expect_adds(d);
  d.synchronize();
  // The device computes on, and no log line came from an entry beyond struct_size.
  CHECK(full(d, {2}, 4.0).to_vector<float>() == std::vector<float>{4, 4});
  CHECK_MESSAGE(logs.at(LogLevel::error, kNeverCalled).empty(), "logs: " << logs.all());
}

TEST_CASE(
    "loader: a table sized by sizeof (2.1) or by the end of its last entry (2.2) loads, and one byte short "
    "of an "
    "entry, the entry is absent") {
  // struct_sized: an async device; its synchronize logs when called.
  for (const char* library : {"struct_sized_sizeof", "struct_sized_exact"}) {
    CAPTURE(library);
    LogCapture logs;
    Registry r = load_next_to_good(backend_json("sized", library));
    Backend b = r.backend("sized");
    expect_loaded(b);
    REQUIRE(b.device_count() == 1);
    Device d = b.device(0);
    CHECK(d.capabilities().has(Capability::async));
    d.synchronize();
    CHECK(logs.at(LogLevel::info, "struct_sized: synchronize called").size() == 1);
    CHECK_MESSAGE(logs.at(LogLevel::error, kNeverCalled).empty(), "logs: " << logs.all());
  }
  // One byte short of synchronize: the host must not see it, so the async
  // device lacks the entry its flag requires.
  Registry r = load_next_to_good(backend_json("short", "struct_sized_short_by_one"));
  const std::string msg = expect_failed(r.backend("short"), Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "async");
  BP_CHECK_CONTAINS(msg, "synchronize");
}

TEST_CASE("loader: a table too small to hold the ABI version fails with abi_mismatch") {
  Registry r = load_next_to_good(backend_json("tiny", "struct_tiny"));
  Backend b = r.backend("tiny");
  const std::string msg = expect_failed(b, Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "struct_size " + std::to_string(offsetof(bp_plugin_api, abi_major)));
  // The version fields lie outside the declared table: the host must not report them.
  CHECK(b.abi_version().empty());
  CHECK(b.version().empty());
}

TEST_CASE(
    "loader: a device that declares collective with only some entries is rejected naming the missing ones") {
  Registry r = load_next_to_good(backend_json("partial", "collective_partial"));
  Backend b = r.backend("partial");
  const std::string msg = expect_failed(b, Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "collective");
  BP_CHECK_CONTAINS(msg, "broadcast");
  BP_CHECK_CONTAINS(msg, "all_gather");
  BP_CHECK_CONTAINS(msg, "reduce_scatter");
  BP_CHECK_CONTAINS(msg, "barrier");
  for (const char* set : {"all_reduce", "comm_create", "comm_destroy", "comm_abort"})
    BP_CHECK_ABSENT(msg, set);
  CHECK(names_device(msg, "partial", 0));
  // The device was enumerated before the check; a rejected plugin keeps none of it.
  CHECK(b.device_count() == 0);
  CHECK(b.capabilities() == Capabilities());
}

TEST_CASE("loader: a device that declares collective without the entries is rejected") {
  Registry r = load_next_to_good(backend_json("liar", "collective_liar"));
  const std::string msg = expect_failed(r.backend("liar"), Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "collective");
  for (const char* entry : {"comm_create", "comm_destroy", "comm_abort", "all_reduce", "broadcast",
                            "all_gather", "reduce_scatter", "barrier"})
    BP_CHECK_CONTAINS(msg, entry);
}

TEST_CASE(
    "loader: a device that declares collective without comm_abort is rejected naming flag, device and "
    "entry") {
  Registry r = load_next_to_good(backend_json("noabort", "collective_no_abort"));
  Backend b = r.backend("noabort");
  const std::string msg = expect_failed(b, Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "collective");
  BP_CHECK_CONTAINS(msg, "comm_abort");
  CHECK_MESSAGE(names_device(msg, "noabort", 0), "expected device 0 named in: " << msg);
  for (const char* set :
       {"comm_create", "comm_destroy", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"})
    BP_CHECK_ABSENT(msg, set);
  CHECK(b.device_count() == 0);
  CHECK(b.capabilities() == Capabilities());
}

TEST_CASE(
    "loader: a device that declares async without synchronize is rejected naming flag, device and entry") {
  Registry r = load_next_to_good(backend_json("nosync", "async_no_sync"));
  Backend b = r.backend("nosync");
  const std::string msg = expect_failed(b, Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "async");
  BP_CHECK_CONTAINS(msg, "synchronize");
  CHECK_MESSAGE(names_device(msg, "nosync", 0), "expected device 0 named in: " << msg);
  CHECK(b.device_count() == 0);
}

TEST_CASE(
    "loader: a device that declares host_visible without buffer_pointer is rejected naming that device") {
  // Device 0 is not host_visible and needs no buffer_pointer; device 1 is.
  Registry r = load_next_to_good(backend_json("nopointer", "host_visible_no_pointer"));
  Backend b = r.backend("nopointer");
  const std::string msg = expect_failed(b, Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "host_visible");
  BP_CHECK_CONTAINS(msg, "buffer_pointer");
  CHECK_MESSAGE(names_device(msg, "nopointer", 1), "expected device 1 named in: " << msg);
  CHECK_MESSAGE(!names_device(msg, "nopointer", 0), "device 0 keeps its promises, yet is named in: " << msg);
  CHECK(b.device_count() == 0);
}

// ---- devices that cannot be reached ----------------------------------------

TEST_CASE(
    "loader: device_count UNAVAILABLE keeps the backend as unavailable, with no devices and the reason") {
  Registry r = load_next_to_good(backend_json("gpu", "unavailable"));
  Backend b = r.backend("gpu");
  CHECK(b.status() == Backend::Status::unavailable);
  CHECK_FALSE(b.loaded());
  CHECK(b.error_code() == std::optional<Errc>(Errc::backend_unavailable));
  BP_CHECK_CONTAINS(b.error(), "driver not found: libfixture_driver.so.1: cannot open shared object file");
  CHECK(b.device_count() == 0);
  CHECK(b.devices().empty());
  CHECK(b.capabilities() == Capabilities());
  // The plugin itself loaded: its table answered.
  CHECK(fs::equivalent(b.library_path(), fixture("unavailable")));
  CHECK(b.version() == "1.2.3");
  CHECK(b.abi_version() == host_abi());
  Error e = error_from([&] { b.device(0); });
  CHECK(e.code() == Errc::backend_unavailable);
  BP_CHECK_CONTAINS(e.message(), "gpu");
  BP_CHECK_CONTAINS(e.message(), "driver not found");
}

TEST_CASE("loader: a required unavailable backend makes from_config throw naming it and the reason") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", config_json({backend_json("good", "good_c", true),
                                                                  backend_json("gpu", "unavailable", true)}));
  Error e = error_from([&] { Registry::from_config(config); });
  CHECK(e.code() == Errc::backend_unavailable);
  BP_CHECK_CONTAINS(e.message(), "gpu");
  BP_CHECK_CONTAINS(e.message(), "driver not found: libfixture_driver.so.1");

  // Reported instead of thrown, it stays in the registry, required and unavailable.
  Registry r = Registry::from_config(config, RequiredPolicy::report);
  Backend b = r.backend("gpu");
  CHECK(b.required());
  CHECK(b.status() == Backend::Status::unavailable);
  BP_CHECK_CONTAINS(b.error(), "driver not found");
  expect_adds(r.backend("good").device(0));
}

TEST_CASE("loader: an optional unavailable backend does not make from_config throw") {
  TempDir tmp;
  const fs::path config =
      tmp.write("backends.json",
                config_json({backend_json("good", "good_c", true), backend_json("gpu", "unavailable")}));
  Registry r = Registry::from_config(config);
  CHECK(r.backend("gpu").status() == Backend::Status::unavailable);
  expect_adds(r.backend("good").device(0));
}

TEST_CASE(
    "loader: a device_count failure other than UNAVAILABLE fails the backend with the plugin's message") {
  Registry r = load_next_to_good(backend_json("broken", "device_count_fails"));
  Backend b = r.backend("broken");
  const std::string msg = expect_failed(b, Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "device_count_fails: reading the device list failed");
  CHECK(b.device_count() == 0);
}

// ---- dtype capability flags ------------------------------------------------

TEST_CASE("loader: a device without the f64 flag refuses f64 tensors, whatever supports_op says") {
  // f32_only's supports_op says yes to every (op, dtype); only the flag tells.
  Registry r = load(config_json({backend_json("narrow", "f32_only")}));
  Backend b = r.backend("narrow");
  expect_loaded(b);
  Device d = b.device(0);
  CHECK(d.capabilities().has(Capability::f32));
  CHECK_FALSE(d.capabilities().has(Capability::f64));

  auto check_refusal = [&](const Error& e) {
    CHECK(e.code() == Errc::capability_missing);
    BP_CHECK_CONTAINS(e.message(), "f64");
    BP_CHECK_CONTAINS(e.message(), "narrow");
    BP_CHECK_CONTAINS(e.message(), d.id());
  };
  SUBCASE("zeros") {
    check_refusal(error_from([&] { zeros(d, {2}, DType::f64); }));
  }
  SUBCASE("from_vector") {
    check_refusal(error_from([&] { Tensor::from_vector<double>(d, {2}, {1.0, 2.0}); }));
  }
  SUBCASE("cast of an f32 tensor") {
    Tensor t = Tensor::from_vector<float>(d, {2}, {1, 2});
    check_refusal(error_from([&] { cast(t, DType::f64); }));
    CHECK(t.to_vector<float>() == std::vector<float>{1, 2});
  }
  // f32, which the device declares, works on the same device.
  CHECK(zeros(d, {2}, DType::f32).to_vector<float>() == std::vector<float>{0, 0});
  expect_adds(d);
}

TEST_CASE("loader: a failing create reports the plugin's own message") {
  Registry r = load_next_to_good(backend_json("frob", "create_fails"));
  const std::string msg = expect_failed(r.backend("frob"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "create_fails: the frobnicator option is required");
}

TEST_CASE("loader: a C++ exception in device_info becomes plugin_load_failed with its text") {
  Registry r = load_next_to_good(
      backend_json("throws", "cpp_throws", false, R"("options": {"throw_in": "device_info"})"));
  const std::string msg = expect_failed(r.backend("throws"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "cpp_throws: device_info exploded");
}

TEST_CASE("loader: a C++ exception in execute becomes a backplane::Error and the process goes on") {
  Registry r = load(
      config_json({backend_json("throws", "cpp_throws", false, R"("options": {"throw_in": "execute"})")}));
  Backend b = r.backend("throws");
  expect_loaded(b);
  Device d = b.device(0);
  CHECK(d.name() == "cpp_throws:0");
  Tensor a = Tensor::from_vector<float>(d, {3}, {1, 2, 3});
  Error e = error_from([&] {
    Tensor c = add(a, a);
    c.to_vector<float>();  // in case the error surfaces at the next synchronising call
  });
  // plugin.hpp maps an unexpected std::exception to BP_STATUS_INTERNAL; the core maps that to internal.
  CHECK(e.code() == Errc::internal);
  BP_CHECK_CONTAINS(e.message(), "cpp_throws: execute exploded");
  // The device still serves what does not throw.
  CHECK(a.to_vector<float>() == std::vector<float>{1, 2, 3});
  Tensor again = Tensor::from_vector<float>(d, {2}, {7, 8});
  CHECK(again.to_vector<float>() == std::vector<float>{7, 8});
}

TEST_CASE("loader: options reach the plugin's create") {
  // cpp_throws throws in device_info unless told otherwise, so loading proves
  // the options arrived; an invalid value is refused by the plugin itself.
  Registry r =
      load(config_json({backend_json("calm", "cpp_throws", false, R"("options": {"throw_in": "nothing"})"),
                        backend_json("bogus", "cpp_throws", false, R"("options": {"throw_in": "bogus"})")}));
  expect_loaded(r.backend("calm"));
  expect_adds(r.backend("calm").device(0));
  const std::string msg = expect_failed(r.backend("bogus"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "throw_in must be device_info, execute, buffer_read or nothing");
}

TEST_CASE("loader: an unresolved symbol fails at load time naming it") {
  Registry r = load_next_to_good(backend_json("unres", "unresolved"));
  const std::string msg = expect_failed(r.backend("unres"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "undefined symbol");
  BP_CHECK_CONTAINS(msg, "bp_fixture_symbol_that_does_not_exist");
}

TEST_CASE("loader: tensors keep their plugin loaded after the registry is gone") {
  Tensor t;
  {
    Registry r = load(config_json({backend_json("good", "good_c")}));
    Device d = r.backend("good").device(0);
    t = add(Tensor::from_vector<float>(d, {2}, {1, 2}), Tensor::from_vector<float>(d, {2}, {3, 4}));
  }
  CHECK(t.device().id() == "good:0");
  CHECK(t.to_vector<float>() == std::vector<float>{4, 6});
}

// ---- library resolution order -------------------------------------------

TEST_CASE("resolve: an absolute path is used as is") {
  TempDir tmp;
  ScopedEnv no_env("BACKPLANE_PLUGIN_PATH", std::nullopt);
  const fs::path lib = tmp.copy_fixture("good_c", "abs/libgood_c.so");
  tmp.copy_fixture("good_c", "dir/libgood_c.so");
  CHECK(fs::equivalent(resolved(resolution_config(lib.string(), {(tmp / "dir").string()}), tmp.path()), lib));
}

TEST_CASE("resolve: a relative path resolves against base_dir before plugin_dirs") {
  TempDir tmp;
  ScopedEnv no_env("BACKPLANE_PLUGIN_PATH", std::nullopt);
  const fs::path near = tmp.copy_fixture("good_c", "base/sub/libgood_c.so");
  tmp.copy_fixture("good_c", "dir/sub/libgood_c.so");
  CHECK(fs::equivalent(
      resolved(resolution_config("sub/libgood_c.so", {(tmp / "dir").string()}), tmp / "base"), near));
}

TEST_CASE("resolve: a bare name is looked for next to the config before plugin_dirs") {
  TempDir tmp;
  ScopedEnv no_env("BACKPLANE_PLUGIN_PATH", std::nullopt);
  const fs::path near = tmp.copy_fixture("good_c", "base/libgood_c.so");
  tmp.copy_fixture("good_c", "dir/libgood_c.so");
  CHECK(fs::equivalent(resolved(resolution_config("good_c", {(tmp / "dir").string()}), tmp / "base"), near));
}

TEST_CASE("resolve: plugin_dirs are searched in order") {
  TempDir tmp;
  ScopedEnv no_env("BACKPLANE_PLUGIN_PATH", std::nullopt);
  tmp.mkdir("base");
  tmp.mkdir("empty");
  const fs::path first = tmp.copy_fixture("good_c", "one/libgood_c.so");
  const fs::path second = tmp.copy_fixture("good_c", "two/libgood_c.so");
  const std::string empty = (tmp / "empty").string();
  const std::string one = (tmp / "one").string();
  const std::string two = (tmp / "two").string();
  CHECK(fs::equivalent(resolved(resolution_config("good_c", {empty, one, two}), tmp / "base"), first));
  CHECK(fs::equivalent(resolved(resolution_config("good_c", {empty, two, one}), tmp / "base"), second));
}

TEST_CASE("resolve: a relative plugin_dirs entry is relative to base_dir") {
  TempDir tmp;
  ScopedEnv no_env("BACKPLANE_PLUGIN_PATH", std::nullopt);
  const fs::path lib = tmp.copy_fixture("good_c", "base/rel_plugins/libgood_c.so");
  CHECK(fs::equivalent(resolved(resolution_config("good_c", {"rel_plugins"}), tmp / "base"), lib));
}

TEST_CASE("resolve: BACKPLANE_PLUGIN_PATH is searched after plugin_dirs") {
  TempDir tmp;
  tmp.mkdir("base");
  tmp.mkdir("env_empty");
  const fs::path from_env = tmp.copy_fixture("good_c", "env_two/libgood_c.so");
  const std::string path_var = (tmp / "env_empty").string() + ":" + (tmp / "env_two").string();
  ScopedEnv env("BACKPLANE_PLUGIN_PATH", path_var);
  SUBCASE("found only there") {
    CHECK(fs::equivalent(resolved(resolution_config("good_c", {(tmp / "base").string()}), tmp / "base"),
                         from_env));
  }
  SUBCASE("plugin_dirs win over it") {
    const fs::path in_dir = tmp.copy_fixture("good_c", "dir/libgood_c.so");
    CHECK(fs::equivalent(resolved(resolution_config("good_c", {(tmp / "dir").string()}), tmp / "base"),
                         in_dir));
  }
}

TEST_CASE("resolve: a bare name tries x then libx.so then x.so in each directory") {
  TempDir tmp;
  ScopedEnv no_env("BACKPLANE_PLUGIN_PATH", std::nullopt);
  tmp.mkdir("base");
  const std::string dir = (tmp / "dir").string();
  const fs::path dot_so = tmp.copy_fixture("good_c", "dir/good_c.so");
  CHECK(fs::equivalent(resolved(resolution_config("good_c", {dir}), tmp / "base"), dot_so));
  const fs::path lib_so = tmp.copy_fixture("good_c", "dir/libgood_c.so");
  CHECK(fs::equivalent(resolved(resolution_config("good_c", {dir}), tmp / "base"), lib_so));
  const fs::path plain = tmp.copy_fixture("good_c", "dir/good_c");
  CHECK(fs::equivalent(resolved(resolution_config("good_c", {dir}), tmp / "base"), plain));
}

TEST_CASE("resolve: every candidate of one directory comes before the next directory") {
  TempDir tmp;
  ScopedEnv no_env("BACKPLANE_PLUGIN_PATH", std::nullopt);
  tmp.mkdir("base");
  const fs::path first = tmp.copy_fixture("good_c", "one/good_c.so");
  tmp.copy_fixture("good_c", "two/libgood_c.so");
  CHECK(fs::equivalent(
      resolved(resolution_config("good_c", {(tmp / "one").string(), (tmp / "two").string()}), tmp / "base"),
      first));
}

TEST_CASE("resolve: not found lists the directories tried including BACKPLANE_PLUGIN_PATH") {
  TempDir tmp;
  tmp.mkdir("base");
  const std::string env_dir = tmp.mkdir("env_dir").string();
  const std::string dir = tmp.mkdir("dir").string();
  ScopedEnv env("BACKPLANE_PLUGIN_PATH", env_dir);
  Registry r = Registry::from_json(resolution_config("good_c", {dir}), tmp / "base", "resolution",
                                   RequiredPolicy::report);
  const std::string msg = expect_failed(r.backend("b"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "good_c");
  BP_CHECK_CONTAINS(msg, "not found");
  BP_CHECK_CONTAINS(msg, dir);
  BP_CHECK_CONTAINS(msg, env_dir);
}

TEST_CASE("resolve: a long plugin_dirs is searched once per folder and the tried list stays short") {
  TempDir tmp;
  ScopedEnv no_env("BACKPLANE_PLUGIN_PATH", std::nullopt);
  tmp.mkdir("base");
  // 20,000 folders, each named twice: linear work, and each candidate tried once.
  std::vector<std::string> dirs;
  for (int i = 0; i < 20000; ++i) dirs.push_back((tmp / ("missing_" + std::to_string(i % 10000))).string());
  Registry r = Registry::from_json(resolution_config("good_c", dirs), tmp / "base", "resolution",
                                   RequiredPolicy::report);
  const std::string msg = expect_failed(r.backend("b"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "not found; tried:");
  BP_CHECK_CONTAINS(msg, (tmp / "base" / "good_c").string());
  // 3 candidates in base + 3 in each of 10,000 distinct folders; 20 shown.
  BP_CHECK_CONTAINS(msg, "... and " + std::to_string(3 + 3 * 10000 - 20) + " more");
  CHECK(std::count(msg.begin(), msg.end(), '\n') <= 25);
  BP_CHECK_ABSENT(msg, "missing_9999");

  // And found at the end of such a list.
  const fs::path lib = tmp.copy_fixture("good_c", "last/libgood_c.so");
  dirs.push_back((tmp / "last").string());
  CHECK(fs::equivalent(resolved(resolution_config("good_c", dirs), tmp / "base"), lib));
}

TEST_CASE("loader: a plugin library others can write is refused with the fix, and only that backend fails") {
  TempDir tmp;
  ScopedEnv no_env("BACKPLANE_PLUGIN_PATH", std::nullopt);
  const fs::path lib = tmp.copy_fixture("good_c", "open/libgood_c.so");
  const std::string config = resolution_config(lib.string());
  CHECK(fs::equivalent(resolved(config, tmp.path()), lib));  // 0755 / 0644 under the usual umask

  fs::permissions(lib, fs::perms(0777));
  Registry r = Registry::from_json(config, tmp.path(), "resolution", RequiredPolicy::report);
  std::string msg = expect_failed(r.backend("b"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "plugin library " + lib.string());
  BP_CHECK_CONTAINS(msg, "writable by anyone");
  BP_CHECK_CONTAINS(msg, "chmod go-w " + lib.string());

  fs::permissions(lib, fs::perms(0755));
  fs::permissions(tmp / "open", fs::perms(0775));
  r = Registry::from_json(config, tmp.path(), "resolution", RequiredPolicy::report);
  msg = expect_failed(r.backend("b"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "writable by its group");
  BP_CHECK_CONTAINS(msg, "chmod go-w " + (tmp / "open").string());
  fs::permissions(tmp / "open", fs::perms(0755));
}

namespace {
// True when this process has mapped the shared object at `library`.
bool mapped(const fs::path& library) {
  std::ifstream maps("/proc/self/maps");
  const std::string path = fs::canonical(library).string();
  for (std::string line; std::getline(maps, line);)
    if (line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0)
      return true;
  return false;
}
}  // namespace

TEST_CASE("loader: required backends load at once, optional ones on first use, unused ones never") {
  TempDir tmp;
  // Copies, so that no other test's load of good_c shows in this process's maps.
  const fs::path eager = tmp.copy_fixture("good_c", "eager/libgood_c.so");
  const fs::path lazy = tmp.copy_fixture("good_c", "lazy/libgood_c.so");
  // Loading either of the last two would kill (segv) or hang this test.
  Registry r =
      load(config_json({backend_json("eager", eager.string(), true), backend_json("lazy", lazy.string()),
                        backend_json("segv", "crash_segv"), backend_json("hangs", "hang_create")}),
           RequiredPolicy::throw_on_failure);
  CHECK(mapped(eager));
  CHECK_FALSE(mapped(lazy));
  expect_adds(r.backend("eager").device(0));
  // What the config says needs no load.
  CHECK(r.backend("lazy").name() == "lazy");
  CHECK_FALSE(r.backend("lazy").required());
  CHECK(r.backend("lazy").library() == lazy.string());
  CHECK(r.backends().size() == 4);
  CHECK_FALSE(mapped(lazy));
  // The first question that needs the plugin loads it, once.
  expect_loaded(r.backend("lazy"));
  CHECK(mapped(lazy));
  expect_adds(r.backend("lazy").device(0));
  CHECK(r.default_backend().name() == "eager");
}

TEST_CASE("loader: an optional backend loaded on first use from many threads at once loads once") {
  TempDir tmp;
  const fs::path lazy = tmp.copy_fixture("good_c", "threads/libgood_c.so");
  Registry r = load(config_json({backend_json("lazy", lazy.string())}));
  std::vector<std::thread> threads;
  std::atomic<int> loaded{0};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      if (r.backend("lazy").status() == Backend::Status::loaded && r.backend("lazy").device_count() == 1)
        ++loaded;
    });
  for (auto& t : threads) t.join();
  CHECK(loaded == 8);
  expect_adds(r.backend("lazy").device(0));
}
