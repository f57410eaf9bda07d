// What training needs of a device: the (op, dtype) pairs and capabilities
// that `backplane train` (nn::Linear, nn::cross_entropy, nn::accuracy,
// nn::SGD / nn::Adam and their backward passes) uses, so a plugin author can
// see up front what a backend must run, and a trainer can refuse a device
// before any rank starts instead of failing mid-epoch.
//
// With an op_fallback in force for the device's backend (registry.hpp:
// OpFallback), what the device lacks but the fallback device runs or holds
// is not refused: training_support() says what will fall back, and only
// what neither device can do is missing.
//
// Thread-safety: every function may be called from any thread.
#ifndef BACKPLANE_REQUIREMENTS_HPP_
#define BACKPLANE_REQUIREMENTS_HPP_

#include <backplane/export.hpp>

#include <backplane/capability.hpp>
#include <backplane/dtype.hpp>
#include <backplane/error.hpp>
#include <backplane/op.hpp>
#include <backplane/registry.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace backplane {

// One op on one dtype (the dtype Device::supports is asked with) and the
// part of training that uses it ("backward of relu"). Backend::
// op_fallback_stats() files an op under the same (op, dtype), except a
// cast, which it files under its source dtype (`with` here).
struct OpRequirement {
  Op op;
  DType dtype;
  const char* used_by;
  // Another dtype the op reads or gives (gather's i64 index, where's bool
  // condition, the bool result of gt, the source of a cast): a device runs
  // the op itself only when it also holds this dtype. nullopt: none.
  std::optional<DType> with = std::nullopt;
};

struct TrainingRequirements {
  // Flags every device needs: the dtype flags and 'matmul'. 'collective' is
  // not among them: see TrainingSetup::world_size.
  std::vector<Capability> capabilities;
  std::vector<OpRequirement> ops;  // each (op, dtype) once
};

// The optimizer a training run uses: only Adam needs sqrt.
enum class TrainingOptimizer {
  any,   // what either needs (the list of training_requirements(dtype))
  sgd,   // nn::SGD (with or without momentum)
  adam,  // nn::Adam
};

// What a run trains with.
struct TrainingSetup {
  DType dtype = DType::f32;  // parameters and activations
  TrainingOptimizer optimizer = TrainingOptimizer::any;
  // Ranks. Above 1 a device without 'collective' is refused when its
  // backend's collective_fallback is "error", or is "host:<backend>" naming
  // a backend that failed or whose device 0 lacks 'collective' ("local"
  // trains without it). One rank needs no collective at all.
  int32_t world_size = 1;
};

// What `backplane train` needs to train in `dtype` (parameters and
// activations), with i64 labels and an f64 accuracy; both optimizers.
BACKPLANE_API TrainingRequirements training_requirements(DType dtype = DType::f32);
// The same for one setup: with TrainingOptimizer::sgd, no (sqrt, dtype).
// (world_size does not change the list: 'collective' is checked apart.)
BACKPLANE_API TrainingRequirements training_requirements(const TrainingSetup& setup);

// What a device does with each requirement of a setup: nothing is listed
// that the device runs itself; what it lacks is either run (or held) on its
// backend's op_fallback device, or missing.
struct BACKPLANE_API TrainingSupport {
  std::string device;           // "small:0"
  std::string fallback_device;  // "cpu:0": device 0 of the op_fallback in force; "" without one
  // Neither the device nor its fallback device can: training is refused.
  // An op on a dtype whose flag the device lacks is listed here (and the
  // flag too) unless the fallback covers it. 'collective' is listed when
  // world_size > 1 needs it and collective_fallback does not cover it.
  std::vector<Capability> missing_capabilities;
  std::vector<OpRequirement> missing_ops;
  // The device lacks them and its fallback device runs or holds them: the
  // dtype flags whose tensors are held there, 'matmul' run there, and the
  // (op, dtype) pairs that run there.
  std::vector<Capability> fallback_capabilities;
  std::vector<OpRequirement> fallback_ops;
  // Why the device cannot train, as require_training_support throws it
  // ("" when ok()); error_code is Errc::capability_missing when a flag is
  // missing, else Errc::unsupported_op.
  std::string message;
  Errc error_code = Errc::unsupported_op;

  bool ok() const noexcept { return missing_capabilities.empty() && missing_ops.empty(); }
  bool falls_back() const noexcept { return !fallback_capabilities.empty() || !fallback_ops.empty(); }
  // One line saying what will run on the fallback device, "" when nothing,
  // with the pairs named as Backend::op_fallback_stats() will file them:
  // "op_fallback: 19 (op, dtype) pairs will run on cpu:0 for small:0:
  // add/f32, relu/f32, ..., cast/bool, ...; held there: i64, bool, f64 tensors".
  std::string fallback_summary() const;
};

// Checks `device` against training_requirements(setup) and its backend's
// op_fallback in force (Backend::op_fallback(): off under
// BACKPLANE_OP_FALLBACK=error), naming everything at once. Never throws for
// a missing requirement; Errc::invalid_argument for an invalid device,
// Errc::backend_unavailable for a backend that is not loaded.
BACKPLANE_API TrainingSupport training_support(const Device& device, const TrainingSetup& setup = {});

// Throws training_support(device, setup).message with its error_code
// unless it is ok(): everything neither the device nor its op_fallback can
// do, at once, including the ops on dtypes whose flag is missing.
BACKPLANE_API void require_training_support(const Device& device, const TrainingSetup& setup);
// The same with both optimizers: require_training_support(device,
// {dtype, TrainingOptimizer::any, world_size}).
BACKPLANE_API void require_training_support(const Device& device, DType dtype = DType::f32,
                                            int32_t world_size = 1);

}  // namespace backplane

#endif  // BACKPLANE_REQUIREMENTS_HPP_
