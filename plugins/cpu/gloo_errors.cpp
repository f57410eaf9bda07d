// Classification of Gloo's exceptions (see gloo_errors.hpp).
#include "gloo_errors.hpp"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

namespace backplane::cpu {

LinkError classify(const std::exception& e, bool aborted, bool past_deadline) noexcept {
  if (aborted) return LinkError::aborted;
  // Gloo reports its own timeouts as IoExceptions too; only the clock tells
  // them apart from a lost peer. Every wait is given the time left before
  // the collective's deadline, so a Gloo timeout always leaves it passed.
  if (past_deadline) return LinkError::timed_out;
  if (dynamic_cast<const gloo::IoException*>(&e) != nullptr) return LinkError::peer_lost;
  if (dynamic_cast<const gloo::InvalidOperationException*>(&e) != nullptr) return LinkError::misuse;
  if (dynamic_cast<const gloo::EnforceNotMet*>(&e) != nullptr) return LinkError::mismatch;
  return LinkError::other;
}

std::string gloo_text(const std::exception& e) {
  std::string text = e.what();
  if (text.size() > 2 && text[0] == '[') {
    const auto close = text.find("] ");
    if (close != std::string::npos && text.find(':') < close) text.erase(0, close + 2);
  }
  return text;
}

std::string display_address(const std::string& gloo_address) {
  if (gloo_address.size() > 2 && gloo_address[0] == '[') {
    const auto close = gloo_address.find(']');
    if (close != std::string::npos) {
      const std::string host = gloo_address.substr(1, close - 1);
      if (host.find(':') == std::string::npos) return host + gloo_address.substr(close + 1);
    }
  }
  return gloo_address;
}

std::vector<std::string> addresses_in(const std::string& text) {
  std::vector<std::string> found;
  for (std::size_t open = text.find('['); open != std::string::npos; open = text.find('[', open + 1)) {
    const auto close = text.find(']', open);
    if (close == std::string::npos || close + 2 >= text.size() || text[close + 1] != ':') continue;
    std::size_t end = close + 2;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end > close + 2) found.push_back(text.substr(open, end - open));
  }
  return found;
}

}  // namespace backplane::cpu
