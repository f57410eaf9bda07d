// Tests of backends.json handling: parse errors with line and source, type
// errors and unknown keys with their JSON path, collective_fallback values,
// duplicate names, required backends, and where the config is looked for.
#include "test_support.hpp"

using namespace backplane;
using namespace bptest;

TEST_CASE("config: malformed JSON throws config_error naming the source and the line") {
  const std::string text =
      "{\n"
      "  \"schema_version\": 1,\n"
      "  \"backends\": [ }\n"
      "}\n";
  Error e = error_from([&] { Registry::from_json(text, fixture_dir(), "broken_source.json"); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "broken_source.json");
  BP_CHECK_CONTAINS(e.message(), "line 3");
}

TEST_CASE("config: a missing config file throws config_error naming the file") {
  TempDir tmp;
  const fs::path missing = tmp / "no_such_backends.json";
  Error e = error_from([&] { Registry::from_config(missing); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), missing.string());
}

TEST_CASE("config: from_config names the file and the line of a parse error") {
  TempDir tmp;
  const fs::path file = tmp.write("broken.json", "{\n  \"schema_version\": 1\n  \"backends\": []\n}\n");
  Error e = error_from([&] { Registry::from_config(file); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "broken.json");
  BP_CHECK_CONTAINS(e.message(), "line 3");
}

TEST_CASE("config: a library that is not a string fails only that backend") {
  Registry r = load(config_json({backend_json("good", "good_c"), R"({"name": "five", "library": 5})"}));
  std::vector<Backend> all = r.backends();
  REQUIRE(all.size() == 2);
  CHECK(all[1].name() == "five");
  const std::string msg = expect_failed(all[1], Errc::config_error);
  BP_CHECK_CONTAINS(msg, "backends[1].library");
  BP_CHECK_CONTAINS(msg, "expected a string");
  expect_loaded(all[0]);
  expect_adds(all[0].device(0));
}

TEST_CASE("config: required that is not a boolean fails that backend naming the path") {
  Registry r = load(config_json({R"({"name": "yes", "library": "good_c", "required": "yes"})"}));
  std::vector<Backend> all = r.backends();
  REQUIRE(all.size() == 1);
  const std::string msg = expect_failed(all[0], Errc::config_error);
  BP_CHECK_CONTAINS(msg, "backends[0].required");
  BP_CHECK_CONTAINS(msg, "expected a boolean");
}

TEST_CASE("config: plugin_dirs that is not an array throws config_error") {
  const std::string text = R"({"schema_version": 1, "plugin_dirs": "x", "backends": []})";
  Error e = error_from([&] { Registry::from_json(text, fixture_dir(), "test"); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "plugin_dirs");
}

TEST_CASE("config: an unsupported schema_version throws config_error") {
  const std::string text = R"({"schema_version": 2, "backends": []})";
  Error e = error_from([&] { Registry::from_json(text, fixture_dir(), "test"); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "schema_version");
}

TEST_CASE("config: an unknown top-level key throws config_error naming it") {
  const std::string text =
      "{\"schema_version\": 1, \"plugin_dir\": [" + json_path(fixture_dir()) + "], \"backends\": []}";
  Error e = error_from([&] { Registry::from_json(text, fixture_dir(), "test"); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "plugin_dir");
  BP_CHECK_CONTAINS(e.message(), "unknown key");
}

TEST_CASE("config: an unknown backend key fails that backend naming its path") {
  Registry r = load(config_json({R"({"name": "typo", "libary": "good_c"})", backend_json("good", "good_c")}));
  std::vector<Backend> all = r.backends();
  REQUIRE(all.size() == 2);
  const std::string msg = expect_failed(all[0], Errc::config_error);
  BP_CHECK_CONTAINS(msg, "backends[0].libary");
  BP_CHECK_CONTAINS(msg, "unknown key");
  expect_loaded(all[1]);
  expect_adds(all[1].device(0));
}

TEST_CASE("config: collective_fallback defaults to error") {
  Registry r = load(config_json({backend_json("good", "good_c")}));
  Backend b = r.backend("good");
  expect_loaded(b);
  CHECK(b.collective_fallback().kind == CollectiveFallback::Kind::error);
  CHECK(b.collective_fallback().to_string() == "error");
}

TEST_CASE("config: collective_fallback error and local are accepted") {
  Registry r = load(config_json({backend_json("e", "good_c", false, R"("collective_fallback": "error")"),
                                 backend_json("l", "good_c", false, R"("collective_fallback": "local")")}));
  expect_loaded(r.backend("e"));
  expect_loaded(r.backend("l"));
  CHECK(r.backend("e").collective_fallback().kind == CollectiveFallback::Kind::error);
  CHECK(r.backend("l").collective_fallback().kind == CollectiveFallback::Kind::local);
  CHECK(r.backend("l").collective_fallback().to_string() == "local");
}

TEST_CASE("config: collective_fallback host names another backend") {
  Registry r = load(config_json({backend_json("staged", "good_c", false, R"("collective_fallback": "host:good")"),
                                 backend_json("good", "good_c")}));
  expect_loaded(r.backend("staged"));
  CHECK(r.backend("staged").collective_fallback().kind == CollectiveFallback::Kind::host);
  CHECK(r.backend("staged").collective_fallback().host_backend == "good");
  CHECK(r.backend("staged").collective_fallback().to_string() == "host:good");
}

TEST_CASE("config: collective_fallback host naming an unknown backend fails that entry") {
  Registry r = load(config_json({backend_json("staged", "good_c", false, R"("collective_fallback": "host:gpu")"),
                                 backend_json("good", "good_c")}));
  const std::string msg = expect_failed(r.backend("staged"), Errc::config_error);
  BP_CHECK_CONTAINS(msg, "backends[0].collective_fallback");
  BP_CHECK_CONTAINS(msg, "no backend named \"gpu\"");
  BP_CHECK_CONTAINS(msg, "\"good\"");
  expect_loaded(r.backend("good"));
}

TEST_CASE("config: collective_fallback host through itself or through a stager fails") {
  Registry r = load(config_json({backend_json("self", "good_c", false, R"("collective_fallback": "host:self")"),
                                 backend_json("a", "good_c", false, R"("collective_fallback": "host:b")"),
                                 backend_json("b", "good_c", false, R"("collective_fallback": "host:c")"),
                                 backend_json("c", "good_c")}));
  BP_CHECK_CONTAINS(expect_failed(r.backend("self"), Errc::config_error), "cannot stage through itself");
  BP_CHECK_CONTAINS(expect_failed(r.backend("a"), Errc::config_error), "itself stages through \"c\"");
  expect_loaded(r.backend("b"));
  expect_loaded(r.backend("c"));
}

TEST_CASE("config: an unknown collective_fallback fails that backend naming its path") {
  Registry r = load(config_json({backend_json("boom", "good_c", false, R"("collective_fallback": "explode")")}));
  const std::string msg = expect_failed(r.backend("boom"), Errc::config_error);
  BP_CHECK_CONTAINS(msg, "backends[0].collective_fallback");
  BP_CHECK_CONTAINS(msg, "explode");
}

TEST_CASE("config: a duplicate backend name fails the second entry and keeps the first") {
  Registry r = load(config_json({backend_json("dup", "good_c"), backend_json("dup", "good_c")}));
  std::vector<Backend> all = r.backends();
  REQUIRE(all.size() == 2);
  expect_loaded(all[0]);
  const std::string msg = expect_failed(all[1], Errc::config_error);
  BP_CHECK_CONTAINS(msg, "duplicate");
  BP_CHECK_CONTAINS(msg, "backends[0]");
  // The name finds the first, working, entry.
  Backend found = r.backend("dup");
  expect_loaded(found);
  expect_adds(found.device(0));
}

TEST_CASE("config: failed required backends make from_json throw listing every reason") {
  const std::string text = config_json({backend_json("good", "good_c", true),
                                        backend_json("gone", "no_such_plugin_anywhere", true),
                                        backend_json("future", "abi_major", true)});
  Error e = error_from([&] { load(text, RequiredPolicy::throw_on_failure); });
  CHECK(e.code() == Errc::backend_unavailable);
  BP_CHECK_CONTAINS(e.message(), "gone");
  BP_CHECK_CONTAINS(e.message(), "no_such_plugin_anywhere");
  BP_CHECK_CONTAINS(e.message(), "not found");
  BP_CHECK_CONTAINS(e.message(), "future");
  BP_CHECK_CONTAINS(e.message(), "3.1");  // both ABIs: the plugin's and this host's
  BP_CHECK_CONTAINS(e.message(), "2.0");
}

TEST_CASE("config: a failed optional backend does not make from_json throw") {
  Registry r = load(config_json({backend_json("good", "good_c", true), backend_json("gone", "no_such_plugin_anywhere")}),
                    RequiredPolicy::throw_on_failure);
  expect_loaded(r.backend("good"));
  expect_failed(r.backend("gone"), Errc::plugin_load_failed);
  CHECK_FALSE(r.backend("gone").required());
  expect_adds(r.backend("good").device(0));
}

TEST_CASE("config: RequiredPolicy report keeps a failed required backend in the registry") {
  Registry r = load(config_json({backend_json("gone", "no_such_plugin_anywhere", true), backend_json("good", "good_c")}),
                    RequiredPolicy::report);
  Backend gone = r.backend("gone");
  CHECK(gone.required());
  const std::string msg = expect_failed(gone, Errc::plugin_load_failed);
  BP_CHECK_CONTAINS(msg, "no_such_plugin_anywhere");
  CHECK(gone.library() == "no_such_plugin_anywhere");
  CHECK(gone.library_path().empty());
  expect_loaded(r.backend("good"));
}

TEST_CASE("config: using a failed backend's device throws backend_unavailable with the reason") {
  Registry r = load(config_json({backend_json("noentry", "no_entry")}));
  Backend b = r.backend("noentry");
  expect_failed(b, Errc::plugin_load_failed);
  Error e = error_from([&] { b.device(0); });
  CHECK(e.code() == Errc::backend_unavailable);
  BP_CHECK_CONTAINS(e.message(), "noentry");
  BP_CHECK_CONTAINS(e.message(), "bp_plugin_entry");
  CHECK(b.device_count() == 0);
  CHECK(b.devices().empty());
}

TEST_CASE("config: backend with an unknown name throws not_found listing the known ones") {
  Registry r = load(config_json({backend_json("alpha", "good_c"), backend_json("beta", "no_such_plugin_anywhere")}));
  Error e = error_from([&] { r.backend("gamma"); });
  CHECK(e.code() == Errc::not_found);
  BP_CHECK_CONTAINS(e.message(), "gamma");
  BP_CHECK_CONTAINS(e.message(), "alpha");
  BP_CHECK_CONTAINS(e.message(), "beta");
}

TEST_CASE("config: backends keep config order and default_backend picks the first loaded one") {
  Registry r = load(config_json({backend_json("gone", "no_such_plugin_anywhere"), backend_json("first", "good_c"),
                                 backend_json("second", "good_c")}));
  std::vector<Backend> all = r.backends();
  REQUIRE(all.size() == 3);
  CHECK(all[0].name() == "gone");
  CHECK(all[1].name() == "first");
  CHECK(all[2].name() == "second");
  CHECK(r.default_backend().name() == "first");
  CHECK(r.config_path().empty());
}

TEST_CASE("config: default_backend follows the config's default_backend") {
  Registry r = load(config_json({backend_json("first", "good_c"), backend_json("second", "good_c")},
                                R"("default_backend": "second")"));
  CHECK(r.default_backend().name() == "second");
}

TEST_CASE("config: from_config records its path and resolves libraries next to the file") {
  TempDir tmp;
  const fs::path lib = tmp.copy_fixture("good_c", "cfg/plugins/libgood_c.so");
  const fs::path file =
      tmp.write("cfg/backends.json", R"({"schema_version": 1, "backends": [
        {"name": "near", "library": "plugins/libgood_c.so", "required": true}]})");
  Registry r = Registry::from_config(file);
  CHECK(fs::equivalent(r.config_path(), file));
  Backend b = r.backend("near");
  expect_loaded(b);
  CHECK(b.library() == "plugins/libgood_c.so");
  CHECK(fs::equivalent(b.library_path(), lib));
  expect_adds(b.device(0));
}

TEST_CASE("config: BACKPLANE_CONFIG is honoured by default_config_path and from_env") {
  TempDir tmp;
  const fs::path file = tmp.write("elsewhere/my_backends.json",
                                  "{\"schema_version\": 1, \"backends\": [" +
                                      backend_json("env", fixture("good_c").string(), true) + "]}");
  ScopedEnv env("BACKPLANE_CONFIG", file.string());
  CHECK(Registry::default_config_path() == file);
  Registry r = Registry::from_env();
  CHECK(fs::equivalent(r.config_path(), file));
  expect_loaded(r.backend("env"));
  expect_adds(r.backend("env").device(0));
}

// ---- wrong types and bad references ---------------------------------------

TEST_CASE("config: backends that is an object instead of an array throws config_error") {
  const std::string text = R"({"schema_version": 1, "backends": {}})";
  Error e = error_from([&] { Registry::from_json(text, fixture_dir(), "test"); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "backends");
  BP_CHECK_CONTAINS(e.message(), "expected an array");
}

TEST_CASE("config: default_backend that is not a string throws config_error naming it") {
  const std::string text = config_json({backend_json("good", "good_c")}, R"("default_backend": 3)");
  Error e = error_from([&] { load(text); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "default_backend");
  BP_CHECK_CONTAINS(e.message(), "expected a string");
}

TEST_CASE("config: default_backend naming no backend throws config_error naming it") {
  const std::string text =
      config_json({backend_json("good", "good_c"), backend_json("other", "good_c")}, R"("default_backend": "ghost")");
  Error e = error_from([&] { load(text); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "default_backend");
  BP_CHECK_CONTAINS(e.message(), "\"ghost\"");
}

TEST_CASE("config: a backend name that is not a string fails only that backend naming the path") {
  Registry r = load(config_json({R"({"name": 7, "library": "good_c"})", backend_json("good", "good_c")}));
  std::vector<Backend> all = r.backends();
  REQUIRE(all.size() == 2);
  const std::string msg = expect_failed(all[0], Errc::config_error);
  BP_CHECK_CONTAINS(msg, "backends[0].name");
  BP_CHECK_CONTAINS(msg, "expected a string");
  CHECK(all[0].devices().empty());
  expect_loaded(all[1]);
  CHECK(all[1].name() == "good");
  expect_adds(all[1].device(0));
}

TEST_CASE("config: options that is an array fails only that backend naming the path") {
  Registry r = load(config_json({backend_json("arr", "good_c", false, R"("options": [])"), backend_json("good", "good_c")}));
  std::vector<Backend> all = r.backends();
  REQUIRE(all.size() == 2);
  CHECK(all[0].name() == "arr");
  const std::string msg = expect_failed(all[0], Errc::config_error);
  BP_CHECK_CONTAINS(msg, "backends[0].options");
  BP_CHECK_CONTAINS(msg, "expected an object");
  expect_loaded(all[1]);
  expect_adds(all[1].device(0));
}

TEST_CASE("config: a duplicate key in an object throws config_error naming the key") {
  const std::string text = R"({"schema_version": 1, "schema_version": 1, "backends": []})";
  Error e = error_from([&] { Registry::from_json(text, fixture_dir(), "dup_source.json"); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "duplicate key");
  BP_CHECK_CONTAINS(e.message(), "schema_version");
  BP_CHECK_CONTAINS(e.message(), "dup_source.json");
  // The same key in two different objects is not a duplicate.
  Registry r = load(config_json({backend_json("a", "good_c"), backend_json("b", "good_c")}));
  CHECK(r.backends().size() == 2);
}

TEST_CASE("config: a duplicate key inside a backend entry throws config_error naming the key") {
  // The second "library" would silently win in a lenient parser; it must not.
  const std::string text = config_json({R"({"name": "twice", "library": "good_c", "library": "no_such_plugin"})"});
  Error e = error_from([&] { load(text); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "backends[0].library: duplicate key");
}

TEST_CASE("config: from_config on a directory throws config_error naming it") {
  TempDir tmp;
  const fs::path dir = tmp.mkdir("a_directory");
  Error e = error_from([&] { Registry::from_config(dir); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), dir.string());
  BP_CHECK_CONTAINS(e.message(), "not a regular file");
}
