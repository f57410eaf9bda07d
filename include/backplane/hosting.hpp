// For programs that forward ABI calls to a loaded backend on someone else's
// behalf (`backplane serve` hosts devices for remote clients): the plugin's
// table and instance behind a Backend. Everything the core would validate
// before a call is then the caller's to validate (abi.h, "Trust contract").
// Host applications use Tensor and Device instead; this header is the only
// host header besides plugin.hpp that includes abi.h.
//
// Thread-safety: as abi.h's "Threads" section says for each entry.
#ifndef BACKPLANE_HOSTING_HPP_
#define BACKPLANE_HOSTING_HPP_

#include <backplane/abi.h>
#include <backplane/export.hpp>
#include <backplane/registry.hpp>

namespace backplane {

struct HostedPlugin {
  // The plugin's table, zero-filled past the plugin's struct_size (so an entry
  // the plugin's minor lacks reads NULL). Valid while a Backend handle lives.
  const bp_plugin_api* api = nullptr;
  bp_plugin* plugin = nullptr;
};

// Throws Errc::backend_unavailable unless `backend` is loaded. Do not call
// destroy on the instance: the registry owns it.
BACKPLANE_API HostedPlugin hosted_plugin(const Backend& backend);

}  // namespace backplane

#endif  // BACKPLANE_HOSTING_HPP_
