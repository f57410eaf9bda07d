// The ops a plugin may run, as the host API names them (Device::supports).
// Op is made from abi.h's op table (BP_OP_TABLE), so its names and values
// are abi.h's. What each op computes is documented with its function in
// <backplane/ops.hpp>; the plugin's side, in abi.h.
// Thread-safety: the functions read constant tables and may be called from
// any thread.
#ifndef BACKPLANE_OP_HPP_
#define BACKPLANE_OP_HPP_

#include <backplane/abi.h>
#include <backplane/export.hpp>

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string_view>

namespace backplane {

// One enumerator per row of abi.h's BP_OP_TABLE, with its value: an op added
// there is named here without an edit.
enum class Op : int32_t {
#define BACKPLANE_OP_ENUMERATOR_(NAME, value, name, kind, dtypes, inputs, attrs) name = value,
  BP_OP_TABLE(BACKPLANE_OP_ENUMERATOR_)
#undef BACKPLANE_OP_ENUMERATOR_
};

// The plugin-op name, as abi.h and `backplane conformance` spell it ("add",
// "copy", "log_softmax", ...); "invalid" for a value this version does not name.
BACKPLANE_API std::string_view to_string(Op op) noexcept;
BACKPLANE_API std::optional<Op> op_from_string(std::string_view name) noexcept;
BACKPLANE_API std::ostream& operator<<(std::ostream& out, Op op);

}  // namespace backplane

#endif  // BACKPLANE_OP_HPP_
