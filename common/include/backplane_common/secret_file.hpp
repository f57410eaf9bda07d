// Reading a secret (the rendezvous store's job secret, the remote server's
// and client's token) from a file: one set of rules and one set of messages
// for every reader (docs/security.md).
#ifndef BACKPLANE_COMMON_SECRET_FILE_HPP_
#define BACKPLANE_COMMON_SECRET_FILE_HPP_

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace backplane::common {

inline constexpr std::size_t kMaxSecretFileBytes = 4096;

// Why a secret file was refused; what() names the file, says what is wrong
// and how to fix it.
class SecretFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The secret held in the file at `path`. `what` names the file in messages,
// with where its path came from: "the job secret file
// (BACKPLANE_JOB_TOKEN_FILE)". The file is opened without following a
// symbolic link and without blocking (a FIFO is refused, not waited on), and
// must be a regular file owned by this user (the effective uid) or root,
// with no permission bits for group or others (chmod 600 or stricter), of at
// most kMaxSecretFileBytes. One trailing "\n" or "\r\n" is dropped; the rest
// must be non-empty, hold no other line break ("\n", "\r") and no NUL, and
// neither begin nor end with a space or tab.
// Throws SecretFileError otherwise. Thread-safe.
std::string read_secret_file(const std::string& path, std::string_view what);

}  // namespace backplane::common

#endif  // BACKPLANE_COMMON_SECRET_FILE_HPP_
