// Finding, loading and validating one plugin library.
#ifndef BACKPLANE_CORE_LOADER_HPP_
#define BACKPLANE_CORE_LOADER_HPP_

#include "config/config.hpp"
#include "common/internal.hpp"

#include <string_view>
#include <utility>

namespace backplane::detail {

// Resolves a "library" value: an absolute path; else relative to the config
// file's folder; else each plugin_dirs entry; else each BACKPLANE_PLUGIN_PATH
// entry. A bare name `x` is tried as `x`, `libx.so` and `x.so` in each.
// Throws Errc::plugin_load_failed listing every location tried.
std::filesystem::path resolve_library(const std::string& spec, const Config& config);

// Loads, checks and creates the plugin for `b` (whose config fields are set)
// and enumerates its devices. Throws backplane::Error on any failure; `b`
// then holds whatever was learnt before it (e.g. the ABI version).
void load_backend(BackendImpl& b, const BackendConfig& entry, const Config& config);

// The Error for an exception that escaped plugin entry `entry` of `b` (to be
// called inside a catch): `code`, naming the backend, its library, the entry
// and the exception's type (and what() for a std::exception).
Error entry_threw(const BackendImpl& b, std::string_view entry, Errc code);

// Rethrows the current exception when it is the unwinding of a cancelled
// thread (abi::__forced_unwind), which must never be swallowed.
void rethrow_if_forced_unwind();

// Calls the plugin entry `fn`. abi.h forbids exceptions across the ABI, and
// plugin.hpp's wrappers keep that promise, but a C++ plugin can throw through
// an extern "C" entry that does not use them: any exception becomes
// backplane::Error(code) (entry_threw), so it fails only this backend at load
// (plugin_load_failed) or only this call afterwards (internal). A forced
// unwind (thread cancellation) passes through untouched.
template <class Fn, class... Args>
decltype(auto) call_entry(const BackendImpl& b, std::string_view entry, Errc code, Fn fn, Args&&... args) {
  try {
    return fn(std::forward<Args>(args)...);
  } catch (...) {
    rethrow_if_forced_unwind();
    throw entry_threw(b, entry, code);
  }
}

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_LOADER_HPP_
