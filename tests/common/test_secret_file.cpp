// read_secret_file: the one set of rules every secret file is read by (the
// job secret, `backplane serve`'s and the remote plugin's token), each rule
// with its message: what is wrong, which file, and how to fix it.
#include <backplane_common/secret_file.hpp>

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using backplane::common::kMaxSecretFileBytes;
using backplane::common::read_secret_file;
using backplane::common::SecretFileError;

constexpr const char* kWhat = "the test secret (TEST_VAR)";

using bptest::TempDir;

// read_secret_file's refusal message ("" when it accepted the file).
std::string refusal(const std::string& path) {
  try {
    (void)read_secret_file(path, kWhat);
    return "";
  } catch (const SecretFileError& e) {
    return e.what();
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("secret file: a private one-line file is read, one trailing newline dropped") {
  TempDir dir;
  CHECK(read_secret_file(dir.write("lf", "s3cret\n"), kWhat) == "s3cret");
  CHECK(read_secret_file(dir.write("crlf", "s3cret\r\n"), kWhat) == "s3cret");
  CHECK(read_secret_file(dir.write("bare", "s3cret"), kWhat) == "s3cret");
  CHECK(read_secret_file(dir.write("inner", "a b\tc"), kWhat) == "a b\tc");  // blanks inside count
  CHECK(read_secret_file(dir.write("owner_only", "x\n", 0400), kWhat) == "x");
  const std::string longest(kMaxSecretFileBytes - 1, 'k');
  CHECK(read_secret_file(dir.write("longest", longest + "\n"), kWhat) == longest);
  CHECK(read_secret_file(dir.write("full", std::string(kMaxSecretFileBytes, 'k')), kWhat).size() ==
        kMaxSecretFileBytes);
}

TEST_CASE("secret file: only one trailing newline is dropped, other line breaks are refused") {
  TempDir dir;
  for (const char* text : {"s3cret\n\n", "s3cret\r\n\r\n", "two\nlines\n", "s3cret\r", "a\rb\n", "\n\n"}) {
    CAPTURE(text);
    const std::string msg = refusal(dir.write("lines", text));
    CHECK(contains(msg, "more than one line"));
    CHECK(contains(msg, kWhat));
  }
}

TEST_CASE("secret file: an empty secret is refused, saying how to write one") {
  TempDir dir;
  for (const char* text : {"", "\n", "\r\n"}) {
    CAPTURE(text);
    const std::string path = dir.write("empty", text);
    const std::string msg = refusal(path);
    CHECK(contains(msg, std::string(kWhat) + " '" + path + "' is empty"));
    CHECK(contains(msg, "openssl rand -hex 32"));
    CHECK(contains(msg, "chmod 600"));
  }
}

TEST_CASE("secret file: NUL bytes and surrounding blanks are refused") {
  TempDir dir;
  CHECK(contains(refusal(dir.write("nul", std::string("ab\0cd\n", 6))), "NUL"));
  for (const char* text : {" s3cret\n", "s3cret \n", "s3cret\t", " \n"}) {
    CAPTURE(text);
    CHECK(contains(refusal(dir.write("blank", text)), "begins or ends with a space or tab"));
  }
}

TEST_CASE("secret file: more than 4096 bytes are refused") {
  TempDir dir;
  const std::string msg = refusal(dir.write("big", std::string(kMaxSecretFileBytes + 1, 'k')));
  CHECK(contains(msg, "more than 4096"));
  CHECK(contains(msg, "a secret is one line"));
  // The limit counts the newline too.
  CHECK(
      contains(refusal(dir.write("big_lf", std::string(kMaxSecretFileBytes, 'k') + "\n")), "more than 4096"));
}

TEST_CASE("secret file: group or other permission bits are refused, naming the mode and chmod 600") {
  TempDir dir;
  for (const mode_t mode : {0644, 0640, 0604, 0660, 0602, 0610, 0601, 0700 | 0004}) {
    CAPTURE(mode);
    const std::string path = dir.write("open", "s3cret\n", mode);
    const std::string msg = refusal(path);
    CHECK(contains(msg, "can be read or written by others than its owner"));
    CHECK(contains(msg, "chmod 600 '" + path + "'"));
  }
  const std::string path = dir.write("readable", "s3cret\n", 0644);
  CHECK(contains(refusal(path), "(mode 0644)"));
}

TEST_CASE("secret file: a symbolic link is refused, even to a private file") {
  TempDir dir;
  const std::string target = dir.write("target", "s3cret\n");
  const fs::path link = dir.path() / "link";
  fs::create_symlink(target, link);
  const std::string msg = refusal(link.string());
  CHECK(contains(msg, "symbolic link"));
  CHECK(contains(msg, link.string()));
}

TEST_CASE("secret file: a FIFO is refused at once, without waiting for a writer") {
  TempDir dir;
  const fs::path fifo = dir.path() / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string msg = refusal(fifo.string());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(contains(msg, "FIFO"));
  CHECK(contains(msg, "not a regular file"));
}

TEST_CASE("secret file: a directory, a device and a missing file are refused") {
  TempDir dir;
  CHECK(contains(refusal(dir.path().string()), "is a directory, not a regular file"));
  CHECK(contains(refusal("/dev/null"), "is a character device, not a regular file"));
  const std::string missing = refusal((dir.path() / "missing").string());
  CHECK(contains(missing, "cannot be opened: No such file or directory"));
  CHECK(contains(missing, kWhat));
}

TEST_CASE("secret file: a file of another user is refused (needs root to make one)") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: only root can give a file to another user");
    return;
  }
  TempDir dir;
  const std::string path = dir.write("theirs", "s3cret\n");
  REQUIRE(::chown(path.c_str(), 12345, 12345) == 0);
  const std::string msg = refusal(path);
  CHECK(contains(msg, "belongs to user 12345, not to this user (0) or root"));
  // Root's own files are accepted for any user; here the reader is root.
  REQUIRE(::chown(path.c_str(), 0, 0) == 0);
  CHECK(read_secret_file(path, kWhat) == "s3cret");
}
