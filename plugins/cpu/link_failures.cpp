// The failure messages of the collectives (see link_failures.hpp).
#include "link_failures.hpp"

namespace backplane::cpu {

std::string CallSite::text() const {
  return std::string(op) + " on rank " + std::to_string(rank) + " of " + std::to_string(size);
}

CommFailure aborted_failure(const std::string& where) {
  return {
      BP_STATUS_COLLECTIVE,
      where +
          ": aborted: comm_abort was called on this communicator (destroy it; make a new one to continue)"};
}

CommFailure timed_out_failure(const std::string& where, std::chrono::milliseconds waited,
                              std::chrono::milliseconds timeout, const std::string& who, bool receiving,
                              const char* op, const std::string& detail) {
  return {BP_STATUS_TIMEOUT, where + ": timed out after " + std::to_string(waited.count()) + " ms (timeout " +
                                 std::to_string(timeout.count()) + " ms) waiting for " + who +
                                 (receiving ? " to send its data" : " to receive our data") +
                                 " (is that rank still running, and did every rank call " + op +
                                 " with the same arguments in the same order?)" + detail};
}

CommFailure peer_lost_failure(const std::string& where, const std::string& who, const char* how,
                              const std::string& cause, const char* hint, const std::string& detail) {
  if (!cause.empty())
    return {BP_STATUS_COLLECTIVE,
            where + ": " + who + " " + how + " after failing itself: " + cause + detail};
  return {BP_STATUS_COLLECTIVE, where + ": " + who + " " + how + " (" + hint + ")" + detail};
}

CommFailure out_of_step_failure(const std::string& where, const std::string& who, const char* op,
                                const std::string& detail) {
  return {BP_STATUS_COLLECTIVE, where + ": the ranks are out of step with " + who + " (did every rank call " +
                                    op + " with the same arguments in the same order?)" + detail};
}

}  // namespace backplane::cpu
