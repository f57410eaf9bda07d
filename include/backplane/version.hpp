// The library's version and the plugin ABI it speaks.
#ifndef BACKPLANE_VERSION_HPP_
#define BACKPLANE_VERSION_HPP_

#include <backplane/abi.h>

namespace backplane {

inline constexpr const char* kVersion = "0.1.0";
inline constexpr unsigned kAbiMajor = BP_ABI_MAJOR;
inline constexpr unsigned kAbiMinor = BP_ABI_MINOR;

}  // namespace backplane

#endif  // BACKPLANE_VERSION_HPP_
