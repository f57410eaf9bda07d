// Finding, loading and validating one plugin library.
#ifndef BACKPLANE_CORE_LOADER_HPP_
#define BACKPLANE_CORE_LOADER_HPP_

#include "config/config.hpp"
#include "registry/backend_impl.hpp"

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

// call_entry, which guards every plugin entry call, is in registry/backend_impl.hpp.

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_LOADER_HPP_
