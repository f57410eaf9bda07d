// Tests of the plugin loader: a C plugin loads and computes; every way a
// plugin can fail to load leaves a failed backend with a typed code and a
// precise reason while its neighbours keep working; libraries are found in
// the documented order.
#include "test_support.hpp"

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
  return "{\"schema_version\": 1, \"plugin_dirs\": [" + dirs + "], \"backends\": [" + backend_json("b", library) + "]}";
}

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
  CHECK(b.abi_version() == std::to_string(BP_ABI_MAJOR) + "." + std::to_string(BP_ABI_MINOR));
  CHECK_FALSE(b.required());
  REQUIRE(b.device_count() == 1);
  CHECK(b.devices().size() == 1);
  CHECK(b.capabilities() == Capabilities(BP_CAP_HOST_VISIBLE));

  Device d = b.device(0);
  CHECK(d.valid());
  CHECK(d.index() == 0);
  CHECK(d.id() == "good:0");
  CHECK(d.name() == "fixture:0");
  CHECK(d.capabilities() == Capabilities(BP_CAP_HOST_VISIBLE));
  CHECK(d.capabilities().has(Capability::host_visible));
  CHECK_FALSE(d.capabilities().has(Capability::collective));
  CHECK(d.backend().name() == "good");
  CHECK(d == b.devices()[0]);
  CHECK(d.supports(BP_OP_ADD, DType::f32));
  CHECK_FALSE(d.supports(BP_OP_MUL, DType::f32));
  CHECK_FALSE(d.supports(BP_OP_ADD, DType::f64));
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
  CHECK_MESSAGE((msg.find("invalid ELF header") != std::string::npos || msg.find("file too short") != std::string::npos),
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

TEST_CASE("loader: another ABI major fails with abi_mismatch naming both versions") {
  Registry r = load_next_to_good(backend_json("future", "abi_major"));
  Backend b = r.backend("future");
  const std::string msg = expect_failed(b, Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "2.3");
  BP_CHECK_CONTAINS(msg, std::to_string(BP_ABI_MAJOR) + "." + std::to_string(BP_ABI_MINOR));
}

TEST_CASE("loader: a table whose struct_size hides required entries fails with abi_mismatch") {
  Registry r = load_next_to_good(backend_json("small", "struct_small"));
  const std::string msg = expect_failed(r.backend("small"), Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "struct_size");
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

TEST_CASE("loader: a device that declares collective with only some entries is rejected naming the missing ones") {
  Registry r = load_next_to_good(backend_json("partial", "collective_partial"));
  Backend b = r.backend("partial");
  const std::string msg = expect_failed(b, Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "collective");
  BP_CHECK_CONTAINS(msg, "broadcast");
  BP_CHECK_CONTAINS(msg, "all_gather");
  BP_CHECK_CONTAINS(msg, "reduce_scatter");
  BP_CHECK_CONTAINS(msg, "barrier");
  CHECK_MESSAGE(msg.find("all_reduce") == std::string::npos, "all_reduce is set, yet named in: " << msg);
  CHECK_MESSAGE(msg.find("comm_create") == std::string::npos, "comm_create is set, yet named in: " << msg);
  CHECK_MESSAGE(msg.find("comm_destroy") == std::string::npos, "comm_destroy is set, yet named in: " << msg);
  // The device was enumerated before the check; a rejected plugin keeps none of it.
  CHECK(b.device_count() == 0);
  CHECK(b.capabilities() == Capabilities());
}

TEST_CASE("loader: a device that declares collective without the entries is rejected") {
  Registry r = load_next_to_good(backend_json("liar", "collective_liar"));
  const std::string msg = expect_failed(r.backend("liar"), Errc::abi_mismatch);
  BP_CHECK_CONTAINS(msg, "collective");
  BP_CHECK_CONTAINS(msg, "all_reduce");
}

TEST_CASE("loader: a failing create reports the plugin's own message") {
  Registry r = load_next_to_good(backend_json("frob", "create_fails"));
  const std::string msg = expect_failed(r.backend("frob"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "create_fails: the frobnicator option is required");
}

TEST_CASE("loader: a C++ exception in device_info becomes plugin_load_failed with its text") {
  Registry r = load_next_to_good(backend_json("throws", "cpp_throws", false, R"("options": {"throw_in": "device_info"})"));
  const std::string msg = expect_failed(r.backend("throws"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "cpp_throws: device_info exploded");
}

TEST_CASE("loader: a C++ exception in execute becomes a backplane::Error and the process goes on") {
  Registry r = load(config_json({backend_json("throws", "cpp_throws", false, R"("options": {"throw_in": "execute"})")}));
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
  Registry r = load(config_json({backend_json("calm", "cpp_throws", false, R"("options": {"throw_in": "nothing"})"),
                                 backend_json("bogus", "cpp_throws", false, R"("options": {"throw_in": "bogus"})")}));
  expect_loaded(r.backend("calm"));
  expect_adds(r.backend("calm").device(0));
  const std::string msg = expect_failed(r.backend("bogus"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "throw_in must be device_info, execute or nothing");
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
  CHECK(fs::equivalent(resolved(resolution_config("sub/libgood_c.so", {(tmp / "dir").string()}), tmp / "base"), near));
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
    CHECK(fs::equivalent(resolved(resolution_config("good_c", {(tmp / "base").string()}), tmp / "base"), from_env));
  }
  SUBCASE("plugin_dirs win over it") {
    const fs::path in_dir = tmp.copy_fixture("good_c", "dir/libgood_c.so");
    CHECK(fs::equivalent(resolved(resolution_config("good_c", {(tmp / "dir").string()}), tmp / "base"), in_dir));
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
      resolved(resolution_config("good_c", {(tmp / "one").string(), (tmp / "two").string()}), tmp / "base"), first));
}

TEST_CASE("resolve: not found lists the directories tried including BACKPLANE_PLUGIN_PATH") {
  TempDir tmp;
  tmp.mkdir("base");
  const std::string env_dir = tmp.mkdir("env_dir").string();
  const std::string dir = tmp.mkdir("dir").string();
  ScopedEnv env("BACKPLANE_PLUGIN_PATH", env_dir);
  Registry r = Registry::from_json(resolution_config("good_c", {dir}), tmp / "base", "resolution", RequiredPolicy::report);
  const std::string msg = expect_failed(r.backend("b"), Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "good_c");
  BP_CHECK_CONTAINS(msg, "not found");
  BP_CHECK_CONTAINS(msg, dir);
  BP_CHECK_CONTAINS(msg, env_dir);
}
