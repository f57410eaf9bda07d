// Names and sizes of dtypes, capabilities and shapes.
#include <backplane/capability.hpp>
#include <backplane/dtype.hpp>
#include <backplane/error.hpp>
#include <backplane/shape.hpp>

#include <array>
#include <string>

namespace backplane {

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::bool_: return 1;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::u8: return 1;
    case DType::i8: return 1;
  }
  return 0;
}

std::string_view to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::bool_: return "bool";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::u8: return "u8";
    case DType::i8: return "i8";
  }
  return "invalid";
}

namespace {
constexpr std::array<std::pair<Capability, std::string_view>, 9> kCapabilityNames{{
    {Capability::collective, "collective"},
    {Capability::async, "async"},
    {Capability::host_visible, "host_visible"},
    {Capability::f64, "f64"},
    {Capability::f16, "f16"},
    {Capability::bf16, "bf16"},
    {Capability::remote, "remote"},
    {Capability::int64, "int64"},
    {Capability::matmul, "matmul"},
}};
}  // namespace

std::string_view to_string(Capability cap) noexcept {
  for (const auto& [c, name] : kCapabilityNames)
    if (c == cap) return name;
  return "unknown";
}

std::optional<Capability> capability_from_string(std::string_view name) noexcept {
  for (const auto& [c, n] : kCapabilityNames)
    if (n == name) return c;
  return std::nullopt;
}

std::vector<std::string> Capabilities::names() const {
  std::vector<std::string> out;
  for (const auto& [c, name] : kCapabilityNames)
    if (has(c)) out.emplace_back(name);
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
    throw Error(Errc::invalid_argument, "shape has rank " + std::to_string(n) + "; backplane supports at most " +
                                            std::to_string(kMaxRank) + " dimensions");
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
