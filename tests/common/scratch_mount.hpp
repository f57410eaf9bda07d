// A small tmpfs mounted for one test, to provoke what a normal directory
// cannot when the tests run as root: a full disk (ENOSPC) or a read-only
// file system (EROFS). The mount is made in a mount namespace private to the
// test process (unshare), so nothing reaches the host and it ends with the
// process. Where mounting is not permitted (not root, a container without
// CAP_SYS_ADMIN) ok() is false and why_not() says why, for a skip message.
#ifndef BACKPLANE_TESTS_COMMON_SCRATCH_MOUNT_HPP_
#define BACKPLANE_TESTS_COMMON_SCRATCH_MOUNT_HPP_

#include <sched.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

namespace bptest {

class ScratchMount {
 public:
  // Mounts a tmpfs of at most `bytes` (rounded up to pages) on the existing
  // directory `dir`.
  ScratchMount(const std::string& dir, std::size_t bytes, bool read_only = false) : dir_(dir) {
    if (!private_namespace()) return;
    const std::string data = "size=" + std::to_string(bytes) + ",mode=0777";
    const unsigned long flags = MS_NOSUID | MS_NODEV | (read_only ? MS_RDONLY : 0);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", flags, data.c_str()) != 0) {
      why_not_ = "mounting a tmpfs is not permitted here (" + std::string(std::strerror(errno)) + ")";
      return;
    }
    mounted_ = true;
  }
  ~ScratchMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  ScratchMount(const ScratchMount&) = delete;
  ScratchMount& operator=(const ScratchMount&) = delete;

  bool ok() const { return mounted_; }
  const std::string& why_not() const { return why_not_; }

 private:
  bool private_namespace() {
    static const std::string failure = [] {
      if (::unshare(CLONE_NEWNS) != 0)
        return "no private mount namespace (unshare: " + std::string(std::strerror(errno)) + ")";
      // Mounts made from here on stay in this namespace.
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
        return "no private mount namespace (mount --make-rprivate: " + std::string(std::strerror(errno)) +
               ")";
      return std::string();
    }();
    why_not_ = failure;
    return failure.empty();
  }

  std::string dir_;
  bool mounted_ = false;
  std::string why_not_;
};

}  // namespace bptest

#endif  // BACKPLANE_TESTS_COMMON_SCRATCH_MOUNT_HPP_
