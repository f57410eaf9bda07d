// Capability flags a device declares at runtime (the bits of BP_CAP_* in abi.h;
// the core checks that they agree).
// Every backend-dependent decision is a lookup of these flags.
// Thread-safety: the functions read constant tables and may be called from
// any thread. Capabilities is a value whose members are all const: any number
// of threads may read one at once.
#ifndef BACKPLANE_CAPABILITY_HPP_
#define BACKPLANE_CAPABILITY_HPP_

#include <backplane/export.hpp>

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
  collective = uint64_t{1} << 0,
  async = uint64_t{1} << 1,
  host_visible = uint64_t{1} << 2,
  remote = uint64_t{1} << 3,
  matmul = uint64_t{1} << 4,
  f32 = uint64_t{1} << (16 + 1),
  f64 = uint64_t{1} << (16 + 2),
  i32 = uint64_t{1} << (16 + 3),
  i64 = uint64_t{1} << (16 + 4),
  bool_ = uint64_t{1} << (16 + 5),
  f16 = uint64_t{1} << (16 + 6),
  bf16 = uint64_t{1} << (16 + 7),
  u8 = uint64_t{1} << (16 + 8),
  i8 = uint64_t{1} << (16 + 9),
};

// "collective", "async", ..., "f64", "bool"; "unknown" for a value this
// version does not name. The names are abi.h's.
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

  constexpr bool has(Capability cap) const noexcept { return (bits_ & static_cast<uint64_t>(cap)) != 0; }
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
