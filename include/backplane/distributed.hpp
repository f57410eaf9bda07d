// Distributed (data-parallel) parameters. Registration is a runtime lookup of
// the tensor's device capability `collective`; without it, the backend's
// collective_fallback from backends.json decides (see README, "Configuration").
#ifndef BACKPLANE_DISTRIBUTED_HPP_
#define BACKPLANE_DISTRIBUTED_HPP_

#include <backplane/export.hpp>

#include <backplane/tensor.hpp>

#include <cstdint>
#include <optional>

namespace backplane {

// Identifies one parameter across all ranks of a process group: every rank
// registers the same parameter with the same id.
struct DistributedParamId {
  uint64_t value = 0;
  friend bool operator==(DistributedParamId, DistributedParamId) = default;
};

struct DistributedParams {
  DistributedParamId param_id;
};

// Marks `tensor` as a distributed parameter and returns it.
// - device has Capability::collective: registered.
// - otherwise, per the backend's collective_fallback:
//   "error" (default): throws Errc::capability_missing naming backend,
//     device, capability and the remedy;
//   "local": returns the tensor unregistered and logs a warning once per backend.
// Throws Errc::invalid_argument for an undefined tensor.
// Copies of a tensor share its registration (as they share its data). Like
// setting requires_grad in PyTorch, register parameters before other threads
// use them: registration is not synchronised with concurrent readers.
BACKPLANE_API Tensor set_distributed_params(const Tensor& tensor, DistributedParamId id);
BACKPLANE_API std::optional<DistributedParams> distributed_params(const Tensor& tensor);
BACKPLANE_API bool is_distributed(const Tensor& tensor);

}  // namespace backplane

#endif  // BACKPLANE_DISTRIBUTED_HPP_
