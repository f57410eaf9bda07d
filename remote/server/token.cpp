// Reading the server's token from a private file or the environment.
#include "remote/server/token.hpp"

#include <backplane_common/secret_file.hpp>

#include <cstdlib>
#include <stdexcept>

namespace backplane::remote::server {

std::string read_token_file(const std::string& path) {
  return common::read_secret_file(path, "the token file (--token-file)");
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
