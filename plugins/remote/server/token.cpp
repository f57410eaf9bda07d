// Reading the server's token from a private file or the environment.
#include "token.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace backplane::remote::server {

namespace {

constexpr std::size_t kMaxTokenBytes = 4096;

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string read_token_file(const std::string& path) {
  const std::string where = "the token file '" + path + "' (--token-file)";
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY)};
  if (file.fd < 0) throw std::runtime_error("cannot open " + where + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw std::runtime_error(where + " is not a regular file");
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    throw std::runtime_error(where + " belongs to user " + std::to_string(st.st_uid) +
                             ", not to this user (" + std::to_string(::geteuid()) +
                             "); use a token file of your own");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw std::runtime_error(where + " can be read or written by others than its owner (mode " + mode +
                             "); a token must be private: chmod 600 '" + path + "'");
  }
  std::string text(kMaxTokenBytes + 1, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(file.fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error("cannot read " + where + ": " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > kMaxTokenBytes)
    throw std::runtime_error(where + " holds more than " + std::to_string(kMaxTokenBytes) +
                             " bytes; a token is one line");
  text.resize(got);
  text = text.substr(0, text.find('\n'));
  while (!text.empty() && std::strchr(" \t\r", text.back()) != nullptr) text.pop_back();
  if (text.empty())
    throw std::runtime_error(where + " is empty; write the token into it (e.g. openssl rand -hex 32 > FILE)");
  return text;
}

std::string server_token(const std::string& token_file) {
  if (!token_file.empty()) return read_token_file(token_file);
  const char* token = std::getenv(kTokenEnv);
  if (token == nullptr) return "";
  if (*token == '\0')
    throw std::runtime_error(std::string("the environment variable ") + kTokenEnv +
                             " is set but empty; set it to the token (e.g. export " + kTokenEnv +
                             "=$(openssl rand -hex 32)) or unset it");
  return token;
}

}  // namespace backplane::remote::server
