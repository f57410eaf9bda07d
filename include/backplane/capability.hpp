// Capability flags a device declares at runtime (mirrors BP_CAP_* in abi.h).
// Every backend-dependent decision is a lookup of these flags.
#ifndef BACKPLANE_CAPABILITY_HPP_
#define BACKPLANE_CAPABILITY_HPP_

#include <backplane/export.hpp>

#include <backplane/abi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backplane {

enum class Capability : uint64_t {
  collective = BP_CAP_COLLECTIVE,
  async = BP_CAP_ASYNC,
  host_visible = BP_CAP_HOST_VISIBLE,
  f64 = BP_CAP_F64,
  f16 = BP_CAP_F16,
  bf16 = BP_CAP_BF16,
  remote = BP_CAP_REMOTE,
  int64 = BP_CAP_INT64,
  matmul = BP_CAP_MATMUL,
};

// "collective", "async", ...; "unknown" for a value this version does not name.
BACKPLANE_API std::string_view to_string(Capability cap) noexcept;
BACKPLANE_API std::optional<Capability> capability_from_string(std::string_view name) noexcept;

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
