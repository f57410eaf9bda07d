// Shape: a tensor's extents, stored inline (no allocation) up to kMaxRank.
// Also used for strides (in elements).
// Thread-safety: a plain value, like int64_t[8]: many threads may read one
// Shape at once; a Shape being written must not be read by another thread.
#ifndef BACKPLANE_SHAPE_HPP_
#define BACKPLANE_SHAPE_HPP_

#include <backplane/export.hpp>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace backplane {

class BACKPLANE_API Shape {
 public:
  // The largest rank a tensor may have. Larger shapes are rejected with
  // Errc::invalid_argument when a tensor is made.
  static constexpr int kMaxRank = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.size()); }
  Shape(std::span<const int64_t> dims) { assign(dims.data(), dims.size()); }
  Shape(const std::vector<int64_t>& dims) { assign(dims.data(), dims.size()); }

  int rank() const noexcept { return rank_; }
  std::size_t size() const noexcept { return static_cast<std::size_t>(rank_); }
  bool empty() const noexcept { return rank_ == 0; }
  int64_t operator[](int i) const noexcept { return dims_[i]; }
  int64_t& operator[](int i) noexcept { return dims_[i]; }
  const int64_t* data() const noexcept { return dims_; }
  int64_t* data() noexcept { return dims_; }
  const int64_t* begin() const noexcept { return dims_; }
  const int64_t* end() const noexcept { return dims_ + rank_; }
  // Product of the extents (1 for a scalar). Assumes a validated shape.
  int64_t numel() const noexcept {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }
  // "[2, 3]"; "[]" for a scalar.
  std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)  // a plain loop: on the per-op path, not a memcmp call
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }

 private:
  void assign(const int64_t* p, std::size_t n);

  int64_t dims_[kMaxRank] = {};
  int rank_ = 0;
};

}  // namespace backplane

#endif  // BACKPLANE_SHAPE_HPP_
