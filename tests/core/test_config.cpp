// Tests of backends.json handling: parse errors with line and source, type
// errors and unknown keys with their JSON path, collective_fallback and
// op_fallback values, duplicate names, required backends, and where the
// config is looked for.
#include "test_support.hpp"

#include <sys/stat.h>

#include <sstream>
#include <typeinfo>

using namespace backplane;
using namespace bptest;

namespace {

// The message of the config_error that loading `json` must throw.
std::string config_error_of(const std::string& json, RequiredPolicy policy = RequiredPolicy::report) {
  Error e = error_from([&] { load(json, policy); });
  CHECK(e.code() == Errc::config_error);
  return e.message();
}

}  // namespace

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

TEST_CASE("config: bytes that are not UTF-8 are named by offset, line and column, never quoted raw") {
  const std::string text =
      "{\"schema_version\": 1,\n \"default_backend\": \"c\xff"
      "pu\", \"backends\": []}";
  Error e = error_from([&] { Registry::from_json(text, fixture_dir(), "latin1.json"); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "latin1.json: not UTF-8: the byte 0xFF at offset 44 (line 2, column 23)");
  CHECK(e.message().find('\xff') == std::string::npos);
  // Outside a string too, and a truncated multi-byte character.
  BP_CHECK_CONTAINS(error_from([&] { Registry::from_json("{\xc3}", fixture_dir(), "a.json"); }).message(),
                    "the byte 0xC3 at offset 1 (line 1, column 2)");
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

TEST_CASE("config: a library that is not a string makes the whole config invalid") {
  const std::string msg =
      config_error_of(config_json({backend_json("good", "good_c"), R"({"name": "five", "library": 5})"}));
  BP_CHECK_CONTAINS(msg, "backends[1].library");
  BP_CHECK_CONTAINS(msg, "expected a string");
}

TEST_CASE("config: required that is not a boolean makes the whole config invalid naming the path") {
  const std::string msg =
      config_error_of(config_json({R"({"name": "yes", "library": "good_c", "required": "yes"})"}));
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

TEST_CASE("config: an unknown backend key makes the whole config invalid naming its path") {
  const std::string msg = config_error_of(
      config_json({R"({"name": "typo", "libary": "good_c"})", backend_json("good", "good_c")}));
  BP_CHECK_CONTAINS(msg, "backends[0].libary");
  BP_CHECK_CONTAINS(msg, "unknown key");
  BP_CHECK_CONTAINS(msg, "did you mean \"library\"");
}

TEST_CASE("config: a required entry with a typo key is not ignored: the config is invalid") {
  // "requird" next to a working library: nothing may load, and nothing may
  // report success with a required backend silently dropped.
  const std::string msg =
      config_error_of(config_json({R"({"name": "gpu", "library": "good_c", "requird": true})"}),
                      RequiredPolicy::throw_on_failure);
  BP_CHECK_CONTAINS(msg, "backends[0].requird");
  BP_CHECK_CONTAINS(msg, "did you mean \"required\"");
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
  Registry r =
      load(config_json({backend_json("staged", "good_c", false, R"("collective_fallback": "host:good")"),
                        backend_json("good", "good_c")}));
  expect_loaded(r.backend("staged"));
  CHECK(r.backend("staged").collective_fallback().kind == CollectiveFallback::Kind::host);
  CHECK(r.backend("staged").collective_fallback().host_backend == "good");
  CHECK(r.backend("staged").collective_fallback().to_string() == "host:good");
}

TEST_CASE("config: collective_fallback host naming an unknown backend makes the config invalid") {
  const std::string msg = config_error_of(
      config_json({backend_json("staged", "good_c", false, R"("collective_fallback": "host:gpu")"),
                   backend_json("good", "good_c")}));
  BP_CHECK_CONTAINS(msg, "backends[0].collective_fallback");
  BP_CHECK_CONTAINS(msg, "no backend named \"gpu\"");
  BP_CHECK_CONTAINS(msg, "\"good\"");
}

TEST_CASE("config: collective_fallback host through itself or through a stager makes the config invalid") {
  BP_CHECK_CONTAINS(config_error_of(config_json(
                        {backend_json("self", "good_c", false, R"("collective_fallback": "host:self")")})),
                    "cannot stage through itself");
  const std::string msg =
      config_error_of(config_json({backend_json("a", "good_c", false, R"("collective_fallback": "host:b")"),
                                   backend_json("b", "good_c", false, R"("collective_fallback": "host:c")"),
                                   backend_json("c", "good_c")}));
  BP_CHECK_CONTAINS(msg, "backends[0].collective_fallback");
  BP_CHECK_CONTAINS(msg, "itself stages through \"c\"");
  // The chain's last link alone is fine.
  Registry r = load(config_json({backend_json("b", "good_c", false, R"("collective_fallback": "host:c")"),
                                 backend_json("c", "good_c")}));
  expect_loaded(r.backend("b"));
  expect_loaded(r.backend("c"));
}

TEST_CASE("config: an unknown collective_fallback makes the config invalid naming its path") {
  const std::string msg = config_error_of(
      config_json({backend_json("boom", "good_c", false, R"("collective_fallback": "explode")")}));
  BP_CHECK_CONTAINS(msg, "backends[0].collective_fallback");
  BP_CHECK_CONTAINS(msg, "explode");
}

TEST_CASE("config: op_fallback defaults to error") {
  CHECK(OpFallback{}.kind == OpFallback::Kind::error);
  CHECK(OpFallback{}.host_backend.empty());
  Registry r = load(config_json(
      {backend_json("good", "good_c"), backend_json("e", "good_c", false, R"("op_fallback": "error")")}));
  expect_loaded(r.backend("good"));
  expect_loaded(r.backend("e"));
}

TEST_CASE("config: op_fallback host:cpu names another backend, beside collective_fallback") {
  Registry r =
      load(config_json({backend_json("accel", "good_c", false,
                                     R"("op_fallback": "host:cpu", "collective_fallback": "host:cpu")"),
                        backend_json("cpu", "good_c")}));
  expect_loaded(r.backend("accel"));
  expect_loaded(r.backend("cpu"));
}

TEST_CASE("config: op_fallback host naming an unknown backend makes the config invalid") {
  const std::string msg =
      config_error_of(config_json({backend_json("accel", "good_c", false, R"("op_fallback": "host:cpus")"),
                                   backend_json("cpu", "good_c")}));
  BP_CHECK_CONTAINS(msg, "backends[0].op_fallback");
  BP_CHECK_CONTAINS(msg, "no backend named \"cpus\" in this file");
  BP_CHECK_CONTAINS(msg, "did you mean \"host:cpu\"?");
  BP_CHECK_CONTAINS(msg, "configured: \"cpu\"");
}

TEST_CASE("config: op_fallback host through itself makes the config invalid") {
  const std::string msg =
      config_error_of(config_json({backend_json("self", "good_c", false, R"("op_fallback": "host:self")"),
                                   backend_json("cpu", "good_c")}));
  BP_CHECK_CONTAINS(msg, "backends[0].op_fallback");
  BP_CHECK_CONTAINS(msg, "cannot fall back to itself");
}

TEST_CASE("config: op_fallback chains and cycles make the config invalid naming both paths") {
  std::string msg = config_error_of(config_json(
      {backend_json("a", "good_c", false, R"("op_fallback": "host:b")"),
       backend_json("b", "good_c", false, R"("op_fallback": "host:c")"), backend_json("c", "good_c")}));
  BP_CHECK_CONTAINS(msg, "backends[0].op_fallback");
  BP_CHECK_CONTAINS(msg, "\"b\" (backends[1].op_fallback) itself falls back to \"c\"");
  BP_CHECK_CONTAINS(msg, "does not chain");
  BP_CHECK_CONTAINS(msg, "cycle");
  msg = config_error_of(config_json({backend_json("a", "good_c", false, R"("op_fallback": "host:b")"),
                                     backend_json("b", "good_c", false, R"("op_fallback": "host:a")")}));
  BP_CHECK_CONTAINS(msg, "backends[0].op_fallback");
  BP_CHECK_CONTAINS(msg, "\"b\" (backends[1].op_fallback) itself falls back to \"a\"");
  // The chain's last link alone is fine, and a target that stages its
  // collectives (a different key) is no op_fallback chain.
  Registry r = load(config_json({backend_json("a", "good_c", false, R"("op_fallback": "host:b")"),
                                 backend_json("b", "good_c", false, R"("collective_fallback": "host:c")"),
                                 backend_json("c", "good_c")}));
  expect_loaded(r.backend("a"));
  expect_loaded(r.backend("b"));
}

TEST_CASE("config: an op_fallback of the wrong type or spelling makes the config invalid naming its path") {
  std::string msg =
      config_error_of(config_json({backend_json("accel", "good_c", false, R"("op_fallback": 5)")}));
  BP_CHECK_CONTAINS(msg, "backends[0].op_fallback");
  BP_CHECK_CONTAINS(msg, R"(expected "error" or "host:<backend>", got number 5)");
  for (const char* bad : {R"("local")", R"("host:")", R"("Host:cpu")", R"("")", "null", R"(["host:cpu"])"}) {
    INFO(bad);
    msg = config_error_of(
        config_json({backend_json("accel", "good_c", false, std::string("\"op_fallback\": ") + bad),
                     backend_json("cpu", "good_c")}));
    BP_CHECK_CONTAINS(msg, "backends[0].op_fallback");
    BP_CHECK_CONTAINS(msg, R"(expected "error" or "host:<backend>", got )");
    CHECK(msg.find("null null") == std::string::npos);  // a null is named once
  }
  msg = config_error_of(config_json(
      {backend_json("accel", "good_c", false, R"("op_fallback": null)"), backend_json("cpu", "good_c")}));
  BP_CHECK_CONTAINS(msg, R"(expected "error" or "host:<backend>", got null)");
  msg = config_error_of(config_json({backend_json("accel", "good_c", false, R"("op_fallbak": "error")")}));
  BP_CHECK_CONTAINS(msg, "backends[0].op_fallbak");
  BP_CHECK_CONTAINS(msg, "did you mean \"op_fallback\"");
}

TEST_CASE("config: OpFallback's to_string is the spelling backends.json reads back") {
  const OpFallback error;
  const OpFallback host{OpFallback::Kind::host, "cpu"};
  CHECK(error.to_string() == "error");
  CHECK(host.to_string() == "host:cpu");
  CHECK(to_string(host) == "host:cpu");
  std::ostringstream out;
  out << error << " " << host;
  CHECK(out.str() == "error host:cpu");
  for (const OpFallback& f : {error, host}) {
    INFO(f.to_string());
    Registry r = load(
        config_json({backend_json("accel", "good_c", false, "\"op_fallback\": \"" + f.to_string() + "\""),
                     backend_json("cpu", "good_c")}));
    expect_loaded(r.backend("accel"));
  }
}

TEST_CASE("config: a duplicate backend name makes the config invalid naming both entries") {
  const std::string msg =
      config_error_of(config_json({backend_json("dup", "good_c"), backend_json("dup", "good_c")}));
  BP_CHECK_CONTAINS(msg, "backends[1].name");
  BP_CHECK_CONTAINS(msg, "duplicate");
  BP_CHECK_CONTAINS(msg, "backends[0]");
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
  BP_CHECK_CONTAINS(e.message(),
                    std::to_string(backplane::kAbiMajor) + "." + std::to_string(backplane::kAbiMinor));
}

TEST_CASE("config: a failed optional backend does not make from_json throw") {
  Registry r = load(
      config_json({backend_json("good", "good_c", true), backend_json("gone", "no_such_plugin_anywhere")}),
      RequiredPolicy::throw_on_failure);
  expect_loaded(r.backend("good"));
  expect_failed(r.backend("gone"), Errc::plugin_load_failed);
  CHECK_FALSE(r.backend("gone").required());
  expect_adds(r.backend("good").device(0));
}

TEST_CASE("config: RequiredPolicy report keeps a failed required backend in the registry") {
  Registry r = load(
      config_json({backend_json("gone", "no_such_plugin_anywhere", true), backend_json("good", "good_c")}),
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
  Registry r =
      load(config_json({backend_json("alpha", "good_c"), backend_json("beta", "no_such_plugin_anywhere")}));
  Error e = error_from([&] { r.backend("gamma"); });
  CHECK(e.code() == Errc::not_found);
  BP_CHECK_CONTAINS(e.message(), "gamma");
  BP_CHECK_CONTAINS(e.message(), "alpha");
  BP_CHECK_CONTAINS(e.message(), "beta");
}

TEST_CASE("config: backends keep config order and default_backend picks the first loaded one") {
  Registry r = load(config_json({backend_json("gone", "no_such_plugin_anywhere"),
                                 backend_json("first", "good_c"), backend_json("second", "good_c")}));
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
  const fs::path file = tmp.write("cfg/backends.json", R"({"schema_version": 1, "backends": [
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
  const std::string text = config_json({backend_json("good", "good_c"), backend_json("other", "good_c")},
                                       R"("default_backend": "ghost")");
  Error e = error_from([&] { load(text); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "default_backend");
  BP_CHECK_CONTAINS(e.message(), "\"ghost\"");
}

TEST_CASE("config: torch_devices maps torch device types to backends, cpu defaults to default_backend") {
  Registry plain = load(config_json({backend_json("first", "good_c"), backend_json("second", "good_c")},
                                    R"("default_backend": "second")"));
  REQUIRE(plain.torch_backend("cpu").has_value());
  CHECK(plain.torch_backend("cpu")->name() == "second");
  CHECK_FALSE(plain.torch_backend("cuda").has_value());
  Registry mapped = load(config_json({backend_json("first", "good_c"), backend_json("second", "good_c")},
                                     R"("torch_devices": {"cpu": "first", "cuda": "second"})"));
  CHECK(mapped.torch_backend("cpu")->name() == "first");
  CHECK(mapped.torch_backend("cuda")->name() == "second");
}

TEST_CASE("config: a bad torch_devices throws config_error naming the path") {
  const auto error_of = [](const std::string& value) {
    return error_from(
        [&] { load(config_json({backend_json("good", "good_c")}, R"("torch_devices": )" + value)); });
  };
  const Error ghost = error_of(R"({"cpu": "ghost"})");
  CHECK(ghost.code() == Errc::config_error);
  BP_CHECK_CONTAINS(ghost.message(), "torch_devices.cpu");
  BP_CHECK_CONTAINS(ghost.message(), "\"ghost\" is not the name of any entry");
  const Error key = error_of(R"({"cudaa": "good"})");
  BP_CHECK_CONTAINS(key.message(), "torch_devices.cudaa");
  BP_CHECK_CONTAINS(key.message(), "did you mean \"cuda\"");
  BP_CHECK_CONTAINS(error_of(R"(["cpu"])").message(), "expected an object");
  BP_CHECK_CONTAINS(error_of(R"({"cpu": 1})").message(), "expected a string");
}

TEST_CASE("config: a backend name that is not a string makes the config invalid naming the path") {
  const std::string msg = config_error_of(
      config_json({R"({"name": 7, "library": "good_c", "required": true})", backend_json("good", "good_c")}),
      RequiredPolicy::throw_on_failure);
  BP_CHECK_CONTAINS(msg, "backends[0].name");
  BP_CHECK_CONTAINS(msg, "expected a string");
}

TEST_CASE("config: options that is an array makes the config invalid naming the path") {
  const std::string msg = config_error_of(config_json(
      {backend_json("arr", "good_c", false, R"("options": [])"), backend_json("good", "good_c")}));
  BP_CHECK_CONTAINS(msg, "backends[0].options");
  BP_CHECK_CONTAINS(msg, "expected an object");
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
  const std::string text =
      config_json({R"({"name": "twice", "library": "good_c", "library": "no_such_plugin"})"});
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

TEST_CASE("config: from_config on a FIFO, or a link to one, is config_error at once, never a blocked read") {
  TempDir tmp;
  const fs::path fifo = tmp / "backends.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const fs::path link = tmp / "link.json";
  fs::create_symlink(fifo, link);
  for (const fs::path& p : {fifo, link}) {
    Error e = error_from([&] { Registry::from_config(p); });
    CHECK(e.code() == Errc::config_error);
    BP_CHECK_CONTAINS(e.message(), p.string());
    BP_CHECK_CONTAINS(e.message(), "not a regular file");
  }
}

// ---- limits: depth, size, numbers -------------------------------------------

TEST_CASE("config: nesting deeper than the limit is refused naming the limit, without recursing") {
  // Deep enough to overflow the stack of any recursive walk.
  const std::size_t levels = 200000;
  const std::string deep = "{\"schema_version\": 1, \"backends\": [], \"x\": " + std::string(levels, '[') +
                           std::string(levels, ']') + "}";
  std::string msg = config_error_of(deep);
  BP_CHECK_CONTAINS(msg, "x[0][0]");
  BP_CHECK_CONTAINS(msg, "nested deeper than 64");
  BP_CHECK_CONTAINS(msg, "docs/configuration.md");
  // Inside options too, where any JSON is otherwise allowed.
  std::string options;
  for (int i = 0; i < 70; ++i) options += "{\"a\": ";
  options += "1" + std::string(70, '}');
  msg = config_error_of(config_json({backend_json("cpu", "good_c", false, "\"options\": " + options)}));
  BP_CHECK_CONTAINS(msg, "backends[0].options.a");
  BP_CHECK_CONTAINS(msg, "nested deeper than 64");
  // 60 levels are fine.
  std::string ok_options;
  for (int i = 0; i < 60; ++i) ok_options += "{\"a\": ";
  ok_options += "1" + std::string(60, '}');
  Registry r = load(config_json({backend_json("cpu", "good_c", false, "\"options\": " + ok_options)}));
  expect_loaded(r.backend("cpu"));
}

TEST_CASE("config: a document over 1 MiB is refused naming the limit") {
  const std::string big = config_json({backend_json("cpu", "good_c")}) + std::string((1u << 20) + 1, ' ');
  std::string msg = config_error_of(big);
  BP_CHECK_CONTAINS(msg, "1 MiB");
  BP_CHECK_CONTAINS(msg, "docs/configuration.md");
  // From a file as well, which is not read past the limit.
  TempDir tmp;
  const fs::path file = tmp.write("big.json", big);
  Error e = error_from([&] { Registry::from_config(file); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "big.json");
  BP_CHECK_CONTAINS(e.message(), "1 MiB");
}

TEST_CASE("config: numbers out of range are config_error naming their path") {
  SUBCASE("a double overflow inside options") {
    const std::string msg = config_error_of(
        config_json({backend_json("cpu", "good_c", false, R"("options": {"threads": 1e400})")}));
    BP_CHECK_CONTAINS(msg, "backends[0].options.threads");
    BP_CHECK_CONTAINS(msg, "out of range");
  }
  SUBCASE("a double overflow in an array") {
    const std::string msg =
        config_error_of(R"({"schema_version": 1, "backends": [], "plugin_dirs": ["a", -1e999]})");
    BP_CHECK_CONTAINS(msg, "plugin_dirs[1]");
    BP_CHECK_CONTAINS(msg, "out of range");
  }
  SUBCASE("schema_version beyond int64") {
    const std::string msg = config_error_of(R"({"schema_version": 18446744073709551617, "backends": []})");
    BP_CHECK_CONTAINS(msg, "schema_version");
  }
  SUBCASE("schema_version that wraps to 1 as int64 is still wrong") {
    // 2^64 + 1 does not fit; 18446744073709551615 is uint64 max, -1 as int64.
    BP_CHECK_CONTAINS(config_error_of(R"({"schema_version": 18446744073709551615, "backends": []})"),
                      "does not fit in a signed 64-bit integer");
    BP_CHECK_CONTAINS(config_error_of(R"({"schema_version": -1, "backends": []})"), "expected 1");
    BP_CHECK_CONTAINS(config_error_of(R"({"schema_version": 1.0, "backends": []})"), "expected an integer");
  }
}

// ---- names and NUL ---------------------------------------------------------

TEST_CASE("config: backend names are 1 to 64 of [A-Za-z0-9_.-], named by code point otherwise") {
  Registry r = load(config_json({backend_json("My_cpu-2.x", "good_c")}));
  expect_loaded(r.backend("My_cpu-2.x"));
  struct Case {
    std::string name_json;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{{R"("a\nb")", "U+000A"},
                                         {R"("a\u001b[31m")", "U+001B"},
                                         {R"("cpu:0")", "U+003A"},
                                         {R"("a b")", "U+0020"},
                                         {R"("caf\u00e9")", "U+00E9"},
                                         {R"("")", "must not be empty"},
                                         {"\"" + std::string(65, 'a') + "\"", "at most 64"}}) {
    INFO(c.name_json);
    const std::string msg = config_error_of(
        config_json({"{\"name\": " + c.name_json + ", \"library\": \"good_c\", \"required\": true}"}),
        RequiredPolicy::throw_on_failure);
    BP_CHECK_CONTAINS(msg, "backends[0].name");
    BP_CHECK_CONTAINS(msg, c.expected);
    // The message itself carries no raw control character to a terminal.
    CHECK(msg.find('\n') == std::string::npos);
    CHECK(msg.find('\x1b') == std::string::npos);
  }
  CHECK_NOTHROW(load(config_json({backend_json(std::string(64, 'a'), "good_c")})));
}

TEST_CASE("config: a NUL in any string or key is config_error naming its path") {
  struct Case {
    std::string text;
    std::string path;
  };
  for (const Case& c : std::vector<Case>{
           {config_json({R"({"name": "cpu", "library": "good_c\u0000evil"})"}), "backends[0].library"},
           {config_json({backend_json("cpu", "good_c", false, R"("options": {"k": "a\u0000b"})")}),
            "backends[0].options.k"},
           {config_json({backend_json("cpu", "good_c", false, R"("options": {"k\u0000": 1})")}),
            "backends[0].options.k\\u0000"},
           {config_json({backend_json("cpu", "good_c", false, R"("options": {"list": ["x", "\u0000"]})")}),
            "backends[0].options.list[1]"},
           {R"({"schema_version": 1, "backends": [], "plugin_dirs": ["a\u0000"]})", "plugin_dirs[0]"},
           {config_json({backend_json("cpu", "good_c")}, R"("default_backend": "cpu\u0000")"),
            "default_backend"}}) {
    INFO(c.text);
    const std::string msg = config_error_of(c.text);
    BP_CHECK_CONTAINS(msg, c.path + ": ");
    BP_CHECK_CONTAINS(msg, "NUL");
  }
}

// ---- who may write the config ---------------------------------------------

TEST_CASE("config: a config file anyone can write is refused with the fix") {
  TempDir tmp;
  const fs::path file = tmp.write("cfg/backends.json", config_json({backend_json("good", "good_c")}));
  Registry ok = Registry::from_config(file);  // 0644 under the usual umask
  expect_loaded(ok.backend("good"));

  fs::permissions(file, fs::perms(0666));
  Error e = error_from([&] { Registry::from_config(file); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), file.string());
  BP_CHECK_CONTAINS(e.message(), "writable by anyone");
  BP_CHECK_CONTAINS(e.message(), "chmod go-w " + file.string());

  fs::permissions(file, fs::perms(0620));
  BP_CHECK_CONTAINS(error_from([&] { Registry::from_config(file); }).message(), "writable by its group");

  // The folder that holds it counts too: whoever can write it can replace the file.
  fs::permissions(file, fs::perms(0644));
  fs::permissions(tmp / "cfg", fs::perms(0777));
  e = error_from([&] { Registry::from_config(file); });
  CHECK(e.code() == Errc::config_error);
  BP_CHECK_CONTAINS(e.message(), "folder");
  BP_CHECK_CONTAINS(e.message(), "chmod go-w " + (tmp / "cfg").string());
  fs::permissions(tmp / "cfg", fs::perms(0755));
}

// ---- where the default config is looked for --------------------------------

TEST_CASE("config: a backends.json in the current folder is not the default") {
  TempDir tmp;
  tmp.write("backends.json", config_json({backend_json("planted", "good_c", true)}));
  ScopedEnv env("BACKPLANE_CONFIG", std::nullopt);
  const fs::path before = fs::current_path();
  fs::current_path(tmp.path());
  const fs::path chosen = Registry::default_config_path();
  std::string outcome;
  try {
    for (const Backend& b : Registry::from_env().backends()) outcome += b.name() + " ";
  } catch (const Error& e) {
    outcome = e.message();
  }
  fs::current_path(before);
  INFO("default_config_path: " << chosen.string() << "; from_env: " << outcome);
  CHECK(chosen != fs::path("backends.json"));
  std::error_code ec;
  CHECK_FALSE(fs::equivalent(chosen, tmp / "backends.json", ec));
  CHECK(outcome.find("planted") == std::string::npos);
}

// ---- fuzz -------------------------------------------------------------------

TEST_CASE("config: random mutations of a valid config give a registry or a backplane::Error, nothing else") {
  const std::string seed_text = config_json(
      {backend_json("cpu", "good_c", true,
                    R"("options": {"threads": 2, "list": [1, 2.5, "x"]}, "collective_fallback": "local")"),
       backend_json("staged", "no_such_plugin", false, R"("collective_fallback": "host:cpu")")},
      R"("default_backend": "cpu")");
  const std::string alphabet = "{}[]\":,\\ 0123456789-+.eE\nabtrufnl\x01\x7f\xc3\xa9u";
  std::mt19937 rng(20240611);  // fixed: failures reproduce
  auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  std::size_t ok = 0, refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text = seed_text;
    const std::size_t edits = 1 + pick(4);
    for (std::size_t k = 0; k < edits && !text.empty(); ++k) {
      const std::size_t at = pick(text.size());
      switch (pick(5)) {
        case 0:
          text[at] = alphabet[pick(alphabet.size())];
          break;
        case 1:
          text.insert(at, 1, alphabet[pick(alphabet.size())]);
          break;
        case 2:
          text.erase(at, 1 + pick(8));
          break;
        case 3:
          text.insert(at, text.substr(pick(text.size()), pick(32)));
          break;
        default:
          text.insert(at, std::string(1 + pick(100), pick(2) ? '[' : '{'));
          break;
      }
    }
    try {
      Registry r = load(text, pick(2) ? RequiredPolicy::report : RequiredPolicy::throw_on_failure);
      for (const Backend& b : r.backends()) CHECK_FALSE(b.name().empty());
      ++ok;
    } catch (const Error& e) {
      CHECK_FALSE(e.message().empty());
      ++refused;
    } catch (const std::exception& e) {
      FAIL("iteration " << iter << ": " << typeid(e).name() << ": " << e.what() << "\ninput: " << text);
    } catch (...) {
      FAIL("iteration " << iter << ": an exception of unknown type\ninput: " << text);
    }
  }
  CHECK(ok + refused == 3000);
  CHECK(refused > 0);
}
