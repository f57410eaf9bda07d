// UniqueFd: owns one POSIX file descriptor and closes it when destroyed.
// Movable, not copyable. Not thread-safe: one owner at a time.
#ifndef BACKPLANE_COMMON_UNIQUE_FD_HPP_
#define BACKPLANE_COMMON_UNIQUE_FD_HPP_

#include <unistd.h>

#include <utility>

namespace backplane::common {

class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  // Takes ownership of `fd`; a negative value means "none".
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }

  // Closes the descriptor held (if any) and holds `fd` instead.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0 && fd_ != fd) ::close(fd_);
    fd_ = fd;
  }
  // Gives up ownership without closing; returns the descriptor.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

}  // namespace backplane::common

#endif  // BACKPLANE_COMMON_UNIQUE_FD_HPP_
