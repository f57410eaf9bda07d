// Internals of the conformance suite: host-side tensors (the reference's
// values), the deterministic input generator, the case table and the checks
// that turn a device result into a verdict. Not installed; not API.
#ifndef BACKPLANE_CONFORMANCE_SUITE_HPP_
#define BACKPLANE_CONFORMANCE_SUITE_HPP_

#include <backplane/conformance.hpp>

#include <backplane/abi.h>
#include <backplane/error.hpp>
#include <backplane/tensor.hpp>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace backplane::conformance {

// ---- host tensors ------------------------------------------------------------

bool is_float(DType dtype) noexcept;

// A row-major tensor in host memory. Float dtypes keep their values in `f`
// (already rounded to the dtype: an f32 tensor holds only values a float can
// represent); integer and bool dtypes keep theirs in `i` (wrapped to the
// dtype's width; bool is 0 or 1). Exactly one of the two is used.
struct HostTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<double> f;
  std::vector<int64_t> i;

  int64_t numel() const;
  // Element k as a double (exact for floats; ints beyond 2^53 round).
  double at(int64_t k) const;
};

// The value `v` stored in `dtype`: rounded to float for f32, wrapped for
// integers (two's complement), 0/1 for bool.
double round_to(DType dtype, double v);
int64_t wrap_to(DType dtype, int64_t v);

// A tensor of `dtype` and `shape` from values (rounded / wrapped to dtype).
HostTensor make_host(DType dtype, std::vector<int64_t> shape, const std::vector<double>& values);
HostTensor make_host_int(DType dtype, std::vector<int64_t> shape, const std::vector<int64_t>& values);

Tensor upload(const Device& device, const HostTensor& t);
HostTensor download(const Tensor& t);

std::string shape_text(const std::vector<int64_t>& shape);  // "[2, 3]"
std::string number(double v);                               // "%g"
// A seed from a case's name: each case gets its own inputs, the same every run.
uint64_t seed_of(const std::string& text);

// splitmix64: the same inputs on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform(double lo, double hi);     // [lo, hi)
  int64_t integer(int64_t lo, int64_t hi);  // [lo, hi], inclusive
  double pick(std::initializer_list<double> values);

 private:
  uint64_t state_;
};

// `n` values for `dtype`: uniform in [lo, hi) for floats, integers in
// [lo, hi] for integer dtypes, 0/1 for bool.
HostTensor random_host(Rng& rng, DType dtype, std::vector<int64_t> shape, double lo, double hi);

// An input as a case hands it to an op: a contiguous base tensor, seen
// through a view when the case wants a strided (non-contiguous) operand.
struct Operand {
  enum class View { none, transpose, slice, permute };
  HostTensor base;
  View view = View::none;
  std::vector<int64_t> args;  // transpose: d0 d1; slice: axis start end step; permute: dims

  HostTensor logical() const;             // the values the op sees (for the reference)
  Tensor on(const Device& device) const;  // uploads `base` and applies the view there
  std::string describe() const;           // "[2, 3]", "[5, 4].T(0, 1)", "[4, 10][1:10:2 on 1]"
};
Operand plain(HostTensor t);
Operand transposed(HostTensor base, int64_t dim0, int64_t dim1);
Operand sliced(HostTensor base, int64_t axis, int64_t start, int64_t end, int64_t step);
Operand permuted(HostTensor base, std::vector<int64_t> dims);

// ---- cases -------------------------------------------------------------------

struct Verdict {
  CaseResult::Outcome outcome = CaseResult::Outcome::pass;
  std::string detail;

  static Verdict pass(std::string detail = {}) { return {CaseResult::Outcome::pass, std::move(detail)}; }
  static Verdict fail(std::string detail) { return {CaseResult::Outcome::fail, std::move(detail)}; }
  static Verdict skip(std::string detail) { return {CaseResult::Outcome::skipped, std::move(detail)}; }
};

struct Context {
  Device device;
  Device peer;  // may be invalid
  bool verbose = false;
  uint64_t max_bytes = 0;
  // Options::placement: every case runs through op placement; `fallback` is
  // the device's backend's op_fallback ("host:cpu"), for messages.
  bool placement = false;
  std::string fallback;
};

struct Case {
  std::string op;
  DType dtype = DType::f32;
  std::string name;
  // Checked with Device::supports(code, dtype) before the case runs (false:
  // "unsupported"); BP_OP_INVALID skips the check, as does placement mode
  // (the op_fallback runs what the device lacks).
  int32_t code = BP_OP_INVALID;
  // > 0 for a large case: its estimated peak footprint in bytes.
  uint64_t large_bytes = 0;
  std::function<Verdict(const Context&)> run;
};

using Cases = std::vector<Case>;

void add_creation_cases(Cases& cases);
void add_elementwise_cases(Cases& cases);
void add_reduction_cases(Cases& cases);
void add_linalg_cases(Cases& cases);  // matmul, softmax, log_softmax
void add_shape_cases(Cases& cases);   // shape ops, cast, contiguous, to
void add_large_cases(Cases& cases);

// ---- checks ------------------------------------------------------------------

// Reads `got` back and compares dtype, shape and values with `want` under
// `tolerance` (per-element scale optional, see Tolerance).
Verdict check(const Context& ctx, const Tensor& got, const HostTensor& want, const Tolerance& tolerance,
              const std::vector<double>* scale = nullptr);

// Runs fn, which must throw backplane::Error with one of `codes` (any code
// but internal when `codes` is empty). Errc::unsupported_op, and
// Errc::capability_missing unless `codes` names it, are rethrown: the runner
// reports them (the device cannot run the op, or hold an operand's dtype).
Verdict expect_error(const std::function<void()>& fn, std::initializer_list<Errc> codes);

}  // namespace backplane::conformance

#endif  // BACKPLANE_CONFORMANCE_SUITE_HPP_
