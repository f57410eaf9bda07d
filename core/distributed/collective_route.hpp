// Distributed's private type: where a device's collectives run.
#ifndef BACKPLANE_CORE_DISTRIBUTED_COLLECTIVE_ROUTE_HPP_
#define BACKPLANE_CORE_DISTRIBUTED_COLLECTIVE_ROUTE_HPP_

#include "registry/backend_impl.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace backplane::detail {

// Where collectives for a device run, per its capability and its backend's
// collective_fallback.
struct CollectiveRoute {
  enum class Kind { direct, local, staged };
  Kind kind;
  std::shared_ptr<BackendImpl> backend;  // direct/local: the device's own; staged: the host backend
  int32_t device;
};
// Throws Errc::capability_missing (fallback "error", or a host backend that
// lacks 'collective') or Errc::backend_unavailable; warns once per backend for
// "local". `caller` starts every message ("set_distributed_params(param 3)").
CollectiveRoute resolve_collective(const std::shared_ptr<BackendImpl>& backend, int32_t device,
                                   const std::string& caller);

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_DISTRIBUTED_COLLECTIVE_ROUTE_HPP_
