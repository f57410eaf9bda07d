// Statuses for C++ plugins: the concrete bp_status, Failure/fail() to return a
// chosen code, and guard(), which turns every exception into a status so that
// nothing a plugin throws crosses the C ABI.
#ifndef BACKPLANE_PLUGIN_STATUS_HPP_
#define BACKPLANE_PLUGIN_STATUS_HPP_

#include <backplane/abi.h>

#include <exception>
#include <new>
#include <string>
#include <utility>

// The plugin's concrete status type. Each plugin library has its own copy
// (built with hidden visibility); the host only sees the opaque pointer.
struct bp_status {
  int32_t code;
  std::string message;
  const char* fixed = nullptr;  // set only on the static out-of-memory fallback, never freed
};

namespace backplane::plugin {

// Thrown by plugin code to return a specific status code.
class Failure : public std::exception {
 public:
  Failure(bp_status_code code, std::string message) : code_(code), message_(std::move(message)) {}
  bp_status_code code() const noexcept { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  bp_status_code code_;
  std::string message_;
};

[[noreturn]] inline void fail(bp_status_code code, std::string message) {
  throw Failure(code, std::move(message));
}

// Never throws: a status that cannot be allocated degrades to a static one.
inline bp_status* make_status(int32_t code, const char* message) noexcept {
  try {
    return new bp_status{code, message};
  } catch (...) {
    // Built without allocating: its message is a literal.
    static bp_status oom{BP_STATUS_OUT_OF_MEMORY, std::string(), "out of memory while reporting an error"};
    return &oom;
  }
}

inline int32_t status_code(const bp_status* s) noexcept { return s->code; }
inline const char* status_message(const bp_status* s) noexcept {
  return s->fixed != nullptr ? s->fixed : s->message.c_str();
}
inline void status_free(bp_status* s) noexcept {
  if (s != nullptr && s->fixed == nullptr) delete s;
}

// Runs fn() and converts every exception into a status (NULL on success).
// Failure keeps its code; std::bad_alloc is OUT_OF_MEMORY; anything else is
// INTERNAL carrying what().
template <class Fn>
bp_status* guard(Fn&& fn) noexcept {
  try {
    fn();
    return nullptr;
  } catch (const Failure& e) {
    return make_status(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return make_status(BP_STATUS_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return make_status(BP_STATUS_INTERNAL, e.what());
  } catch (...) {
    return make_status(BP_STATUS_INTERNAL, "unknown exception inside plugin");
  }
}

}  // namespace backplane::plugin

#endif  // BACKPLANE_PLUGIN_STATUS_HPP_
