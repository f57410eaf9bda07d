// How the cpu plugin's collectives read Gloo's exceptions (cpu/gloo_errors.hpp):
// by their type and the plugin's own abort flag and deadline, never by the
// words in the message; and the addresses a message names.
#include <doctest/doctest.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/gloo_errors.hpp"

using namespace backplane::cpu;

TEST_CASE("gloo_errors: each Gloo exception type has its meaning") {
  CHECK(classify(gloo::IoException("[pair.cc:1] Read error [127.0.0.1]:5: Connection reset by peer"), false,
                 false) == LinkError::peer_lost);
  CHECK(classify(gloo::EnforceNotMet("pair.cc", 1, "nbytes == op.nbytes", "size mismatch"), false, false) ==
        LinkError::mismatch);
  CHECK(classify(gloo::InvalidOperationException("bad call"), false, false) == LinkError::misuse);
  CHECK(classify(gloo::Exception("something"), false, false) == LinkError::other);
  CHECK(classify(std::runtime_error("not Gloo's"), false, false) == LinkError::other);
}

TEST_CASE("gloo_errors: the deadline, not the wording, makes a timeout") {
  // Gloo words its timeouts "Timed out ..." but throws the same IoException as
  // for a lost peer: only the clock tells them apart.
  const gloo::IoException timeout_words("[unbound_buffer.cc:1] Timed out waiting 1000ms for recv operation");
  CHECK(classify(timeout_words, false, false) == LinkError::peer_lost);
  CHECK(classify(timeout_words, false, true) == LinkError::timed_out);
  const gloo::IoException closed("[pair.cc:1] Connection closed by peer [127.0.0.1]:41234");
  CHECK(classify(closed, false, true) == LinkError::timed_out);
}

TEST_CASE("gloo_errors: after an abort every error is the abort's consequence") {
  CHECK(classify(gloo::IoException("Connection closed by peer"), true, false) == LinkError::aborted);
  CHECK(classify(gloo::IoException("Timed out"), true, true) == LinkError::aborted);
  CHECK(classify(gloo::EnforceNotMet("f", 1, "c", "m"), true, false) == LinkError::aborted);
}

TEST_CASE("gloo_errors: the text drops Gloo's source location and the addresses are found") {
  CHECK(gloo_text(gloo::IoException(
            "[gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.5]:41234")) ==
        "Connection closed by peer [10.0.0.5]:41234");
  CHECK(gloo_text(std::runtime_error("[not a location] x")) == "[not a location] x");
  const std::vector<std::string> found = addresses_in("from [10.0.0.5]:41234 to [::1]:80, not [x] or [y]:");
  REQUIRE(found.size() == 2);
  CHECK(found[0] == "[10.0.0.5]:41234");
  CHECK(found[1] == "[::1]:80");
  CHECK(display_address("[10.0.0.5]:41234") == "10.0.0.5:41234");
  CHECK(display_address("[::1]:80") == "[::1]:80");
}
