// backplane::Error: the one exception type of the C++ API, with a typed code.
// Messages name what failed, where, why, and what to do about it.
// Thread-safety: immutable after construction.
#ifndef BACKPLANE_ERROR_HPP_
#define BACKPLANE_ERROR_HPP_

#include <backplane/export.hpp>

#include <exception>
#include <string>
#include <string_view>

namespace backplane {

enum class Errc {
  invalid_argument = 1,  // a bad value passed to the API
  config_error,          // backends.json cannot be read, parsed or validated
  not_found,             // no such backend or device (a missing config file is config_error)
  plugin_load_failed,    // dlopen, entry symbol, create() or enumeration failed
  abi_mismatch,          // the plugin was built against another ABI major / a bad table
  backend_unavailable,   // the backend is configured but failed to load
  capability_missing,    // the device lacks a capability the call needs
  unsupported_op,        // the device cannot run this op on this dtype
  shape_mismatch,
  dtype_mismatch,
  device_mismatch,  // operands live on different devices
  out_of_memory,
  device_error,  // the plugin or device reported a fault
  timeout,
  collective_error,  // a peer failed or vanished
  io_error,
  internal,  // a bug: please report it
};

// "capability_missing", ... (stable; used in logs and JSON output)
BACKPLANE_API const char* to_string(Errc code) noexcept;

class BACKPLANE_API Error : public std::exception {
 public:
  Error(Errc code, std::string message);
  Errc code() const noexcept { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }
  const std::string& message() const noexcept { return message_; }

 private:
  Errc code_;
  std::string message_;
};

}  // namespace backplane

#endif  // BACKPLANE_ERROR_HPP_
