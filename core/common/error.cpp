// backplane::Error and the names of its codes.
#include <backplane/error.hpp>

namespace backplane {

const char* to_string(Errc code) noexcept {
  switch (code) {
    case Errc::invalid_argument:
      return "invalid_argument";
    case Errc::config_error:
      return "config_error";
    case Errc::not_found:
      return "not_found";
    case Errc::plugin_load_failed:
      return "plugin_load_failed";
    case Errc::abi_mismatch:
      return "abi_mismatch";
    case Errc::backend_unavailable:
      return "backend_unavailable";
    case Errc::capability_missing:
      return "capability_missing";
    case Errc::unsupported_op:
      return "unsupported_op";
    case Errc::shape_mismatch:
      return "shape_mismatch";
    case Errc::dtype_mismatch:
      return "dtype_mismatch";
    case Errc::device_mismatch:
      return "device_mismatch";
    case Errc::out_of_memory:
      return "out_of_memory";
    case Errc::device_error:
      return "device_error";
    case Errc::timeout:
      return "timeout";
    case Errc::collective_error:
      return "collective_error";
    case Errc::io_error:
      return "io_error";
    case Errc::internal:
      return "internal";
  }
  return "unknown";
}

Error::Error(Errc code, std::string message) : code_(code), message_(std::move(message)) {}

}  // namespace backplane
