// Tests of the `backplane` command-line tool, run as a child process: exit
// codes, `list --json` contents, `check` reports, `conformance` (table and exit
// codes, on cpu and on a deliberately wrong fixture), config errors, the
// repository's own backends.json, --version and bad command lines.
#include "cli_runner.hpp"
#include "test_support.hpp"

#include <backplane/abi.h>  // the plugin-side names these tests check against
#include <backplane/version.hpp>

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include "scratch_mount.hpp"

#ifndef BP_TEST_SOURCE_DIR
#error "BP_TEST_SOURCE_DIR must name the source tree"
#endif
#ifndef BP_TEST_RELEASE_LAYOUT
#error "BP_TEST_RELEASE_LAYOUT must be 1 when the build folder is <source>/build (the release preset), else 0"
#endif

using namespace bptest;
using bpcli::Result;
using Json = nlohmann::json;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitConfig = 2;
constexpr int kExitUsage = 64;

// Runs the CLI and requires that it exited on its own (no crash).
Result cli(const TempDir& tmp, const std::vector<std::string>& args, const bpcli::Options& options = {}) {
  Result r = bpcli::run(args, tmp.path(), options);
  REQUIRE_MESSAGE(r.exited, r.describe());
  return r;
}

// `backplane train` with `args`, the config and a data file that does not
// exist: a pre-check refusal must come before anything is read or launched.
Result train_refused(const TempDir& tmp, const fs::path& config, std::vector<std::string> args,
                     const bpcli::Options& options = {}) {
  args.insert(args.begin(), "train");
  for (const std::string& a :
       {std::string("--epochs"), std::string("1"), std::string("--config"), config.string(),
        std::string("--data"), (tmp / "no_such_data.csv.gz").string()})
    args.push_back(a);
  return cli(tmp, args, options);
}

bool starts_with(const std::string& text, std::string_view prefix) { return text.rfind(prefix, 0) == 0; }

bool has_name(const Json& names, std::string_view name) {
  return names.is_array() && std::find(names.begin(), names.end(), Json(name)) != names.end();
}

// Parses stdout as one JSON object; fails the test with the output otherwise.
Json parse_stdout(const Result& r) {
  Json j;
  try {
    j = Json::parse(r.out);
  } catch (const Json::parse_error& e) {
    FAIL("stdout is not JSON (" << e.what() << "): " << r.describe());
  }
  REQUIRE(j.is_object());
  return j;
}

// {"schema_version": 1, "plugin_dirs": [<real plugin dir>], "backends": [cpu (required), nope]}
std::string cpu_and_missing_config(bool missing_required) {
  return "{\"schema_version\": 1, \"plugin_dirs\": [" + json_path(plugin_dir()) + "], \"backends\": [" +
         backend_json("cpu", "backplane_cpu", true) + ", " + backend_json("nope", "nope", missing_required) +
         "]}";
}

const fs::path kCpuLibrary = plugin_dir() / "libbackplane_cpu.so";

std::string abi_text() { return std::to_string(BP_ABI_MAJOR) + "." + std::to_string(BP_ABI_MINOR); }

// The checks shared by every listing of the repository's backends.json.
void expect_repository_listing(const Result& r, const fs::path& config) {
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  const Json j = parse_stdout(r);
  CHECK(j["config"] == config.string());
  CHECK(j["default_backend"] == "cpu");
  // cpu, then the optional cuda backend: loaded, unavailable (no GPU) or
  // failed (not built here), never required.
  REQUIRE(j["backends"].size() == 2);
  CHECK(j["backends"][1]["name"] == "cuda");
  CHECK(j["backends"][1]["required"] == false);
  const Json& cpu = j["backends"][0];
  CHECK(cpu["name"] == "cpu");
  CHECK(cpu["library"] == "backplane_cpu");
  CHECK(cpu["status"] == "loaded");
  CHECK(cpu["error"].is_null());
  CHECK(cpu["required"] == true);
  CHECK(cpu["collective_fallback"] == "error");
  REQUIRE(cpu["library_path"].is_string());
  CHECK(fs::equivalent(cpu["library_path"].get<std::string>(), kCpuLibrary));
  REQUIRE(cpu["devices"].size() == 1);
  CHECK(cpu["devices"][0]["index"] == 0);
}

}  // namespace

// ---- list --json -------------------------------------------------------------

TEST_CASE("list: json shows the loaded cpu backend and a missing library as failed and exits 0") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", cpu_and_missing_config(/*missing_required=*/true));
  const Result r = cli(tmp, {"list", "--json", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == kExitOk);  // list succeeds once the config was read, even with a required failure
  const Json j = parse_stdout(r);
  CHECK(j["config"] == config.string());
  CHECK(j["default_backend"] == "cpu");
  REQUIRE(j["backends"].is_array());
  REQUIRE(j["backends"].size() == 2);

  const Json& cpu = j["backends"][0];
  CHECK(cpu["name"] == "cpu");
  CHECK(cpu["library"] == "backplane_cpu");
  REQUIRE(cpu["library_path"].is_string());
  CHECK(fs::equivalent(cpu["library_path"].get<std::string>(), kCpuLibrary));
  REQUIRE(cpu["version"].is_string());
  CHECK_FALSE(cpu["version"].get<std::string>().empty());
  CHECK(cpu["abi_version"] == abi_text());
  CHECK(cpu["status"] == "loaded");
  CHECK(cpu["error"].is_null());
  CHECK(cpu["error_code"].is_null());
  CHECK(cpu["required"] == true);
  CHECK(cpu["collective_fallback"] == "error");
  CHECK(cpu["op_fallback"] == "error");
  CHECK(has_name(cpu["capabilities"], "host_visible"));
  CHECK(has_name(cpu["capabilities"], "collective"));  // Gloo
  REQUIRE(cpu["devices"].is_array());
  REQUIRE(cpu["devices"].size() == 1);
  const Json& dev = cpu["devices"][0];
  CHECK(dev["index"] == 0);
  REQUIRE(dev["name"].is_string());
  CHECK_FALSE(dev["name"].get<std::string>().empty());
  CHECK(has_name(dev["capabilities"], "host_visible"));
  CHECK(has_name(dev["capabilities"], "collective"));
  REQUIRE(dev["attributes"].is_object());
  CHECK(dev["attributes"].contains("threads"));
  // Total and free memory when the plugin reports them (device_memory), else null.
  CHECK((dev["memory_bytes"].is_number_unsigned() || dev["memory_bytes"].is_null()));
  CHECK((dev["memory_free_bytes"].is_number_unsigned() || dev["memory_free_bytes"].is_null()));

  const Json& nope = j["backends"][1];
  CHECK(nope["name"] == "nope");
  CHECK(nope["library"] == "nope");
  CHECK(nope["library_path"].is_null());
  CHECK(nope["version"].is_null());
  CHECK(nope["abi_version"].is_null());
  CHECK(nope["status"] == "failed");
  REQUIRE(nope["error"].is_string());
  BP_CHECK_CONTAINS(nope["error"].get<std::string>(), "not found");
  BP_CHECK_CONTAINS(nope["error"].get<std::string>(), "nope");
  CHECK(nope["error_code"] == "plugin_load_failed");
  CHECK(nope["required"] == true);
  CHECK(nope["capabilities"] == Json::array());
  CHECK(nope["devices"] == Json::array());
}

TEST_CASE("list: text output shows each backend with its status and the failure reason") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", cpu_and_missing_config(/*missing_required=*/false));
  const Result r = cli(tmp, {"list", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.out, "2 configured, 1 loaded");
  BP_CHECK_CONTAINS(r.out, "cpu  (default)");
  BP_CHECK_CONTAINS(r.out, "FAILED (plugin_load_failed)");
  BP_CHECK_CONTAINS(r.out, "[0] cpu:0");
  BP_CHECK_CONTAINS(r.out, "not found");
}

namespace {
// {"plugin_dirs": [<fixture dir>], "backends": [gpu (the unavailable fixture), mem (core_memory)]}
std::string unavailable_config(bool gpu_required) {
  return "{\"schema_version\": 1, \"plugin_dirs\": [" + json_path(fixture_dir()) + "], \"backends\": [" +
         backend_json("gpu", "unavailable", gpu_required) + ", " + backend_json("mem", "core_memory") + "]}";
}
}  // namespace

TEST_CASE("list: an unavailable backend shows 0 devices and the reason, devices show their memory") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", unavailable_config(/*gpu_required=*/false));
  SUBCASE("text") {
    const Result r = cli(tmp, {"list", "--config", config.string()});
    INFO(r.describe());
    CHECK(r.code == kExitOk);
    BP_CHECK_CONTAINS(r.out, "2 configured, 1 loaded, 1 unavailable");
    BP_CHECK_CONTAINS(r.out, "gpu: 0 devices (driver not found: libfixture_driver.so.1");
    BP_CHECK_CONTAINS(r.out, "unavailable");
    BP_CHECK_CONTAINS(r.out, "4.0 GiB (3.0 GiB free)");
    BP_CHECK_CONTAINS(r.out, "2.0 GiB (1.0 GiB free)");
  }
  SUBCASE("json") {
    const Result r = cli(tmp, {"list", "--json", "--config", config.string()});
    INFO(r.describe());
    CHECK(r.code == kExitOk);
    const Json j = parse_stdout(r);
    REQUIRE(j["backends"].size() == 2);
    const Json& gpu = j["backends"][0];
    CHECK(gpu["status"] == "unavailable");
    CHECK(gpu["error_code"] == "backend_unavailable");
    REQUIRE(gpu["error"].is_string());
    BP_CHECK_CONTAINS(gpu["error"].get<std::string>(), "driver not found");
    CHECK(gpu["devices"] == Json::array());
    CHECK(gpu["version"] == "1.2.3");  // it loaded: only its devices are out of reach
    const Json& mem = j["backends"][1];
    CHECK(mem["status"] == "loaded");
    REQUIRE(mem["devices"].size() == 2);
    CHECK(mem["devices"][0]["memory_bytes"] == (uint64_t{4} << 30));
    CHECK(mem["devices"][0]["memory_free_bytes"] == (uint64_t{3} << 30));
    CHECK(mem["devices"][1]["memory_bytes"] == (uint64_t{2} << 30));
  }
}

// ---- check -------------------------------------------------------------------

TEST_CASE("check: a failed required backend exits 1 naming the backend and the reason") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", cpu_and_missing_config(/*missing_required=*/true));
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == kExitFailed);
  BP_CHECK_CONTAINS(r.out, "ok      cpu");
  BP_CHECK_CONTAINS(r.out, "FAILED  nope  required  plugin_load_failed: ");
  BP_CHECK_CONTAINS(r.out, "library \"nope\" not found");
  BP_CHECK_CONTAINS(r.out, "hint: ");
  BP_CHECK_CONTAINS(r.err, "backplane: error: 1 required backend failed to load: nope");
  CHECK(r.out.find("all required backends loaded") == std::string::npos);
}

TEST_CASE("check: a failed optional backend is a warning and exits 0") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", cpu_and_missing_config(/*missing_required=*/false));
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.out, "ok      cpu");
  BP_CHECK_CONTAINS(r.out, "FAILED  nope  optional  plugin_load_failed: ");
  BP_CHECK_CONTAINS(r.out, "all required backends loaded (1 of 2 loaded)");
  BP_CHECK_CONTAINS(r.err, "backplane: warning: 1 optional backend failed to load: nope");
  CHECK(r.err.find("backplane: error:") == std::string::npos);
}

TEST_CASE("check: an unavailable optional backend is a warning naming the reason and exits 0") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", unavailable_config(/*gpu_required=*/false));
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.out, "UNAVAIL gpu");
  BP_CHECK_CONTAINS(r.out, "unavailable: driver not found");
  BP_CHECK_CONTAINS(r.out, "ok      mem");
  BP_CHECK_CONTAINS(r.out, "all required backends loaded (1 of 2 loaded)");
  BP_CHECK_CONTAINS(r.err, "backplane: warning: 1 optional backend unavailable: gpu (driver not found");
}

TEST_CASE("check: an unavailable required backend exits 1 naming it and the reason") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", unavailable_config(/*gpu_required=*/true));
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == kExitFailed);
  BP_CHECK_CONTAINS(r.out, "UNAVAIL gpu");
  BP_CHECK_CONTAINS(r.out, "hint: ");
  BP_CHECK_CONTAINS(r.err, "backplane: error: 1 required backend unavailable: gpu (driver not found");
  CHECK(r.out.find("all required backends loaded") == std::string::npos);
}

TEST_CASE("train: a device that cannot train is refused up front, naming everything it lacks") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", "{\"schema_version\": 1, \"plugin_dirs\": [" +
                                                         json_path(fixture_dir()) + "], \"backends\": [" +
                                                         backend_json("gaps", "core_training_gaps") + "]}");
  for (const char* nproc : {"1", "2"}) {
    CAPTURE(nproc);
    const Result r = train_refused(tmp, config, {"--nproc", nproc});
    INFO(r.describe());
    CHECK(r.code == kExitFailed);
    BP_CHECK_CONTAINS(r.err, "gaps:0");
    BP_CHECK_CONTAINS(r.err, "cannot train");
    BP_CHECK_CONTAINS(r.err, "log_softmax on f32");
    BP_CHECK_CONTAINS(r.err, "matmul on f32");
    CHECK(r.err.find("no_such_data") == std::string::npos);
  }
}

// A partial backend modelled with the cpu plugin's options (fill, copy and
// matmul on f32 only, no 'collective'), with and without op_fallback, beside
// the full cpu backend it falls back to.
std::string partial_cpu_config() {
  const std::string partial =
      "\"options\": {\"ops\": [\"fill\", \"copy\", \"matmul\"], \"dtypes\": [\"f32\"], \"collective\": "
      "false}";
  return "{\"schema_version\": 1, \"plugin_dirs\": [" + json_path(plugin_dir()) + "], \"backends\": [" +
         backend_json("cpu", "backplane_cpu", true) + ", " +
         backend_json("partial", "backplane_cpu", false,
                      partial + ", \"op_fallback\": \"host:cpu\", \"collective_fallback\": \"host:cpu\"") +
         ", " +
         backend_json("partial_nocoll", "backplane_cpu", false, partial + ", \"op_fallback\": \"host:cpu\"") +
         ", " + backend_json("bare", "backplane_cpu", false, partial) + "]}";
}

const std::string kDigits = std::string(BP_TEST_SOURCE_DIR) + "/data/digits.csv.gz";

TEST_CASE("list: each backend's op_fallback is shown, in text and json, with and without --isolate") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", partial_cpu_config());
  for (const bool isolate : {false, true}) {
    CAPTURE(isolate);
    std::vector<std::string> args{"list", "--config", config.string()};
    if (isolate) args.emplace_back("--isolate");
    Result r = cli(tmp, args);
    INFO(r.describe());
    REQUIRE(r.code == kExitOk);
    BP_CHECK_CONTAINS(r.out, "op_fallback");
    BP_CHECK_CONTAINS(r.out, "host:cpu");
    args.emplace_back("--json");
    r = cli(tmp, args);
    REQUIRE(r.code == kExitOk);
    const Json j = parse_stdout(r);
    std::map<std::string, std::string> by_name;
    for (const Json& b : j["backends"])
      by_name[b["name"].get<std::string>()] = b["op_fallback"].get<std::string>();
    CHECK(by_name ==
          std::map<std::string, std::string>{
              {"cpu", "error"}, {"partial", "host:cpu"}, {"partial_nocoll", "host:cpu"}, {"bare", "error"}});
  }
}

// `backplane train` on `backend` with a fixed seed; returns its metrics (key order kept).
nlohmann::ordered_json train_metrics(const TempDir& tmp, const fs::path& config, const std::string& backend,
                                     const char* nproc, Result* result = nullptr) {
  const fs::path metrics = tmp / (backend + "_" + nproc + ".json");
  const Result r =
      cli(tmp, {"train", "--backend", backend, "--nproc", nproc, "--epochs", "2", "--seed", "0", "--config",
                config.string(), "--data", kDigits, "--metrics-out", metrics.string()});
  INFO(r.describe());
  REQUIRE(r.code == kExitOk);
  if (result != nullptr) *result = r;
  return nlohmann::ordered_json::parse(bpcli::slurp(metrics));
}

// Per-epoch losses and test accuracy agree within 1e-5 relative.
void expect_same_training(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) {
  INFO(a["epoch_loss"].dump() << " vs " << b["epoch_loss"].dump());
  REQUIRE(a["epoch_loss"].size() == 2);
  REQUIRE(a["epoch_loss"].size() == b["epoch_loss"].size());
  for (std::size_t i = 0; i < a["epoch_loss"].size(); ++i) {
    const double x = a["epoch_loss"][i], y = b["epoch_loss"][i];
    CHECK(std::abs(x - y) <= 1e-5 * std::abs(y));
  }
  const double acc_a = a["test_accuracy"], acc_b = b["test_accuracy"];
  CHECK(std::abs(acc_a - acc_b) <= 1e-5 * std::abs(acc_b));
}

TEST_CASE("train: a partial backend with op_fallback trains like cpu and reports what fell back") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", partial_cpu_config());
  Result r;
  const nlohmann::ordered_json partial = train_metrics(tmp, config, "partial", "2", &r);
  const nlohmann::ordered_json cpu = train_metrics(tmp, config, "cpu", "2");
  expect_same_training(partial, cpu);
  INFO(r.describe());
  // Up front: one line of what will fall back; at the end: one line of what did.
  BP_CHECK_CONTAINS(r.out, "op_fallback: ");
  BP_CHECK_CONTAINS(r.out, " (op, dtype) pairs will run on cpu:0 for partial:0: ");
  BP_CHECK_CONTAINS(r.out, "held there: i64, bool, f64 tensors");
  BP_CHECK_CONTAINS(r.out, " (op, dtype) pairs ran on cpu:0 for partial:0: ");
  BP_CHECK_CONTAINS(r.out, " calls, ");
  BP_CHECK_CONTAINS(r.out, " moved, ");
  CHECK(r.out.find("sqrt") == std::string::npos);  // sgd
  // The metrics: op_fallbacks per (op, dtype), most time first.
  const nlohmann::ordered_json& f = partial["op_fallbacks"];
  REQUIRE(f.is_object());
  CHECK(f.contains("add/f32"));
  CHECK(f.contains("relu/f32"));
  CHECK_FALSE(f.contains("matmul/f32"));  // the partial device runs it
  CHECK_FALSE(f.contains("fill/f32"));
  double previous = std::numeric_limits<double>::infinity();
  for (const auto& [key, value] : f.items()) {
    CAPTURE(key);
    CHECK(value["calls"].get<uint64_t>() > 0);
    CHECK(value.contains("bytes_moved"));
    CHECK(value["seconds"].get<double>() <= previous);
    previous = value["seconds"].get<double>();
  }
  CHECK(f["add/f32"]["calls"].get<uint64_t>() > 0);
  // Nothing falls back on the full backend: an empty object, and no line.
  CHECK(cpu["op_fallbacks"].is_object());
  CHECK(cpu["op_fallbacks"].empty());
}

TEST_CASE("train: --nproc 1 needs no collective, on a partial backend with op_fallback") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", partial_cpu_config());
  const nlohmann::ordered_json cpu = train_metrics(tmp, config, "cpu", "1");
  // partial_nocoll: no 'collective' and collective_fallback "error".
  for (const char* backend : {"partial", "partial_nocoll"}) {
    CAPTURE(backend);
    Result r;
    const nlohmann::ordered_json one = train_metrics(tmp, config, backend, "1", &r);
    INFO(r.describe());
    CHECK(one["nproc"] == 1);
    expect_same_training(one, cpu);
    CHECK(one["op_fallbacks"].contains("relu/f32"));
    BP_CHECK_CONTAINS(r.out, "1 rank on ");
    CHECK(r.err.find("collective") == std::string::npos);
  }
  // With two ranks the one without a collective_fallback is refused up front.
  const Result two = train_refused(tmp, config, {"--backend", "partial_nocoll", "--nproc", "2"});
  INFO(two.describe());
  CHECK(two.code == kExitFailed);
  BP_CHECK_CONTAINS(two.err, "missing capabilities: collective");
  CHECK(two.err.find("unsupported ops") == std::string::npos);  // op_fallback covers every op
}

TEST_CASE("train: BACKPLANE_OP_FALLBACK=error turns every op_fallback back into the typed refusal") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", partial_cpu_config());
  bpcli::Options strict;
  strict.env["BACKPLANE_OP_FALLBACK"] = "error";
  const Result r = train_refused(tmp, config, {"--backend", "partial", "--nproc", "1"}, strict);
  INFO(r.describe());
  CHECK(r.code == kExitFailed);
  BP_CHECK_CONTAINS(r.err, "partial:0");
  BP_CHECK_CONTAINS(r.err, "add on f32");
  BP_CHECK_CONTAINS(r.err, "BACKPLANE_OP_FALLBACK");
}

TEST_CASE("train: without op_fallback the pre-check names every missing op and flag at once") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", partial_cpu_config());
  for (const char* nproc : {"1", "2"}) {
    CAPTURE(nproc);
    const Result r = train_refused(tmp, config, {"--backend", "bare", "--nproc", nproc});
    INFO(r.describe());
    CHECK(r.code == kExitFailed);
    BP_CHECK_CONTAINS(r.err, "bare:0");
    BP_CHECK_CONTAINS(r.err, "cannot train in f32");
    BP_CHECK_CONTAINS(r.err, std::string(nproc) == "1"
                                 ? "missing capabilities: i64, bool, f64\n"
                                 : "missing capabilities: i64, bool, f64, collective\n");
    // Every (op, dtype), those on the dtypes whose flag is missing included.
    for (const char* missing : {"add on f32", "relu on f32", "log_softmax on f32", "rand_uniform on f32",
                                "arange on i64", "eq on i64", "cast on bool", "argmax on f32", "sum on f64",
                                "gather on f32 (nn::cross_entropy; no 'i64' flag"})
      BP_CHECK_CONTAINS(r.err, missing);
    CHECK(r.err.find("matmul on f32") == std::string::npos);  // it has that
    CHECK(r.err.find("sqrt") == std::string::npos);           // plain SGD
    BP_CHECK_CONTAINS(r.err, "\"op_fallback\": \"host:<backend>\"");
    CHECK(r.err.find("no_such_data") == std::string::npos);
    CHECK(r.out.find("op_fallback: ") == std::string::npos);
  }
  const Result adam =
      train_refused(tmp, config, {"--backend", "bare", "--nproc", "1", "--optimizer", "adam"});
  INFO(adam.describe());
  CHECK(adam.code == kExitFailed);
  BP_CHECK_CONTAINS(adam.err, "sqrt on f32 (Adam)");
}

// `backplane train` for one epoch on cpu, writing `flag` to `path`.
Result train_writing(const TempDir& tmp, const std::string& flag, const fs::path& path) {
  const fs::path config = tmp.write("backends.json", partial_cpu_config());
  return cli(tmp, {"train", "--backend", "cpu", "--nproc", "1", "--epochs", "1", "--config", config.string(),
                   "--data", kDigits, flag, path.string()});
}

TEST_CASE(
    "train: a --metrics-out that fails to write (/dev/full) exits non-zero naming the file and the error") {
  TempDir tmp;
  const Result r = train_writing(tmp, "--metrics-out", "/dev/full");
  INFO(r.describe());
  CHECK(r.code == kExitFailed);
  BP_CHECK_CONTAINS(r.err, "--metrics-out: cannot write '/dev/full'");
  BP_CHECK_CONTAINS(r.err, std::strerror(ENOSPC));
}

TEST_CASE("train: --metrics-out and --plot on a full disk exit non-zero and leave no file under the name") {
  TempDir tmp;
  const fs::path dir = tmp.mkdir("full");
  bptest::ScratchMount small(dir.string(), 4096);
  if (!small.ok()) {
    MESSAGE("skipped: " << small.why_not());
    return;
  }
  {  // Fill it: the output's temporary file can be created, but not one byte written.
    std::ofstream filler(dir / "filler", std::ios::binary);
    const std::string block(1024, 'f');
    for (int i = 0; i < 64 && filler; ++i) filler << block << std::flush;
  }
  for (const std::string name : {"metrics.json", "loss.svg"}) {
    CAPTURE(name);
    const std::string flag = name == "loss.svg" ? "--plot" : "--metrics-out";
    const fs::path out = dir / name;
    const Result r = train_writing(tmp, flag, out);
    INFO(r.describe());
    CHECK(r.code == kExitFailed);
    BP_CHECK_CONTAINS(r.err, flag + ": cannot write '" + out.string() + "'");
    BP_CHECK_CONTAINS(r.err, std::strerror(ENOSPC));
    CHECK_FALSE(fs::exists(out));
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"filler"});  // no temporary file either
}

TEST_CASE("train: a --metrics-out in an unwritable directory is refused before training, naming the file") {
  TempDir tmp;
  const fs::path dir = tmp.mkdir("locked");
  std::optional<bptest::ScratchMount> read_only;
  REQUIRE(::chmod(dir.c_str(), 0555) == 0);
  if (::access(dir.c_str(), W_OK) == 0) {  // root: a read-only file system stops it
    REQUIRE(::chmod(dir.c_str(), 0755) == 0);
    read_only.emplace(dir.string(), 4096, /*read_only=*/true);
    if (!read_only->ok()) {
      MESSAGE("skipped: running as root, and " << read_only->why_not());
      return;
    }
  }
  const fs::path out = dir / "metrics.json";
  const Result r = train_writing(tmp, "--metrics-out", out);
  INFO(r.describe());
  ::chmod(dir.c_str(), 0755);
  CHECK(r.code == kExitFailed);
  BP_CHECK_CONTAINS(r.err, "--metrics-out: cannot write '" + out.string() + "'");
  BP_CHECK_CONTAINS(r.err, std::strerror(read_only ? EROFS : EACCES));
  CHECK(r.out.find("epoch 1/1") == std::string::npos);  // refused before training
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("check: malformed JSON exits 2 naming the file and the line and column") {
  TempDir tmp;
  const fs::path config = tmp.write("broken.json",
                                    "{\n"
                                    "  \"schema_version\": 1,\n"
                                    "  \"backends\": [ }\n"
                                    "}\n");
  for (const char* command : {"check", "list"}) {
    CAPTURE(command);
    const Result r = cli(tmp, {command, "--config", config.string()});
    INFO(r.describe());
    CHECK(r.code == kExitConfig);
    CHECK(starts_with(r.err, "backplane: error:"));
    BP_CHECK_CONTAINS(r.err, "broken.json");
    BP_CHECK_CONTAINS(r.err, "line 3, column 17");
    CHECK(r.out.empty());
  }
}

TEST_CASE("check: an invalid config exits 2 naming the offending key") {
  TempDir tmp;
  const fs::path config =
      tmp.write("backends.json", R"({"schema_version": 1, "backends": [], "plugin_dir": []})");
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == kExitConfig);
  CHECK(starts_with(r.err, "backplane: error:"));
  BP_CHECK_CONTAINS(r.err, "plugin_dir");
  BP_CHECK_CONTAINS(r.err, "unknown key");
}

TEST_CASE("check: a directory as --config exits 2 with a clear message") {
  TempDir tmp;
  const fs::path dir = tmp.mkdir("configs");
  for (const char* command : {"check", "list"}) {
    CAPTURE(command);
    const Result r = cli(tmp, {command, "--config", dir.string()});
    INFO(r.describe());
    CHECK(r.code == kExitConfig);
    CHECK(starts_with(r.err, "backplane: error:"));
    BP_CHECK_CONTAINS(r.err, dir.string());
    BP_CHECK_CONTAINS(r.err, "is a directory");
    CHECK(r.out.empty());
  }
}

TEST_CASE("check, list --isolate and train refuse a FIFO at once instead of waiting on it") {
  // A FIFO nobody writes: reading it would block forever (ctest's timeout
  // fails this test if any command does).
  TempDir tmp;
  const fs::path fifo = tmp / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"check", "--config", fifo.string()},
        std::vector<std::string>{"list", "--isolate", "--config", fifo.string()}}) {
    CAPTURE(args[0]);
    const Result r = cli(tmp, args);
    INFO(r.describe());
    CHECK(r.code == kExitConfig);
    BP_CHECK_CONTAINS(r.err, fifo.string());
    BP_CHECK_CONTAINS(r.err, "not a regular file");
  }
  const fs::path config = tmp.write("backends.json", cpu_and_missing_config(false));
  const Result t = cli(tmp, {"train", "--epochs", "1", "--nproc", "1", "--config", config.string(),
                             "--backend", "cpu", "--data", fifo.string()});
  INFO(t.describe());
  CHECK(t.code != kExitOk);
  BP_CHECK_CONTAINS(t.err, fifo.string());
  BP_CHECK_CONTAINS(t.err, "not a regular file");
}

TEST_CASE("check: a directory in BACKPLANE_CONFIG exits 2 naming the variable") {
  TempDir tmp;
  const fs::path dir = tmp.mkdir("configs");
  const Result r = cli(tmp, {"check"}, {{{"BACKPLANE_CONFIG", dir.string()}}, {}});
  INFO(r.describe());
  CHECK(r.code == kExitConfig);
  CHECK(starts_with(r.err, "backplane: error:"));
  BP_CHECK_CONTAINS(r.err, "BACKPLANE_CONFIG");
  BP_CHECK_CONTAINS(r.err, dir.string());
}

TEST_CASE("check: a missing --config file exits 2 naming it") {
  TempDir tmp;
  const fs::path missing = tmp / "no_such_backends.json";
  const Result r = cli(tmp, {"check", "--config", missing.string()});
  INFO(r.describe());
  CHECK(r.code == kExitConfig);
  CHECK(starts_with(r.err, "backplane: error:"));
  BP_CHECK_CONTAINS(r.err, missing.string());
  BP_CHECK_CONTAINS(r.err, "does not exist");
}

// A schema error anywhere makes the whole file invalid: a required entry with
// a typo is never dropped while the rest "passes".
TEST_CASE("check: a schema error in any entry exits 2 naming its path, for check and list") {
  TempDir tmp;
  const std::string dirs = "\"plugin_dirs\": [" + json_path(plugin_dir()) + "]";
  struct Case {
    std::string entry;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"name": "gpu", "library": "backplane_cpu", "required": true, "requird": true})",
            "backends[1].requird"},
           {R"({"name": 5, "library": "backplane_cpu", "required": true})", "backends[1].name"},
           {R"({"name": "gpu", "library": "backplane_cpu", "required": "yes"})", "backends[1].required"},
           {R"({"name": "gpu:0", "library": "backplane_cpu", "required": true})", "U+003A"},
           {R"({"name": "gpu", "library": "backplane_cpu", "options": {"x": 1e400}})",
            "backends[1].options.x"},
           {R"({"name": "gpu", "library": "backplane_cpu\u0000x"})", "backends[1].library"}}) {
    const fs::path config =
        tmp.write("backends.json", "{\"schema_version\": 1, " + dirs + ", \"backends\": [" +
                                       backend_json("cpu", "backplane_cpu", true) + ", " + c.entry + "]}");
    for (const char* command : {"check", "list"}) {
      CAPTURE(command);
      CAPTURE(c.entry);
      const Result r = cli(tmp, {command, "--config", config.string()});
      INFO(r.describe());
      CHECK(r.code == kExitConfig);
      CHECK(starts_with(r.err, "backplane: error:"));
      BP_CHECK_CONTAINS(r.err, c.expected);
      CHECK(r.out.empty());
    }
  }
}

TEST_CASE("check: a deeply nested or oversized config exits 2 naming the limit, never crashing") {
  TempDir tmp;
  const std::size_t levels = 100000;
  const fs::path deep =
      tmp.write("deep.json", "{\"schema_version\": 1, \"backends\": [" + std::string(levels, '[') +
                                 std::string(levels, ']') + "]}");
  Result r = cli(tmp, {"check", "--config", deep.string()});
  INFO(r.describe());
  CHECK(r.code == kExitConfig);
  BP_CHECK_CONTAINS(r.err, "nested deeper than 64");

  const fs::path big =
      tmp.write("big.json", "{\"schema_version\": 1, \"backends\": []}" + std::string(2u << 20, ' '));
  r = cli(tmp, {"list", "--config", big.string()});
  INFO(r.describe());
  CHECK(r.code == kExitConfig);
  BP_CHECK_CONTAINS(r.err, "1 MiB");
}

TEST_CASE("check: a config file anyone can write exits 2 saying why and how to fix it") {
  TempDir tmp;
  const fs::path config = tmp.write("cfg/backends.json", cpu_and_missing_config(false));
  fs::permissions(config, fs::perms(0666));
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == kExitConfig);
  BP_CHECK_CONTAINS(r.err, "writable by anyone");
  BP_CHECK_CONTAINS(r.err, "chmod go-w " + config.string());
  CHECK(r.out.empty());
}

// ---- conformance ---------------------------------------------------------------

TEST_CASE("conformance: --op add on the cpu backend prints the table, passes and exits 0") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", cpu_and_missing_config(/*missing_required=*/false));
  const Result r = cli(tmp, {"conformance", "--config", config.string(), "--backend", "cpu", "--op", "add"});
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.out, "conformance of cpu:0");
  BP_CHECK_CONTAINS(r.out, "pass  fail  skip  unsup");
  for (const char* dtype : {"f32", "f64", "i32", "i64"}) {
    CHECK_MESSAGE(r.out.find("\nadd  " + std::string(dtype)) != std::string::npos,
                  "no table row for add " << dtype);
  }
  CHECK(r.out.find("\nsub ") == std::string::npos);  // --op add runs add only
  BP_CHECK_CONTAINS(r.out, " 0 failed");
  BP_CHECK_CONTAINS(r.out, "conformance: PASS");
}

TEST_CASE("conformance: a plugin with a wrong add fails the table and exits 1") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", config_json({backend_json("skewed", "skewed", true)}));
  const Result r =
      cli(tmp, {"conformance", "--config", config.string(), "--backend", "skewed", "--op", "add"});
  INFO(r.describe());
  CHECK(r.code == kExitFailed);
  BP_CHECK_CONTAINS(r.out, "conformance: FAIL");
  BP_CHECK_CONTAINS(r.out, "got ");  // the first failure's detail, on add f32's row
  BP_CHECK_CONTAINS(r.err, "conformance case(s) failed on skewed:0");
}

TEST_CASE("conformance: without --backend every loaded backend is tested, a failed optional one warned of") {
  TempDir tmp;
  const std::string json = config_json({backend_json("cpu", "backplane_cpu", true),
                                        backend_json("opaque", "opaque"), backend_json("nope", "nope")});
  const fs::path config = tmp.write("backends.json", json);
  const Result r = cli(tmp, {"conformance", "--config", config.string(), "--op", "mul"});
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.out, "conformance of cpu:0");
  BP_CHECK_CONTAINS(r.out, "conformance of opaque:0");
  BP_CHECK_CONTAINS(r.out, "summary opaque:0: ");
  BP_CHECK_CONTAINS(r.err, "backplane: warning: backend \"nope\" failed to load, not tested");
}

TEST_CASE("conformance: an unknown backend exits 2, an unknown --op 64") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", cpu_and_missing_config(/*missing_required=*/false));
  const Result backend = cli(tmp, {"conformance", "--config", config.string(), "--backend", "nosuch"});
  CHECK_MESSAGE(backend.code == kExitConfig, backend.describe());
  BP_CHECK_CONTAINS(backend.err, "nosuch");
  const Result op =
      cli(tmp, {"conformance", "--config", config.string(), "--backend", "cpu", "--op", "addd"});
  CHECK_MESSAGE(op.code == kExitUsage, op.describe());
  BP_CHECK_CONTAINS(op.err, "addd");
  BP_CHECK_CONTAINS(op.err, "known ops:");
}

namespace {
// A cpu backend and "partial", the cpu plugin narrowed to fill, copy and
// matmul on f32, with `partial_extra` added to its entry.
std::string placement_config(std::string_view partial_extra) {
  std::string extra = R"("options": {"ops": ["fill", "copy", "matmul"], "dtypes": ["f32"]})";
  if (!partial_extra.empty()) extra += ", " + std::string(partial_extra);
  return config_json(
      {backend_json("cpu", "backplane_cpu", true), backend_json("partial", "backplane_cpu", true, extra)});
}
}  // namespace

TEST_CASE("conformance: --placement runs every case through the op_fallback and exits 0") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", placement_config(R"("op_fallback": "host:cpu")"));
  for (const char* op : {"add", "sum"}) {
    const Result r = cli(
        tmp, {"conformance", "--config", config.string(), "--backend", "partial", "--placement", "--op", op});
    INFO(r.describe());
    CHECK(r.code == kExitOk);
    BP_CHECK_CONTAINS(r.out, "conformance of partial:0");
    BP_CHECK_CONTAINS(r.out, "placement mode");
    BP_CHECK_CONTAINS(r.out, "op_fallback \"host:cpu\" ran ");
    BP_CHECK_CONTAINS(r.out, " 0 failed");
    BP_CHECK_CONTAINS(r.out, " 0 unsupported");
    CHECK(r.out.find("unsupported: ") == std::string::npos);
    BP_CHECK_CONTAINS(r.out, "conformance: PASS");
  }
  // Without --backend: the backends with an op_fallback are tested, the others listed.
  const Result all = cli(tmp, {"conformance", "--config", config.string(), "--placement", "--op", "add"});
  INFO(all.describe());
  CHECK(all.code == kExitOk);
  BP_CHECK_CONTAINS(all.out, "not tested with --placement: backend \"cpu\" has op_fallback \"error\"");
  BP_CHECK_CONTAINS(all.out, "summary partial:0: ");
  CHECK(all.out.find("summary cpu:0") == std::string::npos);
  // The normal mode ignores the fallback: add is not partial's own op.
  const Result normal =
      cli(tmp, {"conformance", "--config", config.string(), "--backend", "partial", "--op", "add"});
  INFO(normal.describe());
  CHECK(normal.code == kExitOk);
  BP_CHECK_CONTAINS(normal.out, "unsupported: binary: add on");
  CHECK(normal.out.find(" 0 unsupported") == std::string::npos);
}

TEST_CASE("conformance: --fallback-host sets the op_fallback, and --placement without one exits 2") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", placement_config(""));
  const Result none = cli(tmp, {"conformance", "--config", config.string(), "--backend", "partial",
                                "--placement", "--op", "add"});
  CHECK_MESSAGE(none.code == kExitConfig, none.describe());
  BP_CHECK_CONTAINS(none.err, "op_fallback");
  BP_CHECK_CONTAINS(none.err, "--fallback-host");

  const Result r = cli(tmp, {"conformance", "--config", config.string(), "--backend", "partial",
                             "--placement", "--fallback-host", "cpu", "--op", "mul"});
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.out, "op_fallback \"host:cpu\" ran ");
  BP_CHECK_CONTAINS(r.out, "conformance: PASS");

  const Result unknown = cli(tmp, {"conformance", "--config", config.string(), "--backend", "partial",
                                   "--placement", "--fallback-host", "nosuch", "--op", "mul"});
  CHECK_MESSAGE(unknown.code == kExitConfig, unknown.describe());
  BP_CHECK_CONTAINS(unknown.err, "nosuch");

  const Result usage = cli(tmp, {"conformance", "--config", config.string(), "--backend", "partial",
                                 "--fallback-host", "cpu", "--op", "mul"});
  CHECK_MESSAGE(usage.code == kExitUsage, usage.describe());
  BP_CHECK_CONTAINS(usage.err, "--placement");
}

// ---- the repository's backends.json ------------------------------------------

// The repository's backends.json names plugin_dirs ["build/plugins"] relative
// to itself. A copy next to build/plugins -> this build's plugin folder checks
// the file itself from any build folder.
TEST_CASE("repo config: the repository backends.json lists cpu loaded with one device") {
  TempDir tmp;
  const fs::path config = tmp / "backends.json";
  fs::copy_file(fs::path(BP_TEST_SOURCE_DIR) / "backends.json", config);
  tmp.mkdir("build");
  fs::create_directory_symlink(plugin_dir(), tmp / "build" / "plugins");

  SUBCASE("list --json --config") {
    expect_repository_listing(cli(tmp, {"list", "--json", "--config", config.string()}), config);
  }
  SUBCASE("list --json reads BACKPLANE_CONFIG without --config") {
    expect_repository_listing(cli(tmp, {"list", "--json"}, {{{"BACKPLANE_CONFIG", config.string()}}, {}}),
                              config);
  }
  SUBCASE("a backends.json in the current folder is not read unless named") {
    // Without --config or BACKPLANE_CONFIG the executable's own default is
    // read (the build tree's share/backplane), never the planted file.
    const Result r = cli(tmp, {"list", "--json"}, {{}, tmp.path()});
    INFO(r.describe());
    CHECK(r.code == kExitOk);
    CHECK(r.out.find(config.string()) == std::string::npos);
    CHECK(r.err.find(config.string()) == std::string::npos);
  }
  SUBCASE("check exits 0") {
    const Result r = cli(tmp, {"check"}, {{{"BACKPLANE_CONFIG", config.string()}}, tmp.path()});
    INFO(r.describe());
    CHECK(r.code == kExitOk);
    BP_CHECK_CONTAINS(r.out, "ok      cpu");
    // "(1 of 2 loaded)" where the optional cuda backend has no GPU or was not built.
    BP_CHECK_CONTAINS(r.out, "all required backends loaded (");
  }
}

// The file in place, exactly as README's first command uses it: only right
// when this build is the release preset's <source>/build, so the test is
// skipped (and not registered with ctest) for any other build folder.
TEST_CASE("repo config: the repository backends.json works in place from the release build folder" *
          doctest::skip(BP_TEST_RELEASE_LAYOUT == 0)) {
  TempDir tmp;
  const fs::path source = fs::path(BP_TEST_SOURCE_DIR);
  const fs::path config = source / "backends.json";
  expect_repository_listing(cli(tmp, {"list", "--json", "--config", config.string()}), config);
  const Result r = cli(tmp, {"check", "--config", "backends.json"}, {{}, source});
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.out, "ok      cpu");
  // "(1 of 2 loaded)" where the optional cuda backend has no GPU or was not built.
  BP_CHECK_CONTAINS(r.out, "all required backends loaded (");
}

// ---- version and usage ---------------------------------------------------------

TEST_CASE("version: --version prints the version and the plugin ABI version") {
  TempDir tmp;
  const Result r = cli(tmp, {"--version"});
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  CHECK(r.out == std::string("backplane ") + backplane::kVersion + " (plugin ABI " + abi_text() + ")\n");
  CHECK(r.err.empty());
}

TEST_CASE("usage: --help exits 0 and lists the subcommands and exit codes") {
  TempDir tmp;
  const Result r = cli(tmp, {"--help"});
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.out, "Usage: backplane");
  BP_CHECK_CONTAINS(r.out, "list");
  BP_CHECK_CONTAINS(r.out, "check");
  BP_CHECK_CONTAINS(r.out, "conformance");
  BP_CHECK_CONTAINS(r.out, "64  bad command line");
  const Result sub = cli(tmp, {"check", "--help"});
  CHECK(sub.code == kExitOk);
  BP_CHECK_CONTAINS(sub.out, "--config");
}

TEST_CASE("usage: an unknown subcommand exits 64 naming it") {
  TempDir tmp;
  const Result r = cli(tmp, {"frobnicate"});
  INFO(r.describe());
  CHECK(r.code == kExitUsage);
  CHECK(starts_with(r.err, "backplane: error: unknown subcommand 'frobnicate'"));
  BP_CHECK_CONTAINS(r.err, "backplane --help");
  CHECK(r.out.empty());
}

TEST_CASE("usage: an unknown flag exits 64 naming it") {
  TempDir tmp;
  const Result r = cli(tmp, {"list", "--bogus"});
  INFO(r.describe());
  CHECK(r.code == kExitUsage);
  CHECK(starts_with(r.err, "backplane: error:"));
  BP_CHECK_CONTAINS(r.err, "--bogus");
  BP_CHECK_CONTAINS(r.err, "backplane list --help");
  CHECK(r.out.empty());
}

TEST_CASE("usage: --config without its value exits 64") {
  TempDir tmp;
  const Result r = cli(tmp, {"check", "--config"});
  INFO(r.describe());
  CHECK(r.code == kExitUsage);
  CHECK(starts_with(r.err, "backplane: error:"));
  CHECK(r.out.empty());
}

TEST_CASE("usage: no subcommand exits 64 and prints the help to stderr") {
  TempDir tmp;
  const Result r = cli(tmp, {});
  INFO(r.describe());
  CHECK(r.code == kExitUsage);
  BP_CHECK_CONTAINS(r.err, "Usage: backplane");
  CHECK(r.out.empty());
}

TEST_CASE("train --trace: one timeline of every rank, clocks aligned within their error, and its summary") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", partial_cpu_config());
  const fs::path trace = tmp / "job.json";
  const Result r = cli(tmp, {"train", "--backend", "partial", "--nproc", "2", "--epochs", "1", "--config",
                             config.string(), "--data", kDigits, "--trace", trace.string()});
  INFO(r.describe());
  REQUIRE(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.err, "trace of 2 part(s)");
  for (const auto& e : fs::directory_iterator(tmp.path()))
    CHECK(e.path().extension() != ".part");  // merged and removed
  const nlohmann::json t = nlohmann::json::parse(bpcli::slurp(trace));
  std::map<int64_t, int> ops, fallbacks, steps, buckets, backwards, rendezvous, transports;
  std::map<int64_t, std::string> names;
  for (const auto& e : t["traceEvents"]) {
    const int64_t pid = e["pid"];
    if (e["ph"] == "M" && e["name"] == "process_name") names[pid] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    if (e["cat"] == "op") ++ops[pid];
    if (e["cat"] == "range" && e["name"] == "step") ++steps[pid];
    if (e["cat"] == "ddp" && e["name"] == "bucket") ++buckets[pid];
    if (e["cat"] == "autograd" && e["name"] == "backward") ++backwards[pid];
    if (e["cat"] == "job" && e["name"] == "rendezvous") ++rendezvous[pid];
    if (e["cat"] == "transport") {  // the cpu plugin's own span inside each collective
      ++transports[pid];
      CHECK(e["name"] == "shared_memory");
      CHECK(e["args"]["wait_ns"].get<int64_t>() >= 0);
      CHECK(e["args"]["wait_ns"].get<double>() <= e["dur"].get<double>() * 1000.0 + 1.0);
    }
    if (e["cat"] == "fallback") {
      ++fallbacks[pid];
      CHECK(e["args"]["for"] == "partial:0");
      CHECK(e["args"]["device"] == "cpu:0");
    }
  }
  for (int64_t rank : {0, 1}) {
    CAPTURE(rank);
    CHECK(ops[rank] > 0);
    CHECK(fallbacks[rank] > 0);
    CHECK(steps[rank] > 0);
    CHECK(backwards[rank] == steps[rank]);  // one backward per step
    CHECK(buckets[rank] >= steps[rank]);    // each backward all-reduces at least one bucket
    CHECK(rendezvous[rank] == 1);
    CHECK(transports[rank] >= buckets[rank]);
    CHECK(names[rank].rfind("rank " + std::to_string(rank) + " \xC2\xB7 ", 0) == 0);
  }
  // Both ranks read one clock here: the measured offset is within its error.
  const auto& ranks = t["otherData"]["backplane_trace"]["ranks"];
  REQUIRE(ranks.size() == 2);
  CHECK(ranks[1]["complete"] == true);
  REQUIRE(ranks[1]["clock_error_us"].is_number());
  const double offset = ranks[1]["clock_offset_us"], error = ranks[1]["clock_error_us"];
  CHECK(std::abs(offset) <= error + 1.0);

  const Result text = cli(tmp, {"trace", "summary", trace.string()});
  INFO(text.describe());
  REQUIRE(text.code == kExitOk);
  BP_CHECK_CONTAINS(text.out, "top ops by total time");
  BP_CHECK_CONTAINS(text.out, "op fallbacks");
  BP_CHECK_CONTAINS(text.out, "for partial:0 ran on cpu:0");
  BP_CHECK_CONTAINS(text.out, "collectives over shared_memory: ");
  BP_CHECK_CONTAINS(text.out, " ms waiting for peers, ");
  const Result js = cli(tmp, {"trace", "summary", "--json", trace.string()});
  REQUIRE(js.code == kExitOk);
  const nlohmann::json s = nlohmann::json::parse(js.out);
  REQUIRE(s["ranks"].size() == 2);
  CHECK(s["ranks"][0]["steps"].get<int>() == steps[0]);
  CHECK(s["ranks"][0]["fallback_calls"].get<int>() == fallbacks[0]);

  // A trace that cannot be written is refused before any rank starts.
  const Result nowhere = cli(tmp, {"train", "--nproc", "2", "--epochs", "1", "--config", config.string(),
                                   "--data", kDigits, "--trace", (tmp / "no" / "such" / "t.json").string()});
  CHECK(nowhere.code == kExitFailed);
  BP_CHECK_CONTAINS(nowhere.err, "--trace: cannot write");
  CHECK(nowhere.out.find("epoch") == std::string::npos);

  // Not a trace: a usage error that says what to give.
  const Result bad = cli(tmp, {"trace", "summary", config.string()});
  CHECK(bad.code == kExitUsage);
  BP_CHECK_CONTAINS(bad.err, "not a trace");
}

TEST_CASE("train: without --trace nothing is recorded and no file appears") {
  TempDir tmp;
  const fs::path empty = tmp / "cwd";
  fs::create_directories(empty);
  bpcli::Options o;
  o.cwd = empty;
  const Result r = cli(tmp, {"train", "--nproc", "1", "--epochs", "1", "--data", kDigits}, o);
  INFO(r.describe());
  REQUIRE(r.code == kExitOk);
  CHECK(fs::is_empty(empty));
}
