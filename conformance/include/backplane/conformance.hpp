// The backplane conformance suite: every op of ops.hpp, on every dtype its
// rules allow, against an independent double-precision reference with
// NumPy semantics, run through the public API on any device of any plugin.
//
// Reusable by third parties: link backplane_conformance and call
// run_conformance(device, options), or run `backplane conformance --config F
// --backend NAME`. Thread-safety: run_conformance may run on several devices
// at once from different threads; one call is single-threaded.
#ifndef BACKPLANE_CONFORMANCE_HPP_
#define BACKPLANE_CONFORMANCE_HPP_

#include <backplane/dtype.hpp>
#include <backplane/registry.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace backplane::conformance {

// One case: an op on one dtype with one set of inputs.
struct CaseResult {
  std::string op;         // "add", "sum", "matmul", ... (the ops.hpp function name)
  std::string dtype;      // "f32", ...: the dtype the op's rule is about (the input's)
  std::string case_name;  // "broadcast [4, 1, 5] x [3, 1]", "nan_inf", ...
  enum class Outcome {
    pass,
    fail,         // a wrong value, shape or dtype, or an unexpected error
    skipped,      // not run: a large case over Options::max_bytes or the free memory
    unsupported,  // the device does not support the op on this dtype, or lacks a capability
                  // the case needs (an operand's dtype flag): not a failure
  } outcome = Outcome::pass;
  std::string detail;  // why it failed / was skipped / was unsupported; with verbose, the error of a pass
  // The plugin op (abi.h's bp_op_name) the case needs: "copy" for to, reshape,
  // cat, ...; "" for a case that needs none.
  std::string plugin_op;
};

// "pass", "fail", "skipped", "unsupported".
const char* to_string(CaseResult::Outcome outcome) noexcept;

struct Options {
  // Run only this op ("" = all). Must be one of op_names().
  std::string op;
  // Passing cases report their largest error relative to the tolerance.
  bool verbose = false;
  // Large cases (a tensor over 2^31 bytes) run only when their estimated peak
  // footprint, host and device together, is at most max_bytes and the host's
  // MemAvailable (/proc/meminfo) covers it. 0 (the default) skips them all.
  uint64_t max_bytes = 0;
  // A second device (another backend, typically cpu:0) for the cases of
  // `to` that copy across backends; invalid (the default): those are skipped.
  Device peer;
  // Called after each case, in order (progress output); may be empty.
  std::function<void(const CaseResult&)> on_result;
  // false (the default): the device's OWN ops are tested. The run holds an
  // OpFallbackOff, so a backend's op_fallback never makes it look
  // conformant: what the device lacks is "unsupported", exactly as without
  // a fallback.
  // true: the proof of op placement. Every case runs on the device through
  // placement (no OpFallbackOff, no supports_op pre-check), the ops and
  // dtypes the device lacks included, so those run on its backend's
  // op_fallback device and must still give the right values on `device`.
  // A case refused as unsupported (unsupported_op, capability_missing) is
  // then a failure: the fallback should have covered it. Needs an
  // op_fallback on the device's backend (backends.json or
  // Registry::set_op_fallback): without one run_conformance throws
  // Errc::invalid_argument. The calling thread must not hold an
  // OpFallbackOff.
  bool placement = false;
};

// Runs every case (or those of options.op) on `device`. Never throws for a
// wrong result or an error of the device: each becomes a CaseResult. Throws
// Errc::invalid_argument for an invalid device, an unknown options.op, and
// options.placement on a backend without an op_fallback.
std::vector<CaseResult> run_conformance(const Device& device, const Options& options = {});

// Every op the suite covers, in the order it runs them.
const std::vector<std::string>& op_names();

// Counts per (op, dtype), ordered as op_names(), then by dtype.
struct Tally {
  std::string op;
  std::string dtype;
  int passed = 0;
  int failed = 0;
  int skipped = 0;
  int unsupported = 0;
  std::string first_failure;  // "<case>: <detail>" of the first failure ("" when none)
  std::string plugin_op;      // as CaseResult::plugin_op
};
std::vector<Tally> tally(const std::vector<CaseResult>& results);

// The group of a plugin op by its kind in abi.h's op table, for reports:
// "binary" (add ... minimum), "compare" (eq ... ge, where), "unary" (neg ...
// clamp), "cast", "creation" (fill, arange, rand_uniform, randn), "reduce"
// (sum ... argmin), "softmax", "matmul", "index" (index_select, gather),
// "copy"; "other" for "" or an unknown name. (Not the plugin SDK's
// op_family, which is the op's dtype class.)
std::string op_kind_group(const std::string& plugin_op);

// The wholly unsupported (op, dtype) pairs (no case ran) of one op_kind_group,
// in one line, by plugin-op name:
// "sum, mean, max on i32, i64; argmax on bool" (ops with the same dtypes share
// a clause; a plugin op needed by suite ops of other names lists them:
// "copy on f64 (for cat, reshape, to)"). Groups in the order of the suite.
struct UnsupportedGroup {
  std::string group;
  std::string text;
  int cases = 0;
};
std::vector<UnsupportedGroup> unsupported_by_group(const std::vector<CaseResult>& results);

// ---- comparison (also for tests of the suite itself) ------------------------

// |got - want| <= abs + rel * scale, where scale is |want| unless the caller
// gives one per element (a reduction's sum of |x|, a matmul's sum of |a*b|).
// exact: the values must be equal. NaN must meet NaN; an infinity must meet
// the same infinity, whatever the tolerance.
struct Tolerance {
  double rel = 0.0;
  double abs = 0.0;
  bool exact = true;
  std::string to_string() const;  // "exact", "rel 1e-06 abs 1e-07"
};

// Compares element by element; nullopt when they match, else a message naming
// the first mismatch (flat index, got, want, allowed error) and how many differ.
std::optional<std::string> compare_values(const std::vector<double>& got, const std::vector<double>& want,
                                          const Tolerance& tolerance,
                                          const std::vector<double>* scale = nullptr);

// The documented tolerance of an op on a dtype (see the table in docs/plugins.md, "Tolerances").
Tolerance tolerance_for(const std::string& op, DType dtype);

}  // namespace backplane::conformance

#endif  // BACKPLANE_CONFORMANCE_HPP_
