// The ops a plugin may run, as the host API names them (Device::supports).
// The values are abi.h's bp_op values; host code needs no C ABI header to
// name them. What each op computes is documented with its function in
// <backplane/ops.hpp>; the plugin's side, in abi.h.
// Thread-safety: the functions read constant tables and may be called from
// any thread.
#ifndef BACKPLANE_OP_HPP_
#define BACKPLANE_OP_HPP_

#include <backplane/export.hpp>

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string_view>

namespace backplane {

enum class Op : int32_t {
  add = 1,
  sub = 2,
  mul = 3,
  div = 4,
  matmul = 5,
  copy = 6,
  pow = 7,
  maximum = 8,
  minimum = 9,
  eq = 10,
  ne = 11,
  lt = 12,
  le = 13,
  gt = 14,
  ge = 15,
  where = 16,
  neg = 17,
  abs = 18,
  exp = 19,
  log = 20,
  sqrt = 21,
  tanh = 22,
  sigmoid = 23,
  relu = 24,
  sin = 25,
  cos = 26,
  clamp = 27,
  cast = 28,
  fill = 29,
  arange = 30,
  rand_uniform = 31,
  randn = 32,
  sum = 33,
  mean = 34,
  max = 35,
  min = 36,
  argmax = 37,
  argmin = 38,
  softmax = 39,
  log_softmax = 40,
  index_select = 41,
  gather = 42,
};

// The plugin-op name, as abi.h and `backplane conformance` spell it ("add",
// "copy", "log_softmax", ...); "invalid" for a value this version does not name.
BACKPLANE_API std::string_view to_string(Op op) noexcept;
BACKPLANE_API std::optional<Op> op_from_string(std::string_view name) noexcept;
BACKPLANE_API std::ostream& operator<<(std::ostream& out, Op op);

}  // namespace backplane

#endif  // BACKPLANE_OP_HPP_
