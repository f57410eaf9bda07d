// Crash-isolated `backplane check` and `list --isolate`: each backend loads in
// a child process with a deadline, so a plugin that segfaults, calls exit(),
// aborts, hangs or throws is reported as exactly that, the other backends are
// still checked, and check's exit code still says whether the required ones loaded.
#include "cli_runner.hpp"
#include "test_support.hpp"

#include <nlohmann/json.hpp>

#include <dirent.h>

using namespace bptest;
using bpcli::Result;
using Json = nlohmann::json;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 64;

// Sanitizer runtimes turn a SEGV into their own report and exit(1); the
// children must die of the signal itself, as they do in a plain build. This
// replaces any ASAN_OPTIONS the suite runs with (the sanitizer presets set one).
bpcli::Options child_signals() {
  return {{{"ASAN_OPTIONS", "handle_segv=0:handle_abort=0:handle_sigbus=0:handle_sigfpe=0:detect_leaks=0"}},
          {}};
}

Result cli(const TempDir& tmp, const std::vector<std::string>& args) {
  Result r = bpcli::run(args, tmp.path(), child_signals());
  REQUIRE_MESSAGE(r.exited, r.describe());
  return r;
}

std::string config_of(const std::vector<std::string>& backends) {
  std::string out =
      "{\"schema_version\": 1, \"plugin_dirs\": [" + json_path(fixture_dir()) + "], \"backends\": [";
  for (std::size_t i = 0; i < backends.size(); ++i) out += (i ? ", " : "") + backends[i];
  return out + "]}";
}

// Every misbehaving fixture, all optional, plus a good required one.
std::string misbehaving_config() {
  return config_of(
      {backend_json("good", "good_c", true), backend_json("segv", "crash_segv"),
       backend_json("exits", "crash_exit"), backend_json("aborts", "crash_abort"),
       backend_json("hangs", "hang_create"),
       backend_json("throws", "throws_nonstd", false, "\"options\": {\"throw_in\": \"create\"}")});
}

// The line of `check`'s output that starts with `status` and names `name`.
std::string check_line(const std::string& out, const std::string& status, const std::string& name) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(status, 0) == 0 && line.find(" " + name + " ") != std::string::npos) return line;
  return "";
}

// Processes still running `__load-backend` for `config`: there must be none
// once the command has returned.
std::vector<std::string> leftover_children(const fs::path& config) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = bpcli::slurp(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find("__load-backend") != std::string::npos &&
        cmdline.find(config.string()) != std::string::npos)
      found.push_back(pid + ": " + cmdline);
  }
  return found;
}

}  // namespace

TEST_CASE(
    "isolation: check reports a segfault, exit(3), abort, a hang and a throw exactly, and checks the rest") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", misbehaving_config());
  const Result r = cli(tmp, {"check", "--config", config.string(), "--timeout", "2"});
  INFO(r.describe());
  CHECK(r.code == kExitOk);  // every failing backend is optional
  CHECK_FALSE(check_line(r.out, "ok", "good").empty());
  BP_CHECK_CONTAINS(check_line(r.out, "FAILED", "segv"), "killed by signal 11 (SIGSEGV) while loading");
  BP_CHECK_CONTAINS(check_line(r.out, "FAILED", "exits"), "called exit(3) while loading");
  BP_CHECK_CONTAINS(check_line(r.out, "FAILED", "aborts"), "killed by signal 6 (SIGABRT) while loading");
  BP_CHECK_CONTAINS(check_line(r.out, "FAILED", "hangs"), "did not return within 2 s; killed");
  BP_CHECK_CONTAINS(check_line(r.out, "FAILED", "throws"),
                    "plugin entry create threw a non-standard exception (of type int)");
  BP_CHECK_CONTAINS(r.out, "all required backends loaded (1 of 6 loaded)");
  BP_CHECK_CONTAINS(r.err, "5 optional backends failed to load: segv, exits, aborts, hangs, throws");
  // The hung child (which ignores SIGTERM) and its group were killed and reaped.
  CHECK(leftover_children(config).empty());
}

TEST_CASE("isolation: a required backend that crashes makes check exit 1, naming it") {
  TempDir tmp;
  const fs::path config = tmp.write(
      "backends.json", config_of({backend_json("good", "good_c"), backend_json("segv", "crash_segv", true)}));
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == kExitFailed);
  CHECK_FALSE(check_line(r.out, "ok", "good").empty());
  BP_CHECK_CONTAINS(check_line(r.out, "FAILED", "segv"), "killed by signal 11 (SIGSEGV) while loading");
  BP_CHECK_CONTAINS(r.err, "1 required backend failed to load: segv");
}

TEST_CASE("isolation: a required backend that hangs makes check exit 1 after --timeout") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", config_of({backend_json("hangs", "hang_create", true)}));
  const Result r = cli(tmp, {"check", "--config", config.string(), "--timeout", "1"});
  INFO(r.describe());
  CHECK(r.code == kExitFailed);
  BP_CHECK_CONTAINS(check_line(r.out, "FAILED", "hangs"), "did not return within 1 s; killed");
  BP_CHECK_CONTAINS(r.out, "raise --timeout");
  CHECK(leftover_children(config).empty());
}

TEST_CASE("isolation: list --isolate --json reports each misbehaving backend as failed with its reason") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", misbehaving_config());
  const Result r = cli(tmp, {"list", "--config", config.string(), "--isolate", "--timeout", "2", "--json"});
  INFO(r.describe());
  REQUIRE(r.code == kExitOk);
  const Json j = Json::parse(r.out);
  CHECK(j["config"] == config.string());
  CHECK(j["default_backend"] == "good");
  REQUIRE(j["backends"].size() == 6);
  CHECK(j["backends"][0]["status"] == "loaded");
  CHECK(j["backends"][0]["devices"].size() == 1);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"segv", "killed by signal 11 (SIGSEGV) while loading"},
      {"exits", "called exit(3) while loading"},
      {"aborts", "killed by signal 6 (SIGABRT) while loading"},
      {"hangs", "did not return within 2 s; killed"},
      {"throws", "threw a non-standard exception"}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const Json& b = j["backends"][i + 1];
    CAPTURE(b.dump());
    CHECK(b["name"] == expected[i].first);
    CHECK(b["status"] == "failed");
    CHECK(b["error_code"] == "plugin_load_failed");
    BP_CHECK_CONTAINS(b["error"].get<std::string>(), expected[i].second);
    CHECK(b["devices"].empty());
  }
}

TEST_CASE("isolation: for good plugins, list --isolate prints what list prints") {
  TempDir tmp;
  const fs::path config = tmp.write(
      "backends.json",
      config_of({backend_json("good", "good_c", true), backend_json("memory", "core_memory"),
                 backend_json("unavail", "unavailable"), backend_json("missing", "no_such_plugin")}));
  for (const bool json : {false, true}) {
    CAPTURE(json);
    std::vector<std::string> args = {"list", "--config", config.string()};
    if (json) args.push_back("--json");
    const Result plain = cli(tmp, args);
    args.push_back("--isolate");
    const Result isolated = cli(tmp, args);
    CHECK(plain.code == kExitOk);
    CHECK(isolated.code == kExitOk);
    CHECK(isolated.out == plain.out);
    CHECK(isolated.err == plain.err);
  }
}

TEST_CASE("isolation: a config error is still exit 2 naming the path, and nothing is loaded") {
  TempDir tmp;
  const fs::path config =
      tmp.write("backends.json",
                "{\"schema_version\": 1, \"backends\": [{\"name\": \"segv\", \"library\": \"crash_segv\", "
                "\"requird\": true}]}");
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == 2);
  BP_CHECK_CONTAINS(r.err, "backends[0]");
  CHECK(r.out.find("SIGSEGV") == std::string::npos);
}

TEST_CASE("isolation: --timeout must be a positive number of seconds") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", config_of({backend_json("good", "good_c")}));
  const Result r = cli(tmp, {"check", "--config", config.string(), "--timeout", "0"});
  CHECK(r.code == kExitUsage);
  BP_CHECK_CONTAINS(r.err, "--timeout");
}

TEST_CASE(
    "isolation: train --backend cpu runs to the end beside optional backends that would segfault or hang") {
  // They are never loaded: a job loads only the backends it uses (and the required ones).
  TempDir tmp;
  const fs::path config =
      tmp.write("backends.json",
                config_json({backend_json("cpu", "backplane_cpu", true), backend_json("segv", "crash_segv"),
                             backend_json("hangs", "hang_create"), backend_json("exits", "crash_exit")}));
  const std::string digits = std::string(BP_TEST_SOURCE_DIR) + "/data/digits.csv.gz";
  const Result r = cli(tmp, {"train", "--backend", "cpu", "--nproc", "1", "--epochs", "1", "--config",
                             config.string(), "--data", digits});
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.out, "test accuracy");
}
