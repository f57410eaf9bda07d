// Distributed parameter registration: a runtime lookup of the device's
// `collective` capability, with the backend's configured fallback.
#include "internal.hpp"

#include <backplane/distributed.hpp>
#include <backplane/log.hpp>

namespace backplane {

Tensor set_distributed_params(const Tensor& tensor, DistributedParamId id) {
  if (!tensor.defined()) throw Error(Errc::invalid_argument, "set_distributed_params: undefined Tensor");
  detail::TensorImpl& t = *tensor.impl();
  detail::BackendImpl& backend = *t.storage->backend;
  const int32_t device = t.storage->device;

  if (backend.devices[static_cast<std::size_t>(device)].capabilities.has(Capability::collective)) {
    t.distributed = DistributedParams{id};
    return tensor;
  }

  const std::string where = "backend \"" + backend.name + "\", device " + backend.device_id(device);
  switch (backend.fallback.kind) {
    case CollectiveFallback::Kind::local:
      if (!backend.warned_local_fallback.exchange(true)) {
        log(LogLevel::warning, "set_distributed_params: " + where +
                                   " lacks the 'collective' capability; collective_fallback is \"local\", so its "
                                   "parameters train locally and their gradients are not synchronised across ranks");
      }
      return tensor;
    case CollectiveFallback::Kind::host:  // refused at config load in this version
    case CollectiveFallback::Kind::error:
      break;
  }
  throw Error(Errc::capability_missing,
              "set_distributed_params(param " + std::to_string(id.value) + "): " + where +
                  " lacks the 'collective' capability, so its gradients cannot be all-reduced. Remedies: put the "
                  "parameter on a device with 'collective' (`backplane list` shows capabilities), or set "
                  "\"collective_fallback\": \"local\" at " +
                  backend.config_entry + " in " + backend.config_source + " to train it without synchronisation");
}

std::optional<DistributedParams> distributed_params(const Tensor& tensor) {
  if (!tensor.defined()) return std::nullopt;
  return tensor.impl()->distributed;
}

bool is_distributed(const Tensor& tensor) { return distributed_params(tensor).has_value(); }

}  // namespace backplane
