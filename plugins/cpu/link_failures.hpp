// A collective's failure and the messages both transports give for the same
// event (a timeout, a peer that closed or died, ranks out of step, an
// abort), so that an error reads the same whichever link carried the data.
// Built only on the failure path.
#ifndef BACKPLANE_PLUGINS_CPU_LINK_FAILURES_HPP_
#define BACKPLANE_PLUGINS_CPU_LINK_FAILURES_HPP_

#include <backplane/abi.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace backplane::cpu {

// A collective's failure: the status to return and poison the comm with.
struct CommFailure {
  bp_status_code code;
  std::string message;
};

// Where a collective runs, for its messages: "all_reduce on rank 0 of 2".
// Kept in parts, so that a collective that succeeds builds no string.
struct CallSite {
  const char* op;
  int32_t rank;
  int32_t size;
  std::string text() const;
};

// Every message starts with `where` ("all_reduce on rank 0 of 2"), names the
// peer as `who` ("peer rank 1 (10.0.0.5:41234)") and ends with `detail`
// (the transport's own words, e.g. " [gloo: ...]", or "").
[[nodiscard]] CommFailure aborted_failure(const std::string& where);
[[nodiscard]] CommFailure timed_out_failure(const std::string& where, std::chrono::milliseconds waited,
                                            std::chrono::milliseconds timeout, const std::string& who,
                                            bool receiving, const char* op, const std::string& detail);
// `how` the peer went ("closed the connection"); `cause`: what it published
// before it went ("" when nothing), else `hint` says what to look for.
[[nodiscard]] CommFailure peer_lost_failure(const std::string& where, const std::string& who, const char* how,
                                            const std::string& cause, const char* hint,
                                            const std::string& detail);
[[nodiscard]] CommFailure out_of_step_failure(const std::string& where, const std::string& who,
                                              const char* op, const std::string& detail);

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_LINK_FAILURES_HPP_
