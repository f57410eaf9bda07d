// The job's default rendezvous and per-device process groups, and the
// bucketed gradient all-reduce that backward() runs for registered
// parameters (see <backplane/distributed.hpp>).
#include "grad_sync.hpp"

#include "internal.hpp"

#include <backplane/distributed.hpp>
#include <backplane/ops.hpp>

#include <chrono>
#include <mutex>
#include <optional>

namespace backplane {

namespace {

struct Job {
  std::mutex mutex;
  std::optional<Rendezvous> rendezvous;
  GradSyncOptions options;
  // One group per device, in creation order (the same on every rank).
  std::vector<std::pair<Device, ProcessGroup>> groups;
  GradSyncStats stats;
};

Job& job() {
  static Job* j = new Job();  // never destroyed: groups must not close during static destruction
  return *j;
}

[[noreturn]] void not_initialised(const std::string& what) {
  throw Error(Errc::invalid_argument,
              what + ": no distributed job is initialised; call backplane::init_distributed(Rendezvous::from_env()) "
                     "(or Rendezvous::single_process() for one process) before training registered parameters");
}

}  // namespace

void init_distributed(const Rendezvous& rendezvous, const GradSyncOptions& options) {
  if (options.bucket_bytes == 0)
    throw Error(Errc::invalid_argument, "init_distributed: bucket_bytes must be positive");
  Job& j = job();
  std::lock_guard lock(j.mutex);
  if (j.rendezvous)
    throw Error(Errc::invalid_argument, "init_distributed: already initialised (rank " +
                                            std::to_string(j.rendezvous->rank()) + " of " +
                                            std::to_string(j.rendezvous->world_size()) +
                                            "); call shutdown_distributed() first to start another job");
  j.rendezvous = rendezvous;
  j.options = options;
}

bool distributed_initialized() noexcept {
  Job& j = job();
  std::lock_guard lock(j.mutex);
  return j.rendezvous.has_value();
}

void shutdown_distributed() {
  Job& j = job();
  std::vector<std::pair<Device, ProcessGroup>> groups;
  {
    std::lock_guard lock(j.mutex);
    groups.swap(j.groups);
    j.rendezvous.reset();
  }
  // The groups close here, outside the lock.
}

ProcessGroup distributed_group(const Device& device) {
  if (!device.valid()) throw Error(Errc::invalid_argument, "distributed_group: an invalid Device");
  Job& j = job();
  std::lock_guard lock(j.mutex);
  if (!j.rendezvous) not_initialised("distributed_group(" + device.id() + ")");
  for (const auto& [d, g] : j.groups)
    if (d == device) return g;
  // Blocks until every rank makes its group for this device.
  ProcessGroup g = ProcessGroup::create(device, *j.rendezvous);
  j.groups.emplace_back(device, g);
  return g;
}

GradSyncStats grad_sync_stats() noexcept {
  Job& j = job();
  std::lock_guard lock(j.mutex);
  return j.stats;
}

void reset_grad_sync_stats() noexcept {
  Job& j = job();
  std::lock_guard lock(j.mutex);
  j.stats = GradSyncStats{};
}

namespace detail {

void GradSync::add(const Tensor& param, const Tensor& gradient) {
  std::size_t bucket_bytes = 0;
  {
    Job& j = job();
    std::lock_guard lock(j.mutex);
    if (!j.rendezvous)
      not_initialised("backward: parameter " + std::to_string(distributed_params(param)->param_id.value) + " (" +
                      param.to_string() + ") is registered with set_distributed_params, but");
    bucket_bytes = j.options.bucket_bytes;
  }
  const Device device = gradient.device();
  Bucket* bucket = nullptr;
  for (Bucket& b : open_)
    if (b.group.device() == device && b.dtype == gradient.dtype()) bucket = &b;
  if (bucket == nullptr) {
    Bucket b;
    b.group = distributed_group(device);
    b.dtype = gradient.dtype();
    open_.push_back(std::move(b));
    bucket = &open_.back();
  }
  bucket->items.emplace_back(param, gradient);
  bucket->bytes += gradient.nbytes();
  if (bucket->bytes >= bucket_bytes) flush(*bucket);
}

void GradSync::flush(Bucket& bucket) {
  if (bucket.items.empty()) return;
  NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  // A fresh flat buffer: gradients may share storage with each other (add
  // hands one tensor to both operands), so none is reduced in place.
  std::vector<Tensor> flat_parts;
  flat_parts.reserve(bucket.items.size());
  for (const auto& [param, grad] : bucket.items) flat_parts.push_back(reshape(grad, {grad.numel()}));
  Tensor flat = flat_parts.size() == 1 ? contiguous(flat_parts[0]) : cat(flat_parts, 0);
  bucket.group.all_reduce_(flat, ReduceOp::mean);
  int64_t offset = 0;
  for (const auto& [param, grad] : bucket.items) {
    const int64_t n = grad.numel();
    std::vector<int64_t> dims;
    for (int i = 0; i < grad.rank(); ++i) dims.push_back(grad.shape()[i]);
    reduced_.emplace_back(param, reshape(slice(flat, 0, offset, offset + n), dims));
    offset += n;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    Job& j = job();
    std::lock_guard lock(j.mutex);
    j.stats.collectives += 1;
    j.stats.gradients += static_cast<int64_t>(bucket.items.size());
    j.stats.bytes += static_cast<int64_t>(bucket.bytes);
    j.stats.seconds += seconds;
  }
  bucket.items.clear();
  bucket.bytes = 0;
}

void GradSync::finish(Gradients& grads) {
  for (Bucket& b : open_) flush(b);
  for (auto& [param, grad] : reduced_) grads.set(param, std::move(grad));
  reduced_.clear();
}

}  // namespace detail
}  // namespace backplane
