// Distributed parameter registration and the collective fallback policy: a
// runtime lookup of the device's `collective` capability, then the backend's
// collective_fallback from backends.json. ProcessGroup::create uses the same
// resolution, so registration and groups can never disagree.
#include "distributed/collective_route.hpp"
#include "tensor/tensor_impl.hpp"

#include <backplane/distributed.hpp>
#include <backplane/log.hpp>

namespace backplane {
namespace detail {

CollectiveRoute resolve_collective(const std::shared_ptr<BackendImpl>& backend, int32_t device,
                                   const std::string& caller) {
  if (backend->devices[static_cast<std::size_t>(device)].capabilities.has(Capability::collective))
    return {CollectiveRoute::Kind::direct, backend, device};

  const std::string where = "backend \"" + backend->name + "\", device " + backend->device_id(device);
  const std::string at = backend->config_entry + " in " + backend->config_source;
  switch (backend->collective_fallback.kind) {
    case CollectiveFallback::Kind::local:
      if (!backend->warned_local_fallback.exchange(true)) {
        log(LogLevel::warning,
            caller + ": " + where +
                " lacks the 'collective' capability; collective_fallback is \"local\", so its "
                "tensors train locally and are not synchronised across ranks");
      }
      return {CollectiveRoute::Kind::local, backend, device};
    case CollectiveFallback::Kind::host: {
      const std::shared_ptr<BackendImpl>& host = backend->collective_host;
      const std::string via =
          "collective_fallback \"" + backend->collective_fallback.to_string() + "\" (" + at + ")";
      if (!host)
        throw Error(Errc::internal, caller + ": " + via + " was not resolved when the registry was built");
      if (!host->is_loaded())
        throw Error(Errc::backend_unavailable, caller + ": " + where + " lacks 'collective' and " + via +
                                                   " names backend \"" + host->name +
                                                   "\", which failed to load: " + host->error);
      if (host->devices.empty() || !host->devices[0].capabilities.has(Capability::collective))
        throw Error(
            Errc::capability_missing,
            caller + ": " + where + " lacks 'collective' and " + via + " stages through " +
                (host->devices.empty() ? "backend \"" + host->name + "\", which has no devices"
                                       : host->device_id(0) + ", which lacks it too") +
                ". Name a backend whose devices have 'collective' (`backplane list` shows capabilities)");
      return {CollectiveRoute::Kind::staged, host, 0};
    }
    case CollectiveFallback::Kind::error:
      break;
  }
  throw Error(
      Errc::capability_missing,
      caller + ": " + where +
          " lacks the 'collective' capability, so its tensors cannot be reduced across ranks. Remedies: put "
          "the tensor on a device with 'collective' (`backplane list` shows capabilities), or set "
          "\"collective_fallback\" at " +
          at +
          " to \"local\" (train it without synchronisation) or \"host:<backend>\" (stage it through a "
          "backend that has 'collective')");
}

}  // namespace detail

Tensor set_distributed_params(const Tensor& tensor, DistributedParamId id) {
  if (!tensor.defined()) throw Error(Errc::invalid_argument, "set_distributed_params: undefined Tensor");
  detail::TensorImpl& t = *detail::Access::impl(tensor);
  const detail::CollectiveRoute route = detail::resolve_collective(
      t.storage->home ? t.storage->home : t.storage->backend, t.storage->home_index(),
      "set_distributed_params(param " + std::to_string(id.value) + ")");
  if (route.kind != detail::CollectiveRoute::Kind::local) t.distributed = DistributedParams{id};
  return tensor;
}

std::optional<DistributedParams> distributed_params(const Tensor& tensor) {
  if (!tensor.defined()) return std::nullopt;
  return detail::Access::impl(tensor)->distributed;
}

bool is_distributed(const Tensor& tensor) { return distributed_params(tensor).has_value(); }

}  // namespace backplane
