// read_secret_file: every check is made on the descriptor that is read
// (fstat after open), so the file cannot be swapped between check and read.
#include "backplane_common/secret_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "backplane_common/unique_fd.hpp"

namespace backplane::common {

namespace {

// "a directory", "a FIFO", ... for a file that is not regular.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

std::string octal_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

}  // namespace

std::string read_secret_file(const std::string& path, std::string_view what) {
  const std::string file = std::string(what) + " '" + path + "'";
  auto refuse = [&](const std::string& problem) -> SecretFileError {
    return SecretFileError(file + " " + problem);
  };
  const std::string write_hint = "(e.g. openssl rand -hex 32 > '" + path + "' && chmod 600 '" + path + "')";

  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ELOOP)
      throw refuse("is a symbolic link, which a secret file must not be: name the file itself");
    if (err == ENXIO)
      throw refuse("cannot be opened (" + std::string(std::strerror(err)) +
                   "; a socket?): a secret file must be a regular file");
    throw refuse("cannot be opened: " + std::string(std::strerror(err)) + "; check the path " + write_hint);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw refuse("cannot be inspected (fstat): " + std::string(std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw refuse(std::string("is ") + kind_of(st.st_mode) +
                 ", not a regular file; write the secret into a file " + write_hint);
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0)
    throw refuse("belongs to user " + std::to_string(st.st_uid) + ", not to this user (" +
                 std::to_string(me) + ") or root; use a file of your own (chown " + std::to_string(me) +
                 " '" + path + "')");
  if ((st.st_mode & 077) != 0)
    throw refuse("can be read or written by others than its owner (mode " + octal_mode(st.st_mode) +
                 "); a secret must be private: chmod 600 '" + path + "'");
  if (st.st_size > static_cast<off_t>(kMaxSecretFileBytes))
    throw refuse("holds " + std::to_string(st.st_size) + " bytes, more than " +
                 std::to_string(kMaxSecretFileBytes) + "; a secret is one line");

  // Read one byte more than allowed, in case the file grew since fstat.
  std::string secret(kMaxSecretFileBytes + 1, '\0');
  std::size_t got = 0;
  while (got < secret.size()) {
    const ssize_t n = ::read(fd.get(), secret.data() + got, secret.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw refuse("cannot be read: " + std::string(std::strerror(errno)));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > kMaxSecretFileBytes)
    throw refuse("holds more than " + std::to_string(kMaxSecretFileBytes) + " bytes; a secret is one line");
  secret.resize(got);

  if (!secret.empty() && secret.back() == '\n') {
    secret.pop_back();
    if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  }
  if (secret.empty()) throw refuse("is empty; write the secret into it " + write_hint);
  if (secret.find_first_of("\r\n") != std::string::npos)
    throw refuse(
        "holds more than one line; a secret is one line (one trailing newline is allowed), with no line "
        "break "
        "inside");
  if (secret.find('\0') != std::string::npos) throw refuse("holds a NUL byte; a secret is one line of text");
  // Earlier readers dropped surrounding blanks; refusing them, rather than
  // keeping them silently, means no file changes meaning unnoticed.
  if (secret.front() == ' ' || secret.front() == '\t' || secret.back() == ' ' || secret.back() == '\t')
    throw refuse("begins or ends with a space or tab; remove it (every byte of a secret counts)");
  return secret;
}

}  // namespace backplane::common
