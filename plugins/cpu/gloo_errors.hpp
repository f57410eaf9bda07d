// What a Gloo exception means for a collective, decided by its type and by
// this plugin's own bookkeeping (the deadline, the abort flag), never by the
// wording of Gloo's message; plus the pieces of that message worth showing
// (the text without Gloo's source location, the peer addresses it names).
#ifndef BACKPLANE_PLUGINS_CPU_GLOO_ERRORS_HPP_
#define BACKPLANE_PLUGINS_CPU_GLOO_ERRORS_HPP_

#include <exception>
#include <string>
#include <vector>

namespace backplane::cpu {

enum class LinkError {
  aborted,    // comm_abort was called: whatever Gloo says is a consequence
  timed_out,  // the collective's deadline passed while waiting
  peer_lost,  // gloo::IoException: a connection failed or was closed
  mismatch,   // gloo::EnforceNotMet: Gloo's own invariant (the ranks disagree)
  misuse,     // gloo::InvalidOperationException: a call Gloo refuses
  other,      // anything else (a bug here or in Gloo)
};

// What the wait or post that threw should be reported as. `aborted` and
// `past_deadline` are this plugin's own state at the time of the throw: an
// abort or a passed deadline explains any error that follows it.
LinkError classify(const std::exception& e, bool aborted, bool past_deadline) noexcept;

// Gloo's message without its "[file:line] " prefix.
std::string gloo_text(const std::exception& e);

// "[10.0.0.5]:41234" (Gloo's form) -> "10.0.0.5:41234"; IPv6 keeps its brackets.
std::string display_address(const std::string& gloo_address);

// Every "[host]:port" in a Gloo message, in order, in Gloo's form.
std::vector<std::string> addresses_in(const std::string& text);

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_GLOO_ERRORS_HPP_
