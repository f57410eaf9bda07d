// The dtypes the cpu plugin knows: names for messages and element sizes.
// Shared by the op dispatcher (cpu_plugin.cpp) and the collectives.
#ifndef BACKPLANE_PLUGINS_CPU_DTYPES_HPP_
#define BACKPLANE_PLUGINS_CPU_DTYPES_HPP_

#include <backplane/abi.h>

#include <cstdint>
#include <string>

namespace backplane::cpu {

inline std::string dtype_name(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32: return "f32";
    case BP_DTYPE_F64: return "f64";
    case BP_DTYPE_I32: return "i32";
    case BP_DTYPE_I64: return "i64";
    case BP_DTYPE_BOOL: return "bool";
    case BP_DTYPE_F16: return "f16";
    case BP_DTYPE_BF16: return "bf16";
    case BP_DTYPE_U8: return "u8";
    case BP_DTYPE_I8: return "i8";
    default: return "dtype " + std::to_string(dtype);
  }
}

// Bytes per element; 0 for a dtype this plugin does not know.
inline int element_size(int32_t dtype) noexcept {
  switch (dtype) {
    case BP_DTYPE_F64:
    case BP_DTYPE_I64: return 8;
    case BP_DTYPE_F32:
    case BP_DTYPE_I32: return 4;
    case BP_DTYPE_F16:
    case BP_DTYPE_BF16: return 2;
    case BP_DTYPE_BOOL:
    case BP_DTYPE_U8:
    case BP_DTYPE_I8: return 1;
    default: return 0;
  }
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_DTYPES_HPP_
