// AtomicFileWriter: the final name holds the old file or the whole new one,
// never an empty or partial file, and every failure names the file and the
// OS error: a missing directory, an unwritable one, a full disk, a failing
// device.
#include <backplane_common/atomic_file.hpp>

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "scratch_mount.hpp"
#include "temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using backplane::common::AtomicFileWriter;
using backplane::common::check_file_writable;
using backplane::common::FileWriteError;
using backplane::common::write_file_atomically;

using bptest::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void put(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// The names in `dir`, sorted.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Runs fn, which must throw FileWriteError; returns it.
template <class Fn>
FileWriteError write_error(Fn&& fn) {
  try {
    fn();
  } catch (const FileWriteError& e) {
    return e;
  }
  FAIL("no FileWriteError was thrown");
  return FileWriteError("", 0);
}

#define CHECK_CONTAINS(text, part) CHECK_MESSAGE(std::string(text).find(part) != std::string::npos, text)

}  // namespace

TEST_CASE("atomic file: writes the whole file, replaces an old one keeping its mode, leaves no temporary") {
  TempDir tmp;
  const fs::path p = tmp / "out.json";
  write_file_atomically(p.string(), "first\n");
  CHECK(slurp(p) == "first\n");
  REQUIRE(::chmod(p.c_str(), 0640) == 0);
  write_file_atomically(p.string(), std::string(100000, 'x'));
  CHECK(slurp(p) == std::string(100000, 'x'));
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0640);
  CHECK(names_in(tmp.path()) == std::vector<std::string>{"out.json"});
}

TEST_CASE("atomic file: a writer destroyed without commit leaves the old file and no temporary") {
  TempDir tmp;
  const fs::path p = tmp / "out.json";
  put(p, "old");
  {
    AtomicFileWriter w(p.string());
    w.write("half of the new");
    CHECK(names_in(tmp.path()).size() == 2);  // the temporary file sits beside it
  }
  CHECK(slurp(p) == "old");
  CHECK(names_in(tmp.path()) == std::vector<std::string>{"out.json"});
}

TEST_CASE("atomic file: a directory that does not exist is an error naming the file and ENOENT") {
  TempDir tmp;
  const fs::path p = tmp / "no_such_dir" / "out.json";
  for (bool check_only : {false, true}) {
    CAPTURE(check_only);
    const FileWriteError e = write_error([&] {
      if (check_only) {
        check_file_writable(p.string());
      } else {
        write_file_atomically(p.string(), "x");
      }
    });
    CHECK(e.error_number() == ENOENT);
    CHECK_CONTAINS(e.what(), "cannot write '" + p.string() + "'");
    CHECK_CONTAINS(e.what(), std::strerror(ENOENT));
  }
  CHECK_FALSE(fs::exists(tmp / "no_such_dir"));
}

TEST_CASE("atomic file: a directory as the name is refused, a file as a directory is ENOTDIR") {
  TempDir tmp;
  fs::create_directory(tmp / "dir");
  const FileWriteError dir = write_error([&] { write_file_atomically((tmp / "dir").string(), "x"); });
  CHECK(dir.error_number() == EISDIR);
  CHECK_CONTAINS(dir.what(), std::strerror(EISDIR));
  put(tmp / "file", "kept");
  const FileWriteError notdir =
      write_error([&] { write_file_atomically((tmp / "file" / "x").string(), "x"); });
  CHECK(notdir.error_number() == ENOTDIR);
  CHECK(slurp(tmp / "file") == "kept");
}

TEST_CASE("atomic file: an unwritable directory is an error and the old file stays whole") {
  TempDir tmp;
  const fs::path dir = tmp / "locked";
  fs::create_directory(dir);
  const fs::path p = dir / "out.json";
  put(p, "old");
  REQUIRE(::chmod(dir.c_str(), 0555) == 0);
  if (::access(dir.c_str(), W_OK) == 0) {
    // Root writes anyway; a read-only file system stops it.
    REQUIRE(::chmod(dir.c_str(), 0755) == 0);
    bptest::ScratchMount ro(dir.string(), 1 << 16, /*read_only=*/true);
    if (!ro.ok()) {
      MESSAGE("skipped: running as root, and " << ro.why_not());
      return;
    }
    const FileWriteError e = write_error([&] { write_file_atomically(p.string(), "new"); });
    CHECK(e.error_number() == EROFS);
    CHECK_CONTAINS(e.what(), "cannot write '" + p.string() + "'");
    CHECK_CONTAINS(e.what(), std::strerror(EROFS));
    CHECK(names_in(dir).empty());
    return;
  }
  const FileWriteError e = write_error([&] { write_file_atomically(p.string(), "new"); });
  CHECK(e.error_number() == EACCES);
  CHECK_CONTAINS(e.what(), "cannot write '" + p.string() + "'");
  CHECK_CONTAINS(e.what(), std::strerror(EACCES));
  CHECK(slurp(p) == "old");
  CHECK(names_in(dir) == std::vector<std::string>{"out.json"});
}

TEST_CASE("atomic file: a full disk (ENOSPC) fails the write and leaves the old file and no temporary") {
  TempDir tmp;
  const fs::path dir = tmp / "small";
  fs::create_directory(dir);
  bptest::ScratchMount small(dir.string(), 16 << 10);
  if (!small.ok()) {
    MESSAGE("skipped: " << small.why_not());
    return;
  }
  const fs::path p = dir / "out.json";
  write_file_atomically(p.string(), "old");
  const FileWriteError e =
      write_error([&] { write_file_atomically(p.string(), std::string(64 << 10, 'x')); });
  CHECK(e.error_number() == ENOSPC);
  CHECK_CONTAINS(e.what(), "cannot write '" + p.string() + "'");
  CHECK_CONTAINS(e.what(), std::strerror(ENOSPC));
  CHECK(slurp(p) == "old");
  CHECK(names_in(dir) == std::vector<std::string>{"out.json"});
  // A new name on the full disk: nothing appears under it.
  const fs::path fresh = dir / "fresh.json";
  CHECK_THROWS_AS(write_file_atomically(fresh.string(), std::string(64 << 10, 'y')), FileWriteError);
  CHECK_FALSE(fs::exists(fresh));
}

TEST_CASE("atomic file: a device is written in place and its failure (/dev/full) is reported") {
  const FileWriteError e = write_error([] { write_file_atomically("/dev/full", "{\"steps\": 1}\n"); });
  CHECK(e.error_number() == ENOSPC);
  CHECK_CONTAINS(e.what(), "cannot write '/dev/full'");
  CHECK_CONTAINS(e.what(), std::strerror(ENOSPC));
  write_file_atomically("/dev/null", "discarded");
  struct stat st {};
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
}

TEST_CASE("atomic file: a symbolic link stays a link and its target gets the new bytes") {
  TempDir tmp;
  fs::create_directory(tmp / "real");
  put(tmp / "real" / "out.json", "old");
  fs::create_symlink("real/out.json", tmp / "link.json");
  write_file_atomically((tmp / "link.json").string(), "new");
  CHECK(fs::is_symlink(tmp / "link.json"));
  CHECK(slurp(tmp / "real" / "out.json") == "new");
  CHECK(names_in(tmp / "real") == std::vector<std::string>{"out.json"});
}

TEST_CASE("atomic file: LinkPolicy::replace replaces a link with the file and never touches its target") {
  TempDir tmp;
  put(tmp / "victim", "precious");
  fs::create_directory(tmp / "folder");
  fs::create_symlink("../victim", tmp / "folder" / "step.bin");
  fs::create_symlink("../missing", tmp / "folder" / "dangling.bin");
  ::mkfifo((tmp / "folder" / "fifo.bin").c_str(), 0600);
  for (const char* name : {"step.bin", "dangling.bin", "fifo.bin"}) {
    CAPTURE(name);
    const fs::path p = tmp / "folder" / name;
    check_file_writable(p.string(), backplane::common::LinkPolicy::replace);
    write_file_atomically(p.string(), "checkpoint", backplane::common::LinkPolicy::replace);
    CHECK(fs::is_regular_file(fs::symlink_status(p)));
    CHECK(slurp(p) == "checkpoint");
  }
  CHECK(slurp(tmp / "victim") == "precious");
  CHECK_FALSE(fs::exists(tmp / "missing"));
}

TEST_CASE(
    "atomic file: another user's link in a sticky world-writable folder is refused, as protected_symlinks") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: making a link owned by another user needs root");
    return;
  }
  TempDir tmp;
  put(tmp / "victim", "root's file");
  const fs::path shared = tmp / "shared";
  fs::create_directory(shared);
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);
  const fs::path link = shared / "metrics.json";
  fs::create_symlink(tmp / "victim", link);
  REQUIRE(::lchown(link.c_str(), 65534, 65534) == 0);  // nobody's link
  for (const bool check_only : {true, false}) {
    CAPTURE(check_only);
    const FileWriteError e = write_error([&] {
      if (check_only)
        check_file_writable(link.string());
      else
        write_file_atomically(link.string(), "overwritten");
    });
    CHECK(e.error_number() == EACCES);
    CHECK_CONTAINS(e.what(), "is a symbolic link owned by uid 65534 in the sticky world-writable folder");
    CHECK_CONTAINS(e.what(), "remove the link or name the file it should lead to");
  }
  CHECK(slurp(tmp / "victim") == "root's file");
  // The folder's owner's link, and one's own, are followed as before.
  REQUIRE(::lchown(link.c_str(), 0, 0) == 0);
  write_file_atomically(link.string(), "mine");
  CHECK(slurp(tmp / "victim") == "mine");
  // Not sticky: the kernel follows any link there, and so does the writer.
  REQUIRE(::chmod(shared.c_str(), 0777) == 0);
  REQUIRE(::lchown(link.c_str(), 65534, 65534) == 0);
  write_file_atomically(link.string(), "followed");
  CHECK(slurp(tmp / "victim") == "followed");
}

TEST_CASE("atomic file: final_name_of_temporary names what a temporary file stands for") {
  using backplane::common::final_name_of_temporary;
  CHECK(final_name_of_temporary(".m.json.tmp-12-ab3f") == "m.json");
  CHECK(final_name_of_temporary(".step-0000000005.safetensors.tmp-123-abcdef") ==
        "step-0000000005.safetensors");
  CHECK(final_name_of_temporary(".a.tmp-b.tmp-1-2") == "a.tmp-b");
  for (const char* other : {"m.json", ".m.json", ".tmp-1-2", "..tmp-1", ".m.json.tmp-", "x.tmp-1-2", ""})
    CHECK_MESSAGE(!final_name_of_temporary(other), other);
  // What the writer leaves while it writes is recognised.
  TempDir tmp;
  AtomicFileWriter w((tmp / "out.json").string());
  const std::vector<std::string> names = names_in(tmp.path());
  REQUIRE(names.size() == 1);
  CHECK(final_name_of_temporary(names[0]) == "out.json");
}

TEST_CASE("atomic file: check_file_writable neither creates nor truncates the final name") {
  TempDir tmp;
  const fs::path fresh = tmp / "fresh.json";
  check_file_writable(fresh.string());
  CHECK_FALSE(fs::exists(fresh));
  const fs::path old = tmp / "old.json";
  put(old, "keep me");
  check_file_writable(old.string());
  CHECK(slurp(old) == "keep me");
  CHECK(names_in(tmp.path()) == std::vector<std::string>{"old.json"});
}
