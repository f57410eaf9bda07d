// A fresh memory cgroup (v1 or v2) with a byte limit, beside this process's
// own, for the tests that check out-of-memory handling under a real limit.
// Needs root and a writable cgroup file system; otherwise `ok()` is false and
// `why()` says why (the test skips with it). Processes join it by writing
// their pid (or 0, "me") to `procs()`. Removed when destroyed, once its
// processes are gone (the test waits for them first).
#ifndef BACKPLANE_TESTS_COMMON_MEMORY_CGROUP_HPP_
#define BACKPLANE_TESTS_COMMON_MEMORY_CGROUP_HPP_

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

namespace bptest {

class MemoryCgroup {
 public:
  explicit MemoryCgroup(uint64_t limit_bytes) {
    if (::geteuid() != 0) {
      why_ = "not root, so no memory cgroup can be made";
      return;
    }
    const std::string name =
        "/backplane-test-" + std::to_string(::getpid()) + "-" + std::to_string(++serial());
    const std::string v1_root = "/sys/fs/cgroup/memory";
    const std::string v1 = own_path(false);
    if (!v1.empty() && ::access((v1_root + "/memory.limit_in_bytes").c_str(), F_OK) == 0) {
      if (make(v1_root + (v1 == "/" ? "" : v1) + name, "/memory.limit_in_bytes", limit_bytes)) return;
    }
    const std::string v2 = own_path(true);
    for (const std::string root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
      if (v2.empty() || ::access((root + "/cgroup.controllers").c_str(), F_OK) != 0) continue;
      if (make(root + (v2 == "/" ? "" : v2) + name, "/memory.max", limit_bytes)) return;
    }
    if (why_.empty()) why_ = "no memory cgroup file system is mounted";
  }
  ~MemoryCgroup() {
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  bool ok() const { return !dir_.empty(); }
  const std::string& why() const { return why_; }
  const std::string& dir() const { return dir_; }
  std::string procs() const { return dir_ + "/cgroup.procs"; }

  static bool write_file(const std::string& path, const std::string& text) {
    std::ofstream out(path);
    out << text;
    out.flush();
    return static_cast<bool>(out);
  }

 private:
  static int& serial() {
    static int n = 0;
    return n;
  }
  // This process's cgroup path for the v1 memory controller ("4:memory:/x") or v2 ("0::/x").
  static std::string own_path(bool v2) {
    std::ifstream in("/proc/self/cgroup");
    for (std::string line; std::getline(in, line);) {
      if (v2 && line.rfind("0::", 0) == 0) return line.substr(3);
      const auto at = line.find(":memory:");
      if (!v2 && at != std::string::npos) return line.substr(at + 8);
    }
    return "";
  }
  bool make(const std::string& dir, const std::string& limit_file, uint64_t limit) {
    if (::mkdir(dir.c_str(), 0755) != 0) {
      why_ = "cannot make the cgroup " + dir + " (" + std::strerror(errno) + ")";
      return false;
    }
    if (!write_file(dir + limit_file, std::to_string(limit))) {
      why_ = "cannot set " + dir + limit_file + " (is the memory controller enabled there?)";
      ::rmdir(dir.c_str());
      return false;
    }
    dir_ = dir;
    return true;
  }

  std::string dir_;
  std::string why_;
};

}  // namespace bptest

#endif  // BACKPLANE_TESTS_COMMON_MEMORY_CGROUP_HPP_
