// The (op, dtype) pairs and capabilities training needs, and the up-front
// check against a device. The list is derived from what the training path
// calls; keep it in step with core/nn.cpp and core/autograd_ops.cpp.
#include "common/internal.hpp"
#include "tensor/op_common.hpp"

#include <backplane/requirements.hpp>

#include <algorithm>
#include <string>

namespace backplane {

TrainingRequirements training_requirements(DType dtype) {
  constexpr DType kIndex = DType::i64;     // labels, argmax, one-hot positions
  constexpr DType kAccuracy = DType::f64;  // nn::accuracy counts hits in f64
  const std::vector<OpRequirement> all = {
      // Forward: nn::Linear, relu, nn::cross_entropy.
      {Op::rand_uniform, dtype, "nn::Linear initialisation"},
      {Op::matmul, dtype, "nn::Linear"},
      {Op::add, dtype, "nn::Linear bias, gradient accumulation, optimizers"},
      {Op::relu, dtype, "relu"},
      {Op::log_softmax, dtype, "nn::cross_entropy"},
      {Op::gather, dtype, "nn::cross_entropy"},
      {Op::mean, dtype, "nn::cross_entropy"},
      {Op::neg, dtype, "nn::cross_entropy and its backward"},
      // Backward (autograd_ops.cpp).
      {Op::sum, dtype, "backward of broadcasting, log_softmax and gather"},
      {Op::copy, dtype, "backward of mean and gather, gradient buckets, optimizers"},
      {Op::fill, dtype, "scalars and zeros (backward, optimizers)"},
      {Op::div, dtype, "backward of mean, Adam"},
      {Op::mul, dtype, "backward of log_softmax and gather, optimizers"},
      {Op::sub, dtype, "backward of log_softmax, optimizers"},
      {Op::exp, dtype, "backward of log_softmax"},
      {Op::gt, dtype, "backward of relu"},
      {Op::where, dtype, "backward of relu"},
      {Op::arange, kIndex, "backward of gather (one-hot)"},
      {Op::eq, kIndex, "backward of gather (one-hot), nn::accuracy"},
      {Op::cast, DType::bool_, "backward of gather (one-hot), nn::accuracy"},
      {Op::cast, dtype, "backward of gather (one-hot)"},
      {Op::sqrt, dtype, "Adam"},
      // Evaluation.
      {Op::argmax, dtype, "nn::accuracy"},
      {Op::cast, kAccuracy, "nn::accuracy"},
      {Op::sum, kAccuracy, "nn::accuracy"},
  };
  TrainingRequirements r;
  for (const OpRequirement& req : all) {
    const bool seen = std::any_of(r.ops.begin(), r.ops.end(), [&](const OpRequirement& o) {
      return o.op == req.op && o.dtype == req.dtype;
    });
    if (!seen) r.ops.push_back(req);  // e.g. training in f64 asks (sum, f64) once
  }
  for (DType d : {dtype, kIndex, DType::bool_, kAccuracy}) {
    const Capability c = capability_for(d);
    if (std::find(r.capabilities.begin(), r.capabilities.end(), c) == r.capabilities.end())
      r.capabilities.push_back(c);
  }
  r.capabilities.push_back(Capability::matmul);
  return r;
}

void require_training_support(const Device& device, DType dtype, int32_t world_size) {
  const auto& backend = detail::usable(device, "require_training_support");
  const int32_t index = device.index();
  const TrainingRequirements req = training_requirements(dtype);
  const Capabilities caps = device.capabilities();

  std::vector<std::string> flags;
  for (Capability c : req.capabilities)
    if (!caps.has(c)) flags.emplace_back(to_string(c));
  if (world_size > 1 && !caps.has(Capability::collective) &&
      backend->fallback.kind == CollectiveFallback::Kind::error)
    flags.emplace_back("collective");

  // Ops are asked only where the flags allow them: a missing dtype or
  // 'matmul' is already named above, and the host refuses those first.
  std::vector<std::string> ops;
  for (const OpRequirement& r : req.ops) {
    if (!caps.has(capability_for(r.dtype))) continue;
    if (r.op == Op::matmul && !caps.has(Capability::matmul)) continue;
    if (!backend->supports(index, static_cast<int32_t>(r.op), static_cast<int32_t>(r.dtype)))
      ops.push_back(std::string(to_string(r.op)) + " on " + std::string(to_string(r.dtype)) + " (" +
                    r.used_by + ")");
  }
  if (flags.empty() && ops.empty()) return;

  auto join = [](const std::vector<std::string>& v, const char* sep) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
    return out;
  };
  std::string msg = "device " + device.id() + " (\"" + device.name() + "\") of backend \"" + backend->name +
                    "\" cannot train in " + std::string(to_string(dtype));
  if (world_size > 1) msg += " with " + std::to_string(world_size) + " ranks";
  msg += ":";
  if (!flags.empty()) msg += "\n  missing capabilities: " + join(flags, ", ");
  if (!ops.empty()) msg += "\n  unsupported ops:\n    " + join(ops, "\n    ");
  msg += "\n  (`backplane list` shows each device's capabilities; train on a backend that has them";
  if (world_size > 1 && std::find(flags.begin(), flags.end(), "collective") != flags.end())
    msg += ", or set this backend's collective_fallback to \"local\" or \"host:<backend>\"";
  msg += ")";
  throw Error(flags.empty() ? Errc::unsupported_op : Errc::capability_missing, std::move(msg));
}

}  // namespace backplane
