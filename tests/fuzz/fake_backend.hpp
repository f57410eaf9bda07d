// A backend for the fuzzer to host: one device of plain host memory that
// claims every capability, dtype and op. Its ops compute nothing; they touch
// the first and the last element every operand can address (inputs read,
// outputs written), so AddressSanitizer reports any view the server's
// validation let through that reaches outside its buffer.
#ifndef BACKPLANE_TESTS_FUZZ_FAKE_BACKEND_HPP_
#define BACKPLANE_TESTS_FUZZ_FAKE_BACKEND_HPP_

#include <backplane/abi.h>

#include <cstdint>

namespace fuzzfake {

// The table and one instance of the fake backend (never destroyed).
const bp_plugin_api* api();
bp_plugin* instance();
// Buffers and communicators alive now: zero once a session is released.
int64_t live_buffers();
int64_t live_comms();

}  // namespace fuzzfake

#endif  // BACKPLANE_TESTS_FUZZ_FAKE_BACKEND_HPP_
