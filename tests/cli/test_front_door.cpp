// What a new user meets first in the CLI: the built tool finds its default
// config and data from any folder, hints that fit where the user is, "did you
// mean" for backend and library names, a warning for an invalid log level, the
// conformance summary grouped by op family, and the loss plot.
#include "cli_runner.hpp"
#include "test_support.hpp"

#include <regex>

using namespace bptest;
using bpcli::Result;

namespace {

Result cli(const TempDir& tmp, const std::vector<std::string>& args, const bpcli::Options& options = {}) {
  Result r = bpcli::run(args, tmp.path(), options);
  REQUIRE_MESSAGE(r.exited, r.describe());
  return r;
}

// The x (or cx) attribute that follows `prefix` in `svg`, as a number.
double attribute_after(const std::string& svg, const std::string& pattern) {
  std::smatch m;
  const std::regex re(pattern);
  REQUIRE_MESSAGE(std::regex_search(svg, m, re), "no match for " << pattern);
  return std::stod(m[1].str());
}

}  // namespace

// ---- the default config and data, relative to the executable --------------------

TEST_CASE("front door: the built tool finds its default config and data from any folder") {
  TempDir tmp;  // an empty folder: no backends.json, no data/
  const Result check = cli(tmp, {"check"}, {{}, tmp.path()});
  INFO(check.describe());
  CHECK(check.code == 0);
  BP_CHECK_CONTAINS(check.out, "/share/backplane/backends.json");
  BP_CHECK_CONTAINS(check.out, "ok      cpu");

  const Result train = cli(tmp, {"train", "--nproc", "1", "--epochs", "1"}, {{}, tmp.path()});
  INFO(train.describe());
  CHECK(train.code == 0);
  BP_CHECK_CONTAINS(train.out, "/share/backplane/digits.csv.gz");
  BP_CHECK_CONTAINS(train.out, "test accuracy 0.");
}

TEST_CASE("front door: train --nproc 1 runs in-process without the job secret warning") {
  TempDir tmp;
  const Result train = cli(tmp, {"train", "--nproc", "1", "--epochs", "1"});
  INFO(train.describe());
  CHECK(train.code == 0);
  BP_CHECK_CONTAINS(train.out, "1 rank on ");
  // No other process can join a world of one: it has no job secret to ask for.
  CHECK(train.err.find("job secret") == std::string::npos);
  CHECK(train.out.find("job secret") == std::string::npos);
  CHECK(train.err.find("BACKPLANE_JOB_TOKEN") == std::string::npos);
}

TEST_CASE("front door: a backends.json in the current folder is still never read implicitly") {
  TempDir tmp;
  tmp.write("backends.json", config_json({backend_json("planted", "good_c", true)}));
  const Result r = cli(tmp, {"list"}, {{}, tmp.path()});
  INFO(r.describe());
  CHECK(r.code == 0);
  CHECK(r.out.find("planted") == std::string::npos);
  CHECK(r.out.find((tmp / "backends.json").string()) == std::string::npos);
}

// ---- hints that fit where the user is ------------------------------------------------

TEST_CASE("front door: a library not found suggests the closest plugin and this build's plugin folder") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", "{\"schema_version\": 1, \"plugin_dirs\": [" +
                                                         json_path(plugin_dir()) + "], \"backends\": [" +
                                                         backend_json("cpu", "backplane_cpuu", true) + "]}");
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == 1);
  BP_CHECK_CONTAINS(r.out, "(did you mean \"backplane_cpu\"?)");
  BP_CHECK_CONTAINS(r.out, plugin_dir().string());
  BP_CHECK_CONTAINS(r.out, "cmake --build ");
}

TEST_CASE("front door: outside a build tree the hint names the config's plugin folder, not build/plugins") {
  TempDir tmp;
  const fs::path plugins = tmp.mkdir("lib_backplane");
  fs::create_symlink(plugin_dir() / "libbackplane_cpu.so", plugins / "libbackplane_cpu.so");
  const fs::path config = tmp.write("backends.json",
                                    "{\"schema_version\": 1, \"plugin_dirs\": [\"lib_backplane\"], "
                                    "\"backends\": [" +
                                        backend_json("x", "xyz_plugin", true) + "]}");
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == 1);
  BP_CHECK_CONTAINS(r.out, "install the plugin into " + plugins.string());
  CHECK(r.out.find("build/plugins") == std::string::npos);
  CHECK(r.out.find("did you mean") == std::string::npos);  // nothing close to xyz_plugin
}

// ---- did you mean ----------------------------------------------------------------------

TEST_CASE("front door: an unknown --backend suggests the closest configured name") {
  TempDir tmp;
  const fs::path config =
      tmp.write("backends.json", config_json({backend_json("cpu", "backplane_cpu", true)}));
  const Result train = cli(tmp, {"train", "--nproc", "1", "--config", config.string(), "--backend", "cpuu"});
  INFO(train.describe());
  CHECK(train.code == 1);
  BP_CHECK_CONTAINS(train.err, "no backend named \"cpuu\"");
  BP_CHECK_CONTAINS(train.err, "(did you mean \"cpu\"?)");
  const Result conf = cli(tmp, {"conformance", "--config", config.string(), "--backend", "cpuu"});
  INFO(conf.describe());
  CHECK(conf.code == 2);
  BP_CHECK_CONTAINS(conf.err, "(did you mean \"cpu\"?)");
}

TEST_CASE("front door: a default_backend naming no backend exits 2 suggesting the closest name") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", config_json({backend_json("cpu", "backplane_cpu", true)},
                                                                 R"("default_backend": "cpuu")"));
  const Result r = cli(tmp, {"check", "--config", config.string()});
  INFO(r.describe());
  CHECK(r.code == 2);
  BP_CHECK_CONTAINS(r.err, "default_backend");
  BP_CHECK_CONTAINS(r.err, "(did you mean \"cpu\"?)");
}

// ---- log level -----------------------------------------------------------------------------

TEST_CASE("front door: an invalid BACKPLANE_LOG_LEVEL is warned of, naming the value and the valid ones") {
  TempDir tmp;
  const Result bad = cli(tmp, {"--version"}, {{{"BACKPLANE_LOG_LEVEL", "verbose"}}, {}});
  INFO(bad.describe());
  CHECK(bad.code == 0);
  BP_CHECK_CONTAINS(bad.err, "BACKPLANE_LOG_LEVEL=\"verbose\" is not a log level");
  BP_CHECK_CONTAINS(bad.err, "debug, info, warning, error");
  const Result good = cli(tmp, {"--version"}, {{{"BACKPLANE_LOG_LEVEL", "warning"}}, {}});
  CHECK_MESSAGE(good.err.empty(), good.describe());
}

// ---- conformance summary ---------------------------------------------------------------------

TEST_CASE("front door: conformance groups unsupported ops per family by their plugin-op names") {
  TempDir tmp;
  const fs::path config = tmp.write("backends.json", config_json({backend_json("opaque", "opaque", true)}));
  const Result r = cli(tmp, {"conformance", "--config", config.string(), "--backend", "opaque"});
  INFO(r.describe());
  CHECK(r.code == 0);
  // The table keeps only rows that ran a case; the rest is one line per family.
  BP_CHECK_CONTAINS(r.out, "unsupported: reduce: ");
  BP_CHECK_CONTAINS(r.out, "unsupported: unary: ");
  CHECK(std::regex_search(r.out,
                          std::regex("unsupported: copy: copy on [a-z0-9, ]+ \\(for [a-z_, ]*\\bto\\b")));
  CHECK(r.out.find("\nsum ") == std::string::npos);  // no wholly unsupported row
  std::size_t rows = 0, unsupported_lines = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("unsupported: ", 0) == 0)
      ++unsupported_lines;
    else if (line.rfind("add ", 0) == 0 || line.rfind("mul ", 0) == 0 || line.rfind("to (copy) ", 0) == 0)
      ++rows;
  }
  CHECK(rows >= 2);
  CHECK(unsupported_lines >= 5);
  CHECK(unsupported_lines <= 11);
  BP_CHECK_CONTAINS(r.out, "to (copy) ");
}

// ---- the loss plot -------------------------------------------------------------------------------

TEST_CASE(
    "front door: the loss plot is log-scale by default, titled with the world size, means at mid-epoch") {
  TempDir tmp;
  const fs::path svg = tmp / "loss.svg";
  const Result r = cli(tmp, {"train", "--nproc", "1", "--epochs", "2", "--plot", svg.string()});
  INFO(r.describe());
  REQUIRE(r.code == 0);
  const std::string text = bpcli::slurp(svg);
  BP_CHECK_CONTAINS(text, "data-y-scale=\"log\"");
  BP_CHECK_CONTAINS(text, "cross-entropy loss (log scale)");
  BP_CHECK_CONTAINS(text, "world size 1");
  CHECK(text.find("rank(s)") == std::string::npos);
  // Epoch 1 spans x in (0, 1]: its mean sits at the grid line labelled 0.5.
  const double tick = attribute_after(text, "<line x1=\"([0-9.]+)\"[^>]*/><text[^>]*>0\\.5</text>");
  const double mean = attribute_after(text, "<circle cx=\"([0-9.]+)\"");
  CHECK(mean == doctest::Approx(tick));

  const fs::path linear = tmp / "linear.svg";
  const Result l = cli(
      tmp, {"train", "--nproc", "1", "--epochs", "1", "--plot", linear.string(), "--plot-scale", "linear"});
  REQUIRE_MESSAGE(l.code == 0, l.describe());
  const std::string lt = bpcli::slurp(linear);
  BP_CHECK_CONTAINS(lt, "data-y-scale=\"linear\"");
  CHECK(lt.find("(log scale)") == std::string::npos);
  const Result bad = cli(tmp, {"train", "--plot-scale", "cubic"});
  CHECK_MESSAGE(bad.code == 64, bad.describe());
}
