// The conformance runner: the tolerance table, the case list, and the loop
// that runs each case on a device and turns every outcome (a wrong value, an
// error, an unsupported op, a skipped large case) into a CaseResult.
//
// Tolerances. A device value g passes against the reference value w when
//   |g - w| <= abs + rel * scale      (scale = |w| unless noted)
// and, whatever the tolerance, NaN meets NaN and an infinity the same
// infinity. The reference runs in double (see reference.hpp) and is rounded
// once to the result dtype. This table is mirrored in docs/plugins.md
// ("Tolerances"); never loosen an entry to make a kernel pass.
//
//  family          ops                                   f32                 f64                 i32 i64 bool
//  exact           eq ne lt le gt ge where neg abs relu  exact               exact               exact
//                  clamp maximum minimum max min argmax
//                  argmin zeros ones full reshape permute
//                  transpose slice cat index_select
//                  gather cast contiguous to
//  arithmetic      add sub mul div arange axpby          rel 1e-6            rel 1e-12           exact, wraps
//                  axpby's scale: |alpha y| + |beta x|
//  pow             pow                                   rel 1e-5            rel 1e-9            exact, wraps
//  transcendental  exp log sqrt tanh sigmoid sin cos erf rel 2e-6 abs 1e-6   rel 1e-9 abs 1e-12  -
//  reduction       sum mean                              rel 1e-5 abs 1e-6   rel 1e-9 abs 1e-12  exact, wraps
//                  scale: sum of |x| over the reduced elements (mean: divided by n)
//  softmax         softmax log_softmax                   rel 1e-5 abs 1e-6   rel 1e-9 abs 1e-12  -
//  matmul          matmul                                rel 1e-6 * sqrt(K)  rel 1e-12 * sqrt(K) -
//                  scale: sum_k |a_ik * b_kj|            abs 1e-6            abs 1e-12
//  random          rand_uniform randn: the same seed gives identical values, another seed
//                  other values; every value in [low, high); over 100k samples the mean, the
//                  standard deviation and the histogram (uniform: 10 bins; normal: the shares
//                  within 1 sigma and beyond 3 sigma) each within 5 standard errors.
#include "suite.hpp"

#include <backplane/ops.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

namespace backplane::conformance {

namespace {

// The bp_op whose abi.h name is `op`; BP_OP_INVALID for the suite's names
// that are not plugin ops (zeros, reshape, cat, ...).
int32_t op_code(const std::string& op) {
  for (int32_t code = 1; code < BP_OP_COUNT_; ++code)
    if (op == bp_op_name(code)) return code;
  return BP_OP_INVALID;
}

// The dtype whose abi.h name is `name`; BP_DTYPE_COUNT_ (sorts last) when none is.
int32_t dtype_code(const std::string& name) {
  for (int32_t code = 1; code < BP_DTYPE_COUNT_; ++code)
    if (name == bp_dtype_name(code)) return code;
  return BP_DTYPE_COUNT_;
}

}  // namespace

namespace {

enum class Family { exact, arithmetic, pow, transcendental, reduction, softmax, matmul };

// The tolerance family of every bp_op, named one by one: the switch has no
// default, so an op added to abi.h's BP_OP_TABLE without a family here stops
// the build (-Wswitch names it).
Family family_of(bp_op op) {
  switch (op) {
    case BP_OP_ADD:
    case BP_OP_SUB:
    case BP_OP_MUL:
    case BP_OP_DIV:
    case BP_OP_ARANGE:
    case BP_OP_AXPBY:  // scale: |alpha y| + |beta x|
      return Family::arithmetic;
    case BP_OP_POW:
      return Family::pow;
    case BP_OP_EXP:
    case BP_OP_LOG:
    case BP_OP_SQRT:
    case BP_OP_TANH:
    case BP_OP_SIGMOID:
    case BP_OP_SIN:
    case BP_OP_COS:
    case BP_OP_ERF:
      return Family::transcendental;
    case BP_OP_SUM:
    case BP_OP_MEAN:
      return Family::reduction;
    case BP_OP_SOFTMAX:
    case BP_OP_LOG_SOFTMAX:
      return Family::softmax;
    case BP_OP_MATMUL:
      return Family::matmul;
    case BP_OP_COPY:
    case BP_OP_MAXIMUM:
    case BP_OP_MINIMUM:
    case BP_OP_EQ:
    case BP_OP_NE:
    case BP_OP_LT:
    case BP_OP_LE:
    case BP_OP_GT:
    case BP_OP_GE:
    case BP_OP_WHERE:
    case BP_OP_NEG:
    case BP_OP_ABS:
    case BP_OP_RELU:
    case BP_OP_CLAMP:
    case BP_OP_CAST:
    case BP_OP_FILL:
    case BP_OP_RAND_UNIFORM:  // checked by statistics, not by a tolerance
    case BP_OP_RANDN:
    case BP_OP_MAX:
    case BP_OP_MIN:
    case BP_OP_ARGMAX:
    case BP_OP_ARGMIN:
    case BP_OP_INDEX_SELECT:
    case BP_OP_GATHER:
    case BP_OP_INVALID:  // the suite's names that are not plugin ops (zeros, reshape, ...)
    case BP_OP_COUNT_:
      return Family::exact;
  }
  return Family::exact;
}

}  // namespace

Tolerance tolerance_for(const std::string& op, DType dtype) {
  const Family family = family_of(static_cast<bp_op>(op_code(op)));
  if (family == Family::exact || !is_float(dtype)) return Tolerance{};  // exact
  const bool f32 = dtype == DType::f32;
  switch (family) {
    case Family::arithmetic:
      return {f32 ? 1e-6 : 1e-12, 0.0, false};
    case Family::pow:
      return {f32 ? 1e-5 : 1e-9, 0.0, false};
    case Family::transcendental:
      return {f32 ? 2e-6 : 1e-9, f32 ? 1e-6 : 1e-12, false};
    case Family::reduction:
    case Family::softmax:
      return {f32 ? 1e-5 : 1e-9, f32 ? 1e-6 : 1e-12, false};
    case Family::matmul:
    case Family::exact:
      break;
  }
  return {f32 ? 1e-6 : 1e-12, f32 ? 1e-6 : 1e-12, false};  // matmul: the caller scales rel by sqrt(K)
}

const char* to_string(CaseResult::Outcome outcome) noexcept {
  switch (outcome) {
    case CaseResult::Outcome::pass:
      return "pass";
    case CaseResult::Outcome::fail:
      return "fail";
    case CaseResult::Outcome::skipped:
      return "skipped";
    case CaseResult::Outcome::unsupported:
      return "unsupported";
  }
  return "?";
}

std::vector<Tally> tally(const std::vector<CaseResult>& results) {
  std::vector<Tally> rows;
  std::map<std::pair<std::string, std::string>, std::size_t> where;
  for (const CaseResult& r : results) {
    const auto key = std::make_pair(r.op, r.dtype);
    auto it = where.find(key);
    if (it == where.end()) {
      it = where.emplace(key, rows.size()).first;
      Tally row;
      row.op = r.op;
      row.dtype = r.dtype;
      row.plugin_op = r.plugin_op;
      rows.push_back(std::move(row));
    }
    Tally& t = rows[it->second];
    switch (r.outcome) {
      case CaseResult::Outcome::pass:
        ++t.passed;
        break;
      case CaseResult::Outcome::fail:
        if (t.failed++ == 0) t.first_failure = r.case_name + ": " + r.detail;
        break;
      case CaseResult::Outcome::skipped:
        ++t.skipped;
        break;
      case CaseResult::Outcome::unsupported:
        ++t.unsupported;
        break;
    }
  }
  // Group by op in op_names() order, then dtype in enum order (the cases run
  // grouped by dtype in places).
  auto rank = [](const Tally& t) {
    const std::vector<std::string>& names = op_names();
    const auto op = std::find(names.begin(), names.end(), t.op) - names.begin();
    return std::make_pair(op, static_cast<std::ptrdiff_t>(dtype_code(t.dtype)));
  };
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const Tally& a, const Tally& b) { return rank(a) < rank(b); });
  return rows;
}

std::string op_kind_group(const std::string& plugin_op) {
  // The grouping follows the op's kind in abi.h's op table.
  switch (bp_op_info_of(op_code(plugin_op))->kind) {
    case BP_OP_KIND_BINARY:
      return "binary";
    case BP_OP_KIND_COMPARE:
    case BP_OP_KIND_SELECT:
      return "compare";
    case BP_OP_KIND_UNARY:
      return "unary";
    case BP_OP_KIND_CAST:
      return "cast";
    case BP_OP_KIND_CREATE:
    case BP_OP_KIND_RANGE:
      return "creation";
    case BP_OP_KIND_REDUCE:
    case BP_OP_KIND_ARG_REDUCE:
      return "reduce";
    case BP_OP_KIND_SOFTMAX:
      return "softmax";
    case BP_OP_KIND_MATMUL:
      return "matmul";
    case BP_OP_KIND_INDEX_SELECT:
    case BP_OP_KIND_GATHER:
      return "index";
    case BP_OP_KIND_COPY:
      return "copy";
    case BP_OP_KIND_UPDATE:
      return "update";
    default:
      return "other";
  }
}

std::vector<UnsupportedGroup> unsupported_by_group(const std::vector<CaseResult>& results) {
  // Per group (first-seen order), per plugin op (first-seen order): its
  // dtypes (abi.h order) and the suite ops that needed it.
  struct OpEntry {
    std::string name;
    std::set<int32_t> dtypes;
    std::vector<std::string> users;
  };
  struct GroupEntry {
    std::string group;
    std::vector<OpEntry> ops;
    int cases = 0;
  };
  // Only an (op, dtype) with no case that ran: a partly supported one keeps its table row.
  std::set<std::pair<std::string, std::string>> ran;
  for (const CaseResult& r : results)
    if (r.outcome != CaseResult::Outcome::unsupported) ran.emplace(r.op, r.dtype);
  std::vector<GroupEntry> groups;
  for (const CaseResult& r : results) {
    if (r.outcome != CaseResult::Outcome::unsupported || ran.count({r.op, r.dtype}) > 0) continue;
    const std::string name = r.plugin_op.empty() ? r.op : r.plugin_op;
    const std::string group = op_kind_group(r.plugin_op);
    auto f =
        std::find_if(groups.begin(), groups.end(), [&](const GroupEntry& e) { return e.group == group; });
    if (f == groups.end()) f = groups.insert(groups.end(), GroupEntry{group, {}, 0});
    ++f->cases;
    auto op = std::find_if(f->ops.begin(), f->ops.end(), [&](const OpEntry& e) { return e.name == name; });
    if (op == f->ops.end()) op = f->ops.insert(f->ops.end(), OpEntry{name, {}, {}});
    op->dtypes.insert(dtype_code(r.dtype));
    if (r.op != name && std::find(op->users.begin(), op->users.end(), r.op) == op->users.end())
      op->users.push_back(r.op);
  }
  std::vector<UnsupportedGroup> out;
  for (GroupEntry& f : groups) {
    // Ops with the same dtypes (and no other users) share one clause.
    std::vector<std::pair<std::string, std::string>> clauses;  // (ops, " on dtypes (for ...)")
    for (OpEntry& op : f.ops) {
      std::string tail = " on";
      bool first = true;
      for (int32_t d : op.dtypes) {
        tail += std::string(first ? " " : ", ") + (d < BP_DTYPE_COUNT_ ? bp_dtype_name(d) : "?");
        first = false;
      }
      if (!op.users.empty()) {
        std::sort(op.users.begin(), op.users.end());
        tail += " (for";
        for (std::size_t i = 0; i < op.users.size(); ++i) tail += (i == 0 ? " " : ", ") + op.users[i];
        tail += ")";
      }
      auto same =
          std::find_if(clauses.begin(), clauses.end(), [&](const auto& c) { return c.second == tail; });
      if (same != clauses.end())
        same->first += ", " + op.name;
      else
        clauses.emplace_back(op.name, tail);
    }
    UnsupportedGroup u{f.group, {}, f.cases};
    for (const auto& [ops, tail] : clauses) u.text += (u.text.empty() ? "" : "; ") + ops + tail;
    out.push_back(std::move(u));
  }
  return out;
}

namespace {

// MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read.
uint64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream s(line.substr(13));
    uint64_t kib = 0;
    s >> kib;
    return kib * 1024;
  }
  return 0;
}

std::string gib(uint64_t bytes) {
  std::ostringstream s;
  s.precision(3);
  s << static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0) << " GiB";
  return s.str();
}

const Cases& all_cases() {
  static const Cases kCases = [] {
    Cases c;
    add_creation_cases(c);
    add_elementwise_cases(c);
    add_reduction_cases(c);
    add_linalg_cases(c);
    add_shape_cases(c);
    add_large_cases(c);
    return c;
  }();
  return kCases;
}

}  // namespace

// The suite's ops in the order the cases run them: the case list is the one
// table (plugin ops carry abi.h's names; the others are ops.hpp's).
const std::vector<std::string>& op_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const Case& c : all_cases())
      if (std::find(names.begin(), names.end(), c.op) == names.end()) names.push_back(c.op);
    return names;
  }();
  return kNames;
}

namespace {

// The plugin op a case needs, by abi.h's name: its code's, else the suite
// op's own name when that is a plugin op (cast), else "".
std::string plugin_op_of(const Case& c) {
  if (c.code != BP_OP_INVALID) return bp_op_name(c.code);
  return op_code(c.op) != BP_OP_INVALID ? c.op : std::string();
}

Verdict run_case(const Context& ctx, const Case& c) {
  const std::string needed = plugin_op_of(c);
  const Verdict unsupported{CaseResult::Outcome::unsupported,
                            ctx.device.id() + " does not support the plugin op " + needed + " on " +
                                std::string(to_string(c.dtype)) +
                                (needed == c.op ? "" : " (needed by " + c.op + ")")};
  try {
    // Placement mode asks nothing beforehand: what the device lacks runs on
    // its op_fallback, so every case must run.
    if (!ctx.placement && c.code != BP_OP_INVALID && !ctx.device.supports(static_cast<Op>(c.code), c.dtype))
      return unsupported;
    if (c.large_bytes > 0) {
      const std::string need = "a large case: needs about " + gib(c.large_bytes);
      if (ctx.max_bytes == 0)
        return Verdict::skip(need + "; large cases run only when asked (--large, Options::max_bytes)");
      if (c.large_bytes > ctx.max_bytes)
        return Verdict::skip(need + ", over max_bytes (" + gib(ctx.max_bytes) + ")");
      const uint64_t avail = mem_available();
      if (avail < c.large_bytes) return Verdict::skip(need + ", MemAvailable is " + gib(avail));
    }
    return c.run(ctx);
  } catch (const Error& e) {
    // Placement mode: a refusal of an op or dtype the device lacks means its
    // op_fallback did not cover it, which is what this mode proves it does.
    if (ctx.placement && (e.code() == Errc::unsupported_op || e.code() == Errc::capability_missing) &&
        !(c.code != BP_OP_INVALID && e.code() == Errc::unsupported_op &&
          ctx.device.supports(static_cast<Op>(c.code), c.dtype))) {
      return Verdict::fail("placement: refused with " + std::string(to_string(e.code())) + " although " +
                           ctx.device.id() + "'s op_fallback \"" + ctx.fallback +
                           "\" should have run it: " + e.message());
    }
    // A device that claims the op (supports_op said yes above) must run it:
    // refusing it at execute is a conformance failure, not "unsupported".
    if (e.code() == Errc::unsupported_op && c.code == BP_OP_INVALID)
      return {CaseResult::Outcome::unsupported, e.message()};
    // The host raises capability_missing only for a flag the device lacks
    // (a dtype it cannot hold, matmul): the device cannot run the case.
    if (e.code() == Errc::capability_missing) return {CaseResult::Outcome::unsupported, e.message()};
    if (e.code() == Errc::unsupported_op)
      return Verdict::fail("supports_op claims " + c.op + " on " + std::string(to_string(c.dtype)) +
                           " but the call was refused: " + e.message());
    return Verdict::fail("threw " + std::string(to_string(e.code())) + ": " + e.message());
  } catch (const std::exception& e) {
    return Verdict::fail(std::string("threw std::exception: ") + e.what());
  } catch (...) {
    return Verdict::fail("threw an exception of unknown type");
  }
}

}  // namespace

std::vector<CaseResult> run_conformance(const Device& device, const Options& options) {
  if (!device.valid()) throw Error(Errc::invalid_argument, "run_conformance: the device is not valid");
  const std::vector<std::string>& names = op_names();
  if (!options.op.empty() && std::find(names.begin(), names.end(), options.op) == names.end()) {
    std::string known;
    for (const std::string& n : names) known += (known.empty() ? "" : " ") + n;
    throw Error(Errc::invalid_argument,
                "run_conformance: no op named \"" + options.op + "\"; the suite covers: " + known);
  }
  // Normal mode tests the device's own ops: every op_fallback is off for the
  // run (this thread), so a fallback never makes a backend look conformant
  // and the outcomes are those of a config without one. Placement mode
  // needs the fallback, and proves it.
  std::optional<OpFallbackOff> fallback_off;
  std::string fallback;
  if (options.placement) {
    const Backend backend = device.backend();
    const OpFallback f = backend.op_fallback();
    if (f.kind != OpFallback::Kind::host) {
      const char* env = std::getenv("BACKPLANE_OP_FALLBACK");
      throw Error(
          Errc::invalid_argument,
          "run_conformance: placement mode (Options::placement, --placement) tests op placement and "
          "needs an op_fallback, but backend \"" +
              backend.name() + "\" of " + device.id() + " has op_fallback \"" + f.to_string() +
              "\"; set \"op_fallback\": \"host:<backend>\" in its backends.json entry, or call "
              "Registry::set_op_fallback (`backplane conformance --fallback-host NAME`)" +
              (env != nullptr && std::string_view(env) == "error"
                   ? std::string("; BACKPLANE_OP_FALLBACK=error is set, which turns every op_fallback off")
                   : std::string()));
    }
    fallback = f.to_string();
  } else {
    fallback_off.emplace();
  }
  const Context ctx{device, options.peer, options.verbose, options.max_bytes, options.placement, fallback};
  std::vector<CaseResult> results;
  for (const Case& c : all_cases()) {
    if (!options.op.empty() && c.op != options.op) continue;
    const Verdict v = run_case(ctx, c);
    CaseResult r{c.op, std::string(to_string(c.dtype)), c.name, v.outcome, v.detail, plugin_op_of(c)};
    if (options.on_result) options.on_result(r);
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace backplane::conformance
