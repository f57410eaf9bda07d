// What training needs of a device: the (op, dtype) pairs and capabilities
// that `backplane train` (nn::Linear, nn::cross_entropy, nn::accuracy,
// nn::SGD / nn::Adam and their backward passes) uses, so a plugin author can
// see up front what a backend must run, and a trainer can refuse a device
// before any rank starts instead of failing mid-epoch.
//
// Thread-safety: both functions may be called from any thread.
#ifndef BACKPLANE_REQUIREMENTS_HPP_
#define BACKPLANE_REQUIREMENTS_HPP_

#include <backplane/export.hpp>

#include <backplane/capability.hpp>
#include <backplane/dtype.hpp>
#include <backplane/op.hpp>
#include <backplane/registry.hpp>

#include <cstdint>
#include <vector>

namespace backplane {

// One op on one dtype (the dtype Device::supports is asked with) and the
// part of training that uses it ("backward of relu").
struct OpRequirement {
  Op op;
  DType dtype;
  const char* used_by;
};

struct TrainingRequirements {
  // Flags every device needs: the dtype flags and 'matmul'. 'collective' is
  // not among them: see require_training_support.
  std::vector<Capability> capabilities;
  std::vector<OpRequirement> ops;  // each (op, dtype) once
};

// What `backplane train` needs to train in `dtype` (parameters and
// activations), with i64 labels and an f64 accuracy; both optimizers.
BACKPLANE_API TrainingRequirements training_requirements(DType dtype = DType::f32);

// Throws unless `device` meets training_requirements(dtype), naming
// everything missing at once: Errc::capability_missing when a flag is
// missing (the ops of a missing dtype are not asked), else
// Errc::unsupported_op listing each (op, dtype) the device does not run.
// With world_size > 1 a device without 'collective' is also refused when
// its backend's collective_fallback is "error" (local and host:<backend>
// train without it). Errc::invalid_argument for an invalid device.
BACKPLANE_API void require_training_support(const Device& device, DType dtype = DType::f32,
                                            int32_t world_size = 1);

}  // namespace backplane

#endif  // BACKPLANE_REQUIREMENTS_HPP_
