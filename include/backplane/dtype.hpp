// Element types, their sizes and names, and the mapping from C++ types.
// Thread-safety: the functions read constant tables and may be called from
// any thread.
#ifndef BACKPLANE_DTYPE_HPP_
#define BACKPLANE_DTYPE_HPP_

#include <backplane/export.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace backplane {

// The values are abi.h's bp_dtype values (the core checks that they agree).
enum class DType : int32_t {
  f32 = 1,
  f64 = 2,
  i32 = 3,
  i64 = 4,
  bool_ = 5,  // one byte, 0 or 1
  f16 = 6,
  bf16 = 7,
  u8 = 8,
  i8 = 9,
};

// Bytes per element; 0 for an unknown value.
BACKPLANE_API std::size_t dtype_size(DType dtype) noexcept;
// "f32", "f64", "i32", "i64", "bool", ...; "invalid" for an unknown value.
BACKPLANE_API std::string_view to_string(DType dtype) noexcept;

template <class T>
struct dtype_of;  // undefined for unsupported element types
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::bool_;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct dtype_of<int8_t> {
  static constexpr DType value = DType::i8;
};
template <class T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

}  // namespace backplane

#endif  // BACKPLANE_DTYPE_HPP_
