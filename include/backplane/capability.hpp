// Capability flags a device declares at runtime (mirrors BP_CAP_* in abi.h).
// Every backend-dependent decision is a lookup of these flags.
#ifndef BACKPLANE_CAPABILITY_HPP_
#define BACKPLANE_CAPABILITY_HPP_

#include <backplane/export.hpp>

#include <backplane/abi.h>
#include <backplane/dtype.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backplane {

// What each flag decides is written next to BP_CAP_* in abi.h. A dtype flag
// (f32 ... i8) says the device holds tensors of that dtype: the core refuses
// to create, import or move a tensor of a dtype whose flag the device lacks.
enum class Capability : uint64_t {
  collective = BP_CAP_COLLECTIVE,
  async = BP_CAP_ASYNC,
  host_visible = BP_CAP_HOST_VISIBLE,
  remote = BP_CAP_REMOTE,
  matmul = BP_CAP_MATMUL,
  f32 = BP_CAP_F32,
  f64 = BP_CAP_F64,
  i32 = BP_CAP_I32,
  i64 = BP_CAP_I64,
  bool_ = BP_CAP_BOOL,
  f16 = BP_CAP_F16,
  bf16 = BP_CAP_BF16,
  u8 = BP_CAP_U8,
  i8 = BP_CAP_I8,
};

// "collective", "async", ..., "f64", "bool"; "unknown" for a value this
// version does not name. The names are abi.h's (bp_capability_name).
BACKPLANE_API std::string_view to_string(Capability cap) noexcept;
BACKPLANE_API std::optional<Capability> capability_from_string(std::string_view name) noexcept;
// The flag that says a device holds tensors of `dtype` (no bit for an
// unknown dtype value).
BACKPLANE_API Capability capability_for(DType dtype) noexcept;

// A set of capability flags. Unknown bits are kept but never named.
class BACKPLANE_API Capabilities {
 public:
  constexpr Capabilities() = default;
  constexpr explicit Capabilities(uint64_t bits) : bits_(bits) {}

  constexpr bool has(Capability cap) const noexcept {
    return (bits_ & static_cast<uint64_t>(cap)) != 0;
  }
  constexpr uint64_t bits() const noexcept { return bits_; }
  constexpr bool operator==(const Capabilities&) const = default;
  // The names of the known flags that are set, in bit order.
  std::vector<std::string> names() const;
  // "collective, host_visible, f64" or "none".
  std::string to_string() const;

 private:
  uint64_t bits_ = 0;
};

}  // namespace backplane

#endif  // BACKPLANE_CAPABILITY_HPP_
