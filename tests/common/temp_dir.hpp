// A private temporary folder for backplane_common's tests, removed with
// everything in it (permissions restored first, so a test may make a
// subfolder unwritable).
#ifndef BACKPLANE_TESTS_COMMON_TEMP_DIR_HPP_
#define BACKPLANE_TESTS_COMMON_TEMP_DIR_HPP_

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace bptest {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "backplane-test") {
    namespace fs = std::filesystem;
    static std::atomic<unsigned> counter{0};
    std::random_device rd;
    for (int attempt = 0; attempt < 100; ++attempt) {
      const fs::path p =
          fs::temp_directory_path() / (prefix + "-" + std::to_string(::getpid()) + "-" +
                                       std::to_string(counter++) + "-" + std::to_string(rd() % 100000));
      if (fs::create_directory(p)) {
        path_ = p;
        return;
      }
    }
    FAIL("could not create a temporary directory");
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add,
                                 ignored);
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

  // Writes `bytes` to `rel` (making its folders) with `mode`; returns the path.
  std::string write(const std::string& rel, const std::string& bytes, mode_t mode = 0600) const {
    const std::filesystem::path p = path_ / rel;
    std::filesystem::create_directories(p.parent_path());
    {
      std::ofstream out(p, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    REQUIRE(::chmod(p.c_str(), mode) == 0);
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

}  // namespace bptest

#endif  // BACKPLANE_TESTS_COMMON_TEMP_DIR_HPP_
