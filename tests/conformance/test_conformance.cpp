// The conformance suite on the cpu plugin (every op, every dtype: no
// failures, nothing unsupported), on the opaque fixture (non-host-visible;
// add/mul/copy on f32 pass, the rest is reported unsupported), and on the
// skewed fixture (a wrong add must be reported as failing), plus the
// comparison rules themselves; and op placement: the normal mode ignores a
// backend's op_fallback, placement mode (Options::placement) runs every case
// through it on partial backends (restricted cpu, opaque) and must pass.
#include <backplane/conformance.hpp>

#include <backplane/backplane.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#ifndef BP_TEST_FIXTURE_DIR
#error "BP_TEST_FIXTURE_DIR must name the directory of the fixture plugins"
#endif
#ifndef BP_TEST_PLUGIN_DIR
#error "BP_TEST_PLUGIN_DIR must name the directory of the real plugins"
#endif

namespace bp = backplane;
namespace bc = backplane::conformance;
using Outcome = bc::CaseResult::Outcome;

namespace {

bp::Registry load(const char* name, const char* library, const char* dir) {
  const std::string json = std::string(R"({"schema_version": 1, "backends": [{"name": ")") + name +
                           R"(", "library": ")" + library + R"(", "required": true}]})";
  return bp::Registry::from_json(json, dir, "test_conformance");
}

const bp::Registry& cpu_registry() {
  static const bp::Registry r = load("cpu", "backplane_cpu", BP_TEST_PLUGIN_DIR);
  return r;
}
const bp::Registry& fixture_registry(const char* name) {
  static const bp::Registry opaque = load("opaque", "opaque", BP_TEST_FIXTURE_DIR);
  static const bp::Registry skewed = load("skewed", "skewed", BP_TEST_FIXTURE_DIR);
  return std::string(name) == "opaque" ? opaque : skewed;
}

bp::Device cpu() { return cpu_registry().backend("cpu").device(0); }
bp::Device opaque() { return fixture_registry("opaque").backend("opaque").device(0); }
bp::Device skewed() { return fixture_registry("skewed").backend("skewed").device(0); }

std::vector<bc::CaseResult> run(const bp::Device& device, const std::string& op,
                                const bp::Device& peer = {}) {
  bc::Options options;
  options.op = op;
  options.peer = peer;
  return bc::run_conformance(device, options);
}

int count(const std::vector<bc::CaseResult>& results, Outcome outcome) {
  return static_cast<int>(std::count_if(results.begin(), results.end(),
                                        [&](const bc::CaseResult& r) { return r.outcome == outcome; }));
}

std::string listing(const std::vector<bc::CaseResult>& results, Outcome outcome, std::size_t limit = 20) {
  std::string out;
  std::size_t shown = 0;
  for (const bc::CaseResult& r : results) {
    if (r.outcome != outcome) continue;
    if (shown++ == limit) {
      out += "  ...\n";
      break;
    }
    out += "  " + r.op + " " + r.dtype + " [" + r.case_name + "]: " + r.detail + "\n";
  }
  return out;
}

// Every case of `op` on cpu: none fails, none is unsupported (the cpu plugin
// implements the whole op set), and some pass. Skipped: the large cases, and
// the `to` cases in a dtype the peer (opaque: f32 only) cannot hold.
void expect_cpu_conforms(const std::string& op) {
  const std::vector<bc::CaseResult> results = run(cpu(), op, opaque());
  CHECK_MESSAGE(count(results, Outcome::fail) == 0, "failures of " << op << " on cpu:\n"
                                                                   << listing(results, Outcome::fail));
  CHECK_MESSAGE(count(results, Outcome::unsupported) == 0, "unsupported on cpu:\n"
                                                               << listing(results, Outcome::unsupported));
  CHECK(count(results, Outcome::pass) > 0);
  for (const bc::CaseResult& r : results) {
    if (r.outcome != Outcome::skipped) continue;
    const bool large = r.case_name.rfind("large ", 0) == 0;
    const bool peer_dtype =
        r.op == "to" && r.dtype != "f32" &&
        r.detail.find("the peer device opaque:0 cannot hold " + r.dtype) != std::string::npos;
    CHECK_MESSAGE((large || peer_dtype), r.case_name << ": " << r.detail);
  }
}

void check_family(const std::vector<std::string>& ops) {
  for (const std::string& op : ops) {
    SUBCASE(op.c_str()) { expect_cpu_conforms(op); }
  }
}

}  // namespace

// ---- cpu: one test per op family, one subcase per op -----------------------------

namespace {
// The family tests below take their ops from here, so the coverage test can
// prove that no op of the suite is left out of them.
const std::vector<std::string> kCreation = {"zeros", "ones", "full", "arange", "rand_uniform", "randn"};
const std::vector<std::string> kBinary = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "axpby"};
const std::vector<std::string> kCompare = {"eq", "ne", "lt", "le", "gt", "ge", "where"};
const std::vector<std::string> kUnary = {"neg",     "abs",  "exp", "log", "sqrt", "tanh",
                                         "sigmoid", "relu", "sin", "cos", "erf",  "clamp"};
const std::vector<std::string> kReduce = {"sum", "mean", "max", "min", "argmax", "argmin"};
const std::vector<std::string> kLinalg = {"matmul", "softmax", "log_softmax"};
const std::vector<std::string> kShape = {"reshape", "permute",      "transpose", "slice",
                                         "cat",     "index_select", "gather"};
const std::vector<std::string> kPlacement = {"cast", "contiguous", "to"};
const std::vector<const std::vector<std::string>*> kFamilies = {&kCreation, &kBinary, &kCompare, &kUnary,
                                                                &kReduce,   &kLinalg, &kShape,   &kPlacement};
}  // namespace

TEST_CASE("cpu: creation (zeros ones full arange rand_uniform randn)") { check_family(kCreation); }
TEST_CASE("cpu: binary arithmetic (add sub mul div pow maximum minimum axpby)") { check_family(kBinary); }
TEST_CASE("cpu: comparisons and where (eq ne lt le gt ge where)") { check_family(kCompare); }
TEST_CASE("cpu: unary (neg abs exp log sqrt tanh sigmoid relu sin cos erf clamp)") { check_family(kUnary); }
TEST_CASE("cpu: reductions (sum mean max min argmax argmin)") { check_family(kReduce); }
TEST_CASE("cpu: matmul, softmax, log_softmax") { check_family(kLinalg); }
TEST_CASE("cpu: shape ops (reshape permute transpose slice cat index_select gather)") {
  check_family(kShape);
}
TEST_CASE("cpu: cast, contiguous, to") { check_family(kPlacement); }

TEST_CASE("cpu: every op of the suite is covered by one of the family tests above") {
  for (const std::string& op : bc::op_names()) {
    const bool covered = std::any_of(
        kFamilies.begin(), kFamilies.end(),
        [&](const std::vector<std::string>* f) { return std::find(f->begin(), f->end(), op) != f->end(); });
    CHECK_MESSAGE(covered, op);
  }
}

TEST_CASE("cpu: every op of abi.h's BP_OP_TABLE has conformance cases") {
  std::set<std::string> covered;
  for (const bc::CaseResult& r : bc::run_conformance(cpu(), bc::Options{})) covered.insert(r.plugin_op);
  for (int32_t op = 1; op < BP_OP_COUNT_; ++op) {
    const std::string name = bp_op_name(op);
    CHECK_MESSAGE(covered.count(name) == 1,
                  "op " << name
                        << " of BP_OP_TABLE (include/backplane/abi.h) has no "
                           "conformance case: add its reference (conformance/src/"
                           "reference.cpp) and its cases (conformance/src/cases_*.cpp)");
  }
}

TEST_CASE("cpu: large cases are skipped with a reason unless asked") {
  const std::vector<bc::CaseResult> results = run(cpu(), "sum");
  const auto large = std::find_if(results.begin(), results.end(), [](const bc::CaseResult& r) {
    return r.case_name.rfind("large ", 0) == 0;
  });
  REQUIRE(large != results.end());
  CHECK(large->outcome == Outcome::skipped);
  CHECK(large->detail.find("--large") != std::string::npos);
  CHECK(large->detail.find("GiB") != std::string::npos);
}

// ---- opaque: a non-host-visible backend that supports only add/mul/copy on f32 ----

TEST_CASE("opaque: the whole suite runs: add/mul/copy on f32 pass, the rest is unsupported, nothing fails") {
  // f64 cases are unsupported through the missing dtype flag, before any op is asked.
  const std::vector<bc::CaseResult> results = bc::run_conformance(opaque(), bc::Options{});
  CHECK_MESSAGE(count(results, Outcome::fail) == 0, "failures on opaque:\n"
                                                        << listing(results, Outcome::fail));

  auto outcomes = [&](const std::string& op, const std::string& dtype) {
    std::vector<Outcome> out;
    for (const bc::CaseResult& r : results)
      if (r.op == op && r.dtype == dtype && r.case_name.rfind("large ", 0) != 0) out.push_back(r.outcome);
    return out;
  };
  auto all_are = [](const std::vector<Outcome>& v, Outcome o) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [&](Outcome x) { return x == o; });
  };
  // opaque holds f32 only (no 'f64' flag): a case that needs an f64 operand
  // (the mixed-dtype error case) is unsupported, naming the flag; every other passes.
  auto pass_unless_f64 = [&](const std::string& op) {
    int passed = 0;
    for (const bc::CaseResult& r : results) {
      if (r.op != op || r.dtype != "f32" || r.case_name.rfind("large ", 0) == 0) continue;
      if (r.outcome == Outcome::pass) {
        ++passed;
        continue;
      }
      CHECK_MESSAGE(r.outcome == Outcome::unsupported, op << " " << r.case_name << ": " << r.detail);
      CHECK_MESSAGE(r.detail.find("lacks the capability 'f64'") != std::string::npos, r.detail);
    }
    return passed;
  };
  CHECK(pass_unless_f64("add") >= 15);
  CHECK(pass_unless_f64("mul") >= 15);
  CHECK(all_are(outcomes("contiguous", "f32"), Outcome::pass));
  CHECK(all_are(outcomes("transpose", "f32"), Outcome::pass));
  CHECK(all_are(outcomes("add", "i32"), Outcome::unsupported));
  CHECK(all_are(outcomes("sub", "f32"), Outcome::unsupported));
  CHECK(all_are(outcomes("exp", "f64"), Outcome::unsupported));
  CHECK(all_are(outcomes("matmul", "f32"), Outcome::unsupported));
  CHECK(all_are(outcomes("zeros", "f32"), Outcome::unsupported));
  for (const bc::CaseResult& r : results) {
    if (r.outcome != Outcome::unsupported) continue;
    CHECK_MESSAGE(!r.detail.empty(), r.op << " " << r.dtype << " " << r.case_name);
  }
  const bc::CaseResult& sub = *std::find_if(results.begin(), results.end(), [](const bc::CaseResult& r) {
    return r.op == "sub" && r.dtype == "f32";
  });
  CHECK(sub.detail.find("opaque:0") != std::string::npos);
  CHECK(sub.detail.find("sub") != std::string::npos);
}

TEST_CASE("opaque: copies to the cpu backend and back through `to`") {
  const std::vector<bc::CaseResult> results = run(opaque(), "to", cpu());
  int peer_cases = 0;
  for (const bc::CaseResult& r : results) {
    if (r.dtype != "f32" || r.case_name.find("peer") == std::string::npos) continue;
    ++peer_cases;
    CHECK_MESSAGE(r.outcome == Outcome::pass, r.case_name << ": " << r.detail);
  }
  CHECK(peer_cases == 2);
}

// ---- op placement: the normal mode ignores op_fallback, placement mode proves it ---------

namespace {

// A registry of the real cpu plugin ("cpu", every op and dtype) and a partial
// backend under test named "partial": `partial_entry` gives its library and
// options; `fallback` its op_fallback ("" for none).
bp::Registry placement_registry(const std::string& partial_entry, const std::string& fallback) {
  std::string json = std::string(R"({"schema_version": 1, "plugin_dirs": [")") + BP_TEST_FIXTURE_DIR +
                     R"(", ")" + BP_TEST_PLUGIN_DIR + R"("], "backends": [)" +
                     R"({"name": "cpu", "library": "backplane_cpu", "required": true}, )" +
                     R"({"name": "partial", "required": true, )" + partial_entry;
  if (!fallback.empty()) json += R"(, "op_fallback": ")" + fallback + "\"";
  json += "}]}";
  return bp::Registry::from_json(json, BP_TEST_FIXTURE_DIR, "test_conformance placement");
}

// The cpu plugin narrowed to fill, copy and matmul on f32: a partial backend
// with real kernels (docs/cpu.md, options "ops" and "dtypes").
constexpr const char* kRestrictedCpu =
    R"("library": "backplane_cpu", "options": {"ops": ["fill", "copy", "matmul"], "dtypes": ["f32"]})";
// The opaque fixture: not host_visible, add/mul/copy on f32 only.
constexpr const char* kOpaque = R"("library": "opaque")";

bp::Device partial(const bp::Registry& r) { return r.backend("partial").device(0); }

bc::Options placement_options(const bp::Device& peer = {}) {
  bc::Options options;
  options.placement = true;
  options.peer = peer;
  return options;
}

// Placement mode on `device`: every case passes (a large case is skipped),
// nothing is unsupported, and the fallback did run what the device lacks.
void expect_placement_passes(const bp::Device& device, const bp::Device& peer) {
  const bp::Backend backend = device.backend();
  backend.reset_op_fallback_stats();
  const std::vector<bc::CaseResult> results = bc::run_conformance(device, placement_options(peer));
  CHECK_MESSAGE(count(results, Outcome::fail) == 0, "failures through placement on "
                                                        << device.id() << ":\n"
                                                        << listing(results, Outcome::fail));
  CHECK_MESSAGE(count(results, Outcome::unsupported) == 0, "unsupported through placement:\n"
                                                               << listing(results, Outcome::unsupported));
  for (const bc::CaseResult& r : results) {
    if (r.outcome != Outcome::skipped) continue;
    CHECK_MESSAGE(r.case_name.rfind("large ", 0) == 0,
                  r.op << " " << r.dtype << " " << r.case_name << ": " << r.detail);
  }
  // Every op of the suite, on every dtype the suite covers, ran and passed.
  std::vector<std::string> ops, dtypes;
  for (const bc::CaseResult& r : results) {
    if (r.outcome != Outcome::pass) continue;
    if (std::find(ops.begin(), ops.end(), r.op) == ops.end()) ops.push_back(r.op);
    if (std::find(dtypes.begin(), dtypes.end(), r.dtype) == dtypes.end()) dtypes.push_back(r.dtype);
  }
  CHECK(ops.size() == bc::op_names().size());
  for (const char* dtype : {"f32", "f64", "i32", "i64", "bool"})
    CHECK_MESSAGE(std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end(),
                  "no case passed on " << dtype);
  // The fallback did the work the device cannot.
  const std::vector<bp::OpFallbackStats> stats = backend.op_fallback_stats();
  CHECK(!stats.empty());
  auto placed = [&](bp::Op op, bp::DType dtype) {
    return std::any_of(stats.begin(), stats.end(), [&](const bp::OpFallbackStats& s) {
      return s.op == op && s.dtype == dtype && s.calls > 0;
    });
  };
  CHECK(placed(bp::Op::sub, bp::DType::f32));
  CHECK(placed(bp::Op::exp, bp::DType::f64));
  CHECK(placed(bp::Op::sum, bp::DType::i32));
}

}  // namespace

TEST_CASE(
    "placement: restricted cpu (fill, copy, matmul on f32) with op_fallback host:cpu passes every case") {
  const bp::Registry r = placement_registry(kRestrictedCpu, "host:cpu");
  expect_placement_passes(partial(r), r.backend("cpu").device(0));
}

TEST_CASE("placement: the non-host_visible opaque fixture with op_fallback host:cpu passes every case") {
  const bp::Registry r = placement_registry(kOpaque, "host:cpu");
  REQUIRE_FALSE(partial(r).capabilities().has(bp::Capability::host_visible));
  expect_placement_passes(partial(r), r.backend("cpu").device(0));
}

TEST_CASE("placement: the normal mode reports the same with an op_fallback as without one") {
  const bp::Registry with = placement_registry(kRestrictedCpu, "host:cpu");
  const bp::Registry without = placement_registry(kRestrictedCpu, "");
  REQUIRE(partial(with).backend().op_fallback().kind == bp::OpFallback::Kind::host);
  // A placement run first leaves nothing behind that the normal mode would see.
  (void)bc::run_conformance(partial(with), placement_options());
  partial(with).backend().reset_op_fallback_stats();
  const std::vector<bc::CaseResult> a = bc::run_conformance(partial(with), bc::Options{});
  const std::vector<bc::CaseResult> b = bc::run_conformance(partial(without), bc::Options{});
  // Nothing ran on the fallback: the normal mode holds an OpFallbackOff.
  CHECK(partial(with).backend().op_fallback_stats().empty());

  // The same cases, outcomes and details, so the same tallies.
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    INFO(a[k].op << " " << a[k].dtype << " [" << a[k].case_name << "]");
    CHECK(a[k].case_name == b[k].case_name);
    CHECK(a[k].outcome == b[k].outcome);
    CHECK(a[k].detail == b[k].detail);
  }
  const std::vector<bc::Tally> ta = bc::tally(a), tb = bc::tally(b);
  REQUIRE(ta.size() == tb.size());
  for (std::size_t k = 0; k < ta.size(); ++k) {
    INFO(ta[k].op << " " << ta[k].dtype);
    CHECK(ta[k].op == tb[k].op);
    CHECK(ta[k].dtype == tb[k].dtype);
    CHECK(ta[k].passed == tb[k].passed);
    CHECK(ta[k].failed == tb[k].failed);
    CHECK(ta[k].skipped == tb[k].skipped);
    CHECK(ta[k].unsupported == tb[k].unsupported);
  }

  // What the device claims passes; every other op and dtype is unsupported, not a failure.
  CHECK_MESSAGE(count(a, Outcome::fail) == 0, listing(a, Outcome::fail));
  CHECK(count(a, Outcome::pass) > 0);
  for (const bc::CaseResult& r : a) {
    // A cast f32 -> f32 is a copy, which the device claims.
    const bool identity_cast = r.op == "cast" && r.case_name.rfind("f32 -> f32", 0) == 0;
    const bool claimed =
        r.plugin_op == "fill" || r.plugin_op == "copy" || r.plugin_op == "matmul" || identity_cast;
    if (r.dtype != "f32" || !(claimed || r.plugin_op.empty())) {
      CHECK_MESSAGE(r.outcome == Outcome::unsupported, r.op << " " << r.dtype << " [" << r.case_name
                                                            << "]: " << std::string(bc::to_string(r.outcome))
                                                            << ": " << r.detail);
    }
  }
  for (const auto& [op, dtype] : std::vector<std::pair<std::string, std::string>>{
           {"add", "f32"}, {"exp", "f32"}, {"zeros", "f64"}, {"sum", "i32"}, {"matmul", "f64"}}) {
    const auto row = std::find_if(ta.begin(), ta.end(),
                                  [&](const bc::Tally& t) { return t.op == op && t.dtype == dtype; });
    REQUIRE_MESSAGE(row != ta.end(), op << " " << dtype);
    CHECK_MESSAGE(row->passed == 0, op << " " << dtype);
    CHECK_MESSAGE(row->unsupported > 0, op << " " << dtype);
  }
}

TEST_CASE("placement: the mode needs an op_fallback and throws invalid_argument without one") {
  const bp::Registry without = placement_registry(kRestrictedCpu, "");
  for (const bp::Device& device : {partial(without), cpu()}) {
    try {
      (void)bc::run_conformance(device, placement_options());
      FAIL("expected an error for " << device.id());
    } catch (const bp::Error& e) {
      CHECK(e.code() == bp::Errc::invalid_argument);
      CHECK(std::string(e.what()).find("op_fallback") != std::string::npos);
      CHECK(std::string(e.what()).find(device.backend().name()) != std::string::npos);
    }
  }
}

TEST_CASE("placement: a case refused although the device has an op_fallback is a failure, not unsupported") {
  // The fallback is itself partial (fill and copy on f32): add runs nowhere.
  const std::string json =
      std::string(R"({"schema_version": 1, "plugin_dirs": [")") + BP_TEST_PLUGIN_DIR +
      R"("], "backends": [)"
      R"({"name": "host", "library": "backplane_cpu", "required": true,)"
      R"( "options": {"ops": ["fill", "copy"], "dtypes": ["f32"]}},)"
      R"({"name": "partial", "library": "backplane_cpu", "required": true,)"
      R"( "options": {"ops": ["fill", "copy"], "dtypes": ["f32"]}, "op_fallback": "host:host"}]})";
  const bp::Registry r = bp::Registry::from_json(json, BP_TEST_PLUGIN_DIR, "test_conformance placement");
  bc::Options options = placement_options();
  options.op = "add";
  const std::vector<bc::CaseResult> results = bc::run_conformance(partial(r), options);
  CHECK(count(results, Outcome::unsupported) == 0);
  CHECK(count(results, Outcome::fail) > 0);
  const auto f32 = std::find_if(results.begin(), results.end(), [](const bc::CaseResult& c) {
    return c.dtype == "f32" && c.outcome == Outcome::fail && c.case_name.rfind("error:", 0) != 0;
  });
  REQUIRE(f32 != results.end());
  CHECK(f32->detail.find("placement:") != std::string::npos);
  CHECK(f32->detail.find("host:host") != std::string::npos);
}

// ---- the suite can fail ---------------------------------------------------------------

TEST_CASE("skewed: a plugin whose add is 0.1% off fails every add case that has elements") {
  const std::vector<bc::CaseResult> results = run(skewed(), "add");
  const int failed = count(results, Outcome::fail);
  CHECK(failed >= 15);
  for (const bc::CaseResult& r : results) {
    if (r.dtype != "f32") continue;
    const bool has_elements = r.case_name.find("empty") == std::string::npos &&
                              r.case_name.find("error:") == std::string::npos &&
                              r.case_name.rfind("large ", 0) != 0;
    if (has_elements) {
      CHECK_MESSAGE(r.outcome == Outcome::fail, r.case_name);
    }
  }
  const auto first = std::find_if(results.begin(), results.end(),
                                  [](const bc::CaseResult& r) { return r.outcome == Outcome::fail; });
  REQUIRE(first != results.end());
  CHECK(first->detail.find("got ") != std::string::npos);
  CHECK(first->detail.find("want ") != std::string::npos);
  CHECK(first->detail.find("rel 1e-06") != std::string::npos);

  // Its mul is right: the failures are the wrong op's only.
  const std::vector<bc::CaseResult> mul = run(skewed(), "mul");
  CHECK_MESSAGE(count(mul, Outcome::fail) == 0, listing(mul, Outcome::fail));

  const std::vector<bc::Tally> rows = bc::tally(results);
  const auto f32 =
      std::find_if(rows.begin(), rows.end(), [](const bc::Tally& t) { return t.dtype == "f32"; });
  REQUIRE(f32 != rows.end());
  CHECK(f32->failed == failed);
  CHECK(!f32->first_failure.empty());
}

TEST_CASE("compare: a perturbed vector fails, and the NaN, Inf and tolerance rules hold") {
  const bc::Tolerance f32 = bc::tolerance_for("add", bp::DType::f32);
  CHECK_FALSE(f32.exact);
  CHECK(f32.rel == doctest::Approx(1e-6));
  const std::vector<double> want = {1.0, -2.0, 3.0, 1e6};

  CHECK_FALSE(bc::compare_values(want, want, f32).has_value());
  CHECK_FALSE(
      bc::compare_values({1.0, -2.0, 3.0 * (1 + 5e-7), 1e6}, want, f32).has_value());  // inside rel 1e-6

  const auto bad = bc::compare_values({1.0, -2.0, 3.0001, 1e6}, want, f32);
  REQUIRE(bad.has_value());
  CHECK(bad->find("element 2") != std::string::npos);
  CHECK(bad->find("1 of 4") != std::string::npos);

  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  CHECK_FALSE(bc::compare_values({nan, inf, -inf}, {nan, inf, -inf}, f32).has_value());
  CHECK(bc::compare_values({1.0}, {nan}, f32).has_value());       // NaN expected, number given
  CHECK(bc::compare_values({nan}, {1.0}, f32).has_value());       // NaN given
  CHECK(bc::compare_values({-inf}, {inf}, f32).has_value());      // wrong infinity
  CHECK(bc::compare_values({1e308}, {inf}, f32).has_value());     // finite for infinite
  CHECK(bc::compare_values({1.0, 2.0}, {1.0}, f32).has_value());  // lengths differ

  const bc::Tolerance exact = bc::tolerance_for("eq", bp::DType::f32);
  CHECK(exact.exact);
  CHECK(bc::compare_values({1.0000001}, {1.0}, exact).has_value());
  CHECK(bc::tolerance_for("add", bp::DType::i32).exact);
  CHECK(bc::tolerance_for("sum", bp::DType::i64).exact);

  // A per-element scale (a reduction's sum of |x|) widens the allowed error.
  const bc::Tolerance sum = bc::tolerance_for("sum", bp::DType::f32);
  const std::vector<double> scale = {1000.0};
  CHECK(bc::compare_values({0.001}, {0.0}, sum).has_value());
  CHECK_FALSE(bc::compare_values({0.001}, {0.0}, sum, &scale).has_value());
}

TEST_CASE("runner: unknown op names are rejected, listing the known ones") {
  bc::Options options;
  options.op = "addd";
  try {
    (void)bc::run_conformance(cpu(), options);
    FAIL("expected an error");
  } catch (const bp::Error& e) {
    CHECK(e.code() == bp::Errc::invalid_argument);
    CHECK(std::string(e.what()).find("log_softmax") != std::string::npos);
  }
}

TEST_CASE("runner: on_result sees every case in order, and verbose passes carry their error") {
  bc::Options options;
  options.op = "exp";
  options.verbose = true;
  std::vector<std::string> seen;
  options.on_result = [&](const bc::CaseResult& r) { seen.push_back(r.case_name); };
  const std::vector<bc::CaseResult> results = bc::run_conformance(cpu(), options);
  REQUIRE(seen.size() == results.size());
  for (std::size_t k = 0; k < seen.size(); ++k) CHECK(seen[k] == results[k].case_name);
  const auto pass = std::find_if(results.begin(), results.end(), [](const bc::CaseResult& r) {
    return r.outcome == Outcome::pass && r.case_name == "long [300, 257]";
  });
  REQUIRE(pass != results.end());
  CHECK(pass->detail.find("largest error") != std::string::npos);
}
