// The server's token: from a file only its owner can read (--token-file) or
// from the BACKPLANE_REMOTE_TOKEN environment variable. The file rules are
// every secret file's (backplane_common/secret_file.hpp, docs/security.md).
#ifndef BACKPLANE_REMOTE_SERVER_TOKEN_HPP_
#define BACKPLANE_REMOTE_SERVER_TOKEN_HPP_

#include <string>

namespace backplane::remote::server {

// The environment variable `backplane serve` reads when --token-file is not given.
inline constexpr const char* kTokenEnv = "BACKPLANE_REMOTE_TOKEN";

// The token in `path`, by common::read_secret_file's rules. Throws
// common::SecretFileError (a std::runtime_error) saying what to fix.
std::string read_token_file(const std::string& path);

// --token-file when given, else BACKPLANE_REMOTE_TOKEN ("" when unset; set
// but empty is an error), else "" (no token).
std::string server_token(const std::string& token_file);

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_TOKEN_HPP_
