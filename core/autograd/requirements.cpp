// The (op, dtype) pairs and capabilities training needs, and the up-front
// check against a device and its op_fallback. The list is derived from what
// the training path calls; keep it in step with core/autograd/nn.cpp and
// core/autograd/autograd_ops.cpp. Whether the device (or its op_fallback)
// runs a pair is placement's one rule (detail::lacks and
// detail::op_fallback_host in core/tensor/placement.hpp), asked here as
// dispatch asks it.
#include "registry/backend_impl.hpp"
#include "tensor/op_common.hpp"
#include "tensor/placement.hpp"

#include <backplane/requirements.hpp>

#include <algorithm>
#include <string>

namespace backplane {

TrainingRequirements training_requirements(DType dtype) {
  return training_requirements(TrainingSetup{dtype});
}

TrainingRequirements training_requirements(const TrainingSetup& setup) {
  const DType dtype = setup.dtype;
  const bool adam = setup.optimizer != TrainingOptimizer::sgd;
  constexpr DType kIndex = DType::i64;     // labels, argmax, one-hot positions
  constexpr DType kBool = DType::bool_;    // comparisons
  constexpr DType kAccuracy = DType::f64;  // nn::accuracy counts hits in f64
  std::vector<OpRequirement> all = {
      // Forward: nn::Linear, relu, nn::cross_entropy.
      {Op::rand_uniform, dtype, "nn::Linear initialisation"},
      {Op::matmul, dtype, "nn::Linear"},
      {Op::add, dtype, "nn::Linear bias, gradient accumulation, optimizers"},
      {Op::relu, dtype, "relu"},
      {Op::log_softmax, dtype, "nn::cross_entropy"},
      {Op::gather, dtype, "nn::cross_entropy", kIndex},
      {Op::mean, dtype, "nn::cross_entropy"},
      {Op::neg, dtype, "nn::cross_entropy and its backward"},
      // Backward (autograd_ops.cpp).
      {Op::sum, dtype, "backward of broadcasting, log_softmax and gather"},
      {Op::copy, dtype, "backward of mean and gather, gradient buckets, optimizers"},
      {Op::fill, dtype, "scalars and zeros (backward, optimizers)"},
      {Op::div, dtype, adam ? "backward of mean, Adam" : "backward of mean"},
      {Op::mul, dtype, "backward of log_softmax and gather, optimizers"},
      {Op::sub, dtype, "backward of log_softmax"},
      {Op::exp, dtype, "backward of log_softmax"},
      {Op::gt, dtype, "backward of relu", kBool},
      {Op::where, dtype, "backward of relu", kBool},
      {Op::arange, kIndex, "backward of gather (one-hot)"},
      {Op::eq, kIndex, "backward of gather (one-hot), nn::accuracy", kBool},
      {Op::cast, kBool, "backward of gather (one-hot), nn::accuracy"},
      {Op::cast, dtype, "backward of gather (one-hot)", kBool},
  };
  if (adam) all.push_back({Op::sqrt, dtype, "Adam"});
  // Evaluation.
  all.push_back({Op::argmax, dtype, "nn::accuracy", kIndex});
  all.push_back({Op::cast, kAccuracy, "nn::accuracy", kBool});
  all.push_back({Op::sum, kAccuracy, "nn::accuracy"});

  TrainingRequirements r;
  for (OpRequirement& req : all) {
    if (req.with == req.dtype) req.with.reset();  // e.g. training in bool would ask it twice
    const bool seen = std::any_of(r.ops.begin(), r.ops.end(), [&](const OpRequirement& o) {
      return o.op == req.op && o.dtype == req.dtype;
    });
    if (!seen) r.ops.push_back(req);  // e.g. training in f64 asks (sum, f64) once
  }
  for (DType d : {dtype, kIndex, kBool, kAccuracy}) {
    const Capability c = capability_for(d);
    if (std::find(r.capabilities.begin(), r.capabilities.end(), c) == r.capabilities.end())
      r.capabilities.push_back(c);
  }
  r.capabilities.push_back(Capability::matmul);
  return r;
}

namespace {

using detail::BackendImpl;

// Why device d of b does not run r itself ("" when it does), by
// placement's one rule: the flags it lacks for r, and "not supported" when
// supports_op says no.
std::string lacks(BackendImpl& b, int32_t d, const OpRequirement& r) {
  return detail::lacks(b, d, static_cast<int32_t>(r.op), r.dtype, r.with.value_or(r.dtype)).text();
}

bool has_flag(const BackendImpl& b, int32_t d, Capability c) {
  return b.is_loaded() && d >= 0 && static_cast<std::size_t>(d) < b.devices.size() && b.has(d, c);
}

// "add/f32", as Backend::op_fallback_stats() files it: a cast under its
// source dtype (the other end of bool -> f32 is filed as cast/bool).
std::string pair_name(const OpRequirement& r) {
  const DType d = r.op == Op::cast && r.with ? *r.with : r.dtype;
  return std::string(to_string(r.op)) + "/" + std::string(to_string(d));
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// The pairs as op_fallback_stats() will file them, each once.
std::vector<std::string> pair_names(const std::vector<OpRequirement>& ops) {
  std::vector<std::string> pairs;
  for (const OpRequirement& r : ops)
    if (std::find(pairs.begin(), pairs.end(), pair_name(r)) == pairs.end()) pairs.push_back(pair_name(r));
  return pairs;
}

}  // namespace

std::string TrainingSupport::fallback_summary() const {
  if (!falls_back()) return "";
  const std::vector<std::string> pairs = pair_names(fallback_ops);
  std::vector<std::string> held;
  for (Capability c : fallback_capabilities)
    if (c != Capability::matmul) held.emplace_back(to_string(c));
  std::string line = "op_fallback: " + std::to_string(pairs.size()) + " (op, dtype) pair" +
                     (pairs.size() == 1 ? "" : "s") + " will run on " + fallback_device + " for " + device;
  if (!pairs.empty()) line += ": " + join(pairs, ", ");
  if (!held.empty()) line += "; held there: " + join(held, ", ") + " tensors";
  return line;
}

TrainingSupport training_support(const Device& device, const TrainingSetup& setup) {
  const std::shared_ptr<BackendImpl>& backend = detail::usable(device, "training_support");
  BackendImpl& b = *backend;
  const int32_t index = device.index();
  const TrainingRequirements req = training_requirements(setup);
  const OpFallback configured = b.op_fallback.configured();
  const std::shared_ptr<BackendImpl> host = detail::op_fallback_host(b);

  TrainingSupport s;
  s.device = device.id();
  if (host) s.fallback_device = host->device_id(0);

  for (Capability c : req.capabilities) {
    if (b.has(index, c)) continue;
    (host && host->has(0, c) ? s.fallback_capabilities : s.missing_capabilities).push_back(c);
  }
  // 'collective' is no op: op_fallback never covers it; collective_fallback does.
  std::string collective_note;
  if (setup.world_size > 1 && !b.has(index, Capability::collective)) {
    switch (b.collective_fallback.kind) {
      case CollectiveFallback::Kind::local:
        break;
      case CollectiveFallback::Kind::host: {
        const std::shared_ptr<BackendImpl>& h = b.collective_host;
        if (!h || !h->is_loaded())
          collective_note = "its collective_fallback \"" + b.collective_fallback.to_string() +
                            "\" names backend \"" + (h ? h->name : b.collective_fallback.host_backend) +
                            "\", which " +
                            (h ? "failed to load: " + h->error : std::string("was not resolved"));
        else if (h->devices.empty() || !has_flag(*h, 0, Capability::collective))
          collective_note = "its collective_fallback \"" + b.collective_fallback.to_string() +
                            "\" stages through " +
                            (h->devices.empty() ? "backend \"" + h->name + "\", which has no devices"
                                                : h->device_id(0) + ", which lacks 'collective' too");
        if (!collective_note.empty()) s.missing_capabilities.push_back(Capability::collective);
        break;
      }
      case CollectiveFallback::Kind::error:
        s.missing_capabilities.push_back(Capability::collective);
        break;
    }
  }

  // Every (op, dtype), also those on a dtype whose flag is missing: the
  // device cannot run them either, and a fallback may.
  std::vector<std::string> missing_lines;
  for (const OpRequirement& r : req.ops) {
    const std::string why = lacks(b, index, r);
    if (why.empty()) continue;
    if (host && lacks(*host, 0, r).empty()) {
      s.fallback_ops.push_back(r);
      continue;
    }
    s.missing_ops.push_back(r);
    std::string line =
        std::string(to_string(r.op)) + " on " + std::string(to_string(r.dtype)) + " (" + r.used_by;
    if (why != "not supported") line += "; " + why;
    missing_lines.push_back(line + ")");
  }
  if (s.ok()) return s;

  const bool collective_missing = std::find(s.missing_capabilities.begin(), s.missing_capabilities.end(),
                                            Capability::collective) != s.missing_capabilities.end();
  std::vector<std::string> flags;
  for (Capability c : s.missing_capabilities) flags.emplace_back(to_string(c));
  std::string msg = "device " + device.id() + " (\"" + device.name() + "\") of backend \"" + b.name +
                    "\" cannot train in " + std::string(to_string(setup.dtype));
  if (setup.world_size > 1) msg += " with " + std::to_string(setup.world_size) + " ranks";
  msg += ":";
  if (!flags.empty()) msg += "\n  missing capabilities: " + join(flags, ", ");
  if (!missing_lines.empty()) msg += "\n  unsupported ops:\n    " + join(missing_lines, "\n    ");
  if (!collective_note.empty()) msg += "\n  " + collective_note;
  const bool beyond_collective = !s.missing_ops.empty() || flags.size() > (collective_missing ? 1u : 0u);
  if (host && beyond_collective)
    msg += "\n  its op_fallback \"" + configured.to_string() + "\" (" + b.config_entry + ") runs " +
           std::to_string(pair_names(s.fallback_ops).size()) + " other (op, dtype) pairs on " +
           s.fallback_device + ", which lacks these too";
  msg += "\n  (`backplane list` shows each device's capabilities; train on a backend that has them";
  if (beyond_collective && !host) {
    if (const char* off = detail::op_fallback_off_reason(); configured.kind == OpFallback::Kind::host && off)
      msg += "; its op_fallback \"" + configured.to_string() + "\" is off while " + off;
    else if (configured.kind == OpFallback::Kind::host)
      msg += "; its op_fallback \"" + configured.to_string() + "\" names a backend that is not loaded";
    else if (b.config_backends > 1)
      msg += ", or set \"op_fallback\": \"host:<backend>\" at " + b.config_entry + " in " + b.config_source +
             " to run what it lacks on another backend's device";
    else  // no other backend to name: say what to add
      msg += ", or add a backend that runs them (\"cpu\", library \"backplane_cpu\") to " + b.config_source +
             " and set \"op_fallback\": \"host:cpu\" at " + b.config_entry +
             " to run what this one lacks there";
  }
  if (collective_missing)
    msg +=
        ", or set this backend's collective_fallback to \"local\" or \"host:<backend>\" (a backend with "
        "'collective')";
  msg += ")";
  s.message = std::move(msg);
  s.error_code = flags.empty() ? Errc::unsupported_op : Errc::capability_missing;
  return s;
}

void require_training_support(const Device& device, const TrainingSetup& setup) {
  TrainingSupport s = training_support(device, setup);
  if (!s.ok()) throw Error(s.error_code, std::move(s.message));
}

void require_training_support(const Device& device, DType dtype, int32_t world_size) {
  require_training_support(device, TrainingSetup{dtype, TrainingOptimizer::any, world_size});
}

}  // namespace backplane
