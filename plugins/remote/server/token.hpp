// The server's token: from a file only its owner can read (--token-file) or
// from the BACKPLANE_REMOTE_TOKEN environment variable. The file rules are the
// rendezvous store's for its secret file (docs/security.md).
#ifndef BACKPLANE_REMOTE_SERVER_TOKEN_HPP_
#define BACKPLANE_REMOTE_SERVER_TOKEN_HPP_

#include <string>

namespace backplane::remote::server {

// The environment variable `backplane serve` reads when --token-file is not given.
inline constexpr const char* kTokenEnv = "BACKPLANE_REMOTE_TOKEN";

// The first line of `path`, trailing whitespace dropped. Throws
// std::runtime_error saying what to fix unless the file is a regular file
// owned by this user (or root) that no one else may read or write, of at most
// 4096 bytes, whose first line is not empty.
std::string read_token_file(const std::string& path);

// --token-file when given, else BACKPLANE_REMOTE_TOKEN ("" when unset; set
// but empty is an error), else "" (no token).
std::string server_token(const std::string& token_file);

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_TOKEN_HPP_
