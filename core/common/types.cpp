// Names and sizes of dtypes, capabilities and shapes.
#include <backplane/capability.hpp>
#include <backplane/dtype.hpp>
#include <backplane/error.hpp>
#include <backplane/op.hpp>
#include <backplane/shape.hpp>

#include <backplane/abi.h>
#include <backplane/version.hpp>

#include <array>
#include <ostream>
#include <string>

namespace backplane {

// Op is made from BP_OP_TABLE (op.hpp), so its values are abi.h's by
// construction. DType and Capability name abi.h's values without including
// it: they must agree.
static_assert(static_cast<int32_t>(DType::f32) == BP_DTYPE_F32);
static_assert(static_cast<int32_t>(DType::f64) == BP_DTYPE_F64);
static_assert(static_cast<int32_t>(DType::i32) == BP_DTYPE_I32);
static_assert(static_cast<int32_t>(DType::i64) == BP_DTYPE_I64);
static_assert(static_cast<int32_t>(DType::bool_) == BP_DTYPE_BOOL);
static_assert(static_cast<int32_t>(DType::f16) == BP_DTYPE_F16);
static_assert(static_cast<int32_t>(DType::bf16) == BP_DTYPE_BF16);
static_assert(static_cast<int32_t>(DType::u8) == BP_DTYPE_U8);
static_assert(static_cast<int32_t>(DType::i8) == BP_DTYPE_I8);
static_assert(static_cast<int32_t>(DType::i8) + 1 == BP_DTYPE_COUNT_, "a bp_dtype is missing from DType");
static_assert(static_cast<uint64_t>(Capability::collective) == BP_CAP_COLLECTIVE);
static_assert(static_cast<uint64_t>(Capability::async) == BP_CAP_ASYNC);
static_assert(static_cast<uint64_t>(Capability::host_visible) == BP_CAP_HOST_VISIBLE);
static_assert(static_cast<uint64_t>(Capability::remote) == BP_CAP_REMOTE);
static_assert(static_cast<uint64_t>(Capability::matmul) == BP_CAP_MATMUL);
static_assert(static_cast<uint64_t>(Capability::f32) == BP_CAP_F32);
static_assert(static_cast<uint64_t>(Capability::f64) == BP_CAP_F64);
static_assert(static_cast<uint64_t>(Capability::i32) == BP_CAP_I32);
static_assert(static_cast<uint64_t>(Capability::i64) == BP_CAP_I64);
static_assert(static_cast<uint64_t>(Capability::bool_) == BP_CAP_BOOL);
static_assert(static_cast<uint64_t>(Capability::f16) == BP_CAP_F16);
static_assert(static_cast<uint64_t>(Capability::bf16) == BP_CAP_BF16);
static_assert(static_cast<uint64_t>(Capability::u8) == BP_CAP_U8);
static_assert(static_cast<uint64_t>(Capability::i8) == BP_CAP_I8);
static_assert(kAbiMajor == BP_ABI_MAJOR && kAbiMinor == BP_ABI_MINOR, "version.hpp and abi.h disagree");

std::string_view to_string(Op op) noexcept {
  const char* name = bp_op_name(static_cast<int32_t>(op));
  return name != nullptr ? name : "invalid";
}

std::optional<Op> op_from_string(std::string_view name) noexcept {
  for (int32_t op = 1; op < BP_OP_COUNT_; ++op)
    if (const char* n = bp_op_name(op); n != nullptr && name == n) return static_cast<Op>(op);
  return std::nullopt;
}

std::ostream& operator<<(std::ostream& out, Op op) { return out << to_string(op); }

// The names and sizes are abi.h's tables: one table of each, shared with
// plugins and tools.
std::size_t dtype_size(DType dtype) noexcept { return bp_dtype_size(static_cast<int32_t>(dtype)); }

std::string_view to_string(DType dtype) noexcept {
  const char* name = bp_dtype_name(static_cast<int32_t>(dtype));
  return name != nullptr ? name : "invalid";
}

namespace {
// Every flag this core names, in bit order.
constexpr std::array<Capability, 14> kCapabilities{
    Capability::collective, Capability::async, Capability::host_visible, Capability::remote,
    Capability::matmul,     Capability::f32,   Capability::f64,          Capability::i32,
    Capability::i64,        Capability::bool_, Capability::f16,          Capability::bf16,
    Capability::u8,         Capability::i8,
};
}  // namespace

std::string_view to_string(Capability cap) noexcept {
  const char* name = bp_capability_name(static_cast<uint64_t>(cap));
  return name != nullptr ? name : "unknown";
}

std::optional<Capability> capability_from_string(std::string_view name) noexcept {
  for (Capability c : kCapabilities)
    if (to_string(c) == name) return c;
  return std::nullopt;
}

Capability capability_for(DType dtype) noexcept {
  const auto d = static_cast<int32_t>(dtype);
  // No flag (0) for a value abi.h does not know: it also never shifts out of range.
  if (d <= 0 || d >= BP_DTYPE_COUNT_) return static_cast<Capability>(0);
  return static_cast<Capability>(BP_CAP_DTYPE(d));
}

std::vector<std::string> Capabilities::names() const {
  std::vector<std::string> out;
  for (int bit = 0; bit < 64; ++bit) {
    const uint64_t flag = uint64_t{1} << bit;
    if ((bits_ & flag) == 0) continue;
    if (const char* name = bp_capability_name(flag)) out.emplace_back(name);  // unknown bits stay unnamed
  }
  return out;
}

std::string Capabilities::to_string() const {
  std::string out;
  for (const auto& name : names()) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out.empty() ? "none" : out;
}

void Shape::assign(const int64_t* p, std::size_t n) {
  if (n > static_cast<std::size_t>(kMaxRank)) {
    throw Error(Errc::invalid_argument, "shape has rank " + std::to_string(n) +
                                            "; backplane supports at most " + std::to_string(kMaxRank) +
                                            " dimensions");
  }
  for (std::size_t i = 0; i < n; ++i) dims_[i] = p[i];
  rank_ = static_cast<int>(n);
}

std::string Shape::to_string() const {
  std::string out = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(dims_[i]);
  }
  return out + "]";
}

}  // namespace backplane
