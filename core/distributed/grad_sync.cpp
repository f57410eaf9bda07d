// The job's default rendezvous and per-device process groups, and the
// bucketed gradient all-reduce that backward() runs for registered
// parameters (see <backplane/distributed.hpp>), installed as backward hooks
// (add_backward_hooks in <backplane/autograd.hpp>).
#include "distributed/grad_sync.hpp"
#include "trace/recorder.hpp"
#include "trace/trace_format.hpp"

#include "distributed/collective_route.hpp"
#include "tensor/tensor_impl.hpp"

#include <backplane/distributed.hpp>
#include <backplane/ops.hpp>

#include <chrono>
#include <mutex>
#include <optional>
#include <set>

namespace backplane {

namespace {

struct Job {
  // Guards rendezvous, options and stats; never held while waiting on peers.
  std::mutex mutex;
  std::optional<Rendezvous> rendezvous;
  GradSyncOptions options;
  GradSyncStats stats;
  // Guards groups. Held while a group is made (which waits for every rank),
  // so groups are made one at a time and in the same order on every rank.
  std::mutex groups_mutex;
  std::vector<std::pair<Device, ProcessGroup>> groups;  // in creation order
  // Held by a backward that synchronises gradients, for its whole sweep: the
  // bucket collectives of two backwards must not interleave on one group.
  std::mutex backward_mutex;
  // Bucket layouts (hash of ids, sizes, dtype) every rank agreed on.
  std::set<uint64_t> verified_layouts;
};

Job& job() {
  static Job* j = new Job();  // never destroyed: groups must not close during static destruction
  return *j;
}

[[noreturn]] void not_initialised(const std::string& what) {
  throw Error(
      Errc::invalid_argument,
      what +
          ": no distributed job is initialised; call backplane::init_distributed(Rendezvous::from_env()) "
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
    std::lock_guard groups_lock(j.groups_mutex);
    std::lock_guard lock(j.mutex);
    groups.swap(j.groups);
    j.rendezvous.reset();
    j.verified_layouts.clear();
  }
  // The groups close here, outside the locks.
}

ProcessGroup distributed_group(const Device& device) {
  if (!device.valid()) throw Error(Errc::invalid_argument, "distributed_group: an invalid Device");
  Job& j = job();
  std::lock_guard groups_lock(j.groups_mutex);
  for (const auto& [d, g] : j.groups)
    if (d == device) return g;
  std::optional<Rendezvous> rendezvous;
  {
    std::lock_guard lock(j.mutex);
    rendezvous = j.rendezvous;
  }
  if (!rendezvous) not_initialised("distributed_group(" + device.id() + ")");
  // Blocks until every rank makes its group for this device (only group
  // creation waits on this lock; stats and the rest do not).
  ProcessGroup g = ProcessGroup::create(device, *rendezvous);
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
      not_initialised("backward: parameter " + std::to_string(distributed_params(param)->param_id.value) +
                      " (" + param.to_string() + ") is registered with set_distributed_params, but");
    bucket_bytes = j.options.bucket_bytes;
  }
  if (!backward_lock_.owns_lock()) backward_lock_ = std::unique_lock(job().backward_mutex);
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
  // A bucket's span: flattening, the all-reduce and the copy back, inside
  // backward's span (the bucket is full when the span starts).
  trace::detail::Span span(trace::detail::kCatDdp, "bucket");
  if (span.on()) [[unlikely]] {
    span.event().bytes = static_cast<int64_t>(bucket.bytes);
    span.event().count_key = "gradients";
    span.event().count = static_cast<int64_t>(bucket.items.size());
  }
  const auto t0 = std::chrono::steady_clock::now();
  // A fresh flat buffer: gradients may share storage with each other (add
  // hands one tensor to both operands), so none is reduced in place.
  verify_layout(bucket);
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

// Ranks that reach different parameters (a data-dependent branch, a
// parameter unused on one rank) would average unrelated gradients whenever
// the byte counts happen to match. The first time a bucket layout is seen,
// every rank compares a hash of its parameter ids, sizes and dtype: two tiny
// collectives once per layout, none in the steady state.
void GradSync::verify_layout(Bucket& bucket) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over (id, numel) pairs and the dtype
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ULL;
    }
  };
  mix(static_cast<uint64_t>(bucket.dtype));
  for (const auto& [param, grad] : bucket.items) {
    mix(distributed_params(param)->param_id.value);
    mix(static_cast<uint64_t>(grad.numel()));
  }
  Job& j = job();
  {
    std::lock_guard lock(j.mutex);
    if (j.verified_layouts.count(h) != 0) return;
  }
  // max(h) and max(-h) over ranks: equal hashes give max == min. The probe
  // travels in the bucket's dtype, which the device holds (it need not hold
  // i64): the hash in 8-bit pieces, exact in f32 and f64.
  bool agree = true;
  const Device device = bucket.group.device();
  if (bucket.dtype == DType::f32 || bucket.dtype == DType::f64) {
    std::vector<double> pieces(16);
    for (int i = 0; i < 8; ++i) {
      pieces[static_cast<std::size_t>(i)] = static_cast<double>((h >> (8 * i)) & 0xff);
      pieces[static_cast<std::size_t>(i + 8)] = -pieces[static_cast<std::size_t>(i)];
    }
    std::vector<double> r;
    if (bucket.dtype == DType::f32) {
      const std::vector<float> f(pieces.begin(), pieces.end());
      const std::vector<float> back =
          bucket.group.all_reduce(Tensor::from_vector<float>(device, {16}, f), ReduceOp::max)
              .to_vector<float>();
      r.assign(back.begin(), back.end());
    } else {
      r = bucket.group.all_reduce(Tensor::from_vector<double>(device, {16}, pieces), ReduceOp::max)
              .to_vector<double>();
    }
    for (std::size_t i = 0; i < 8; ++i) agree = agree && r[i] == -r[i + 8];
  } else {
    const auto signed_h = static_cast<int64_t>(h >> 1);
    Tensor probe = Tensor::from_vector<int64_t>(device, {2}, {signed_h, -signed_h});
    const std::vector<int64_t> r = bucket.group.all_reduce(probe, ReduceOp::max).to_vector<int64_t>();
    agree = r[0] == -r[1];
  }
  if (!agree) {
    std::string ids;
    for (const auto& [param, grad] : bucket.items)
      ids += (ids.empty() ? "" : ", ") + std::to_string(distributed_params(param)->param_id.value) + " (" +
             std::to_string(grad.numel()) + " elements)";
    throw Error(
        Errc::collective_error,
        "backward: the ranks disagree on which parameters' gradients to reduce together; this rank (" +
            std::to_string(bucket.group.rank()) + " of " + std::to_string(bucket.group.world_size()) +
            ") has, in order: " + ids +
            ". Every rank must run the same graph (the same parameters, used in the same order); a "
            "parameter that only some ranks use cannot be registered with set_distributed_params");
  }
  std::lock_guard lock(j.mutex);
  j.verified_layouts.insert(h);
}

void GradSync::finish(Gradients& grads) {
  for (Bucket& b : open_) flush(b);
  for (auto& [param, grad] : reduced_) grads.set(param, std::move(grad));
  reduced_.clear();
}

namespace {

// Installed when the library loads, through the public hooks every
// backward() runs: the final gradient of each registered parameter goes to
// this backward's GradSync, and the reduced ones replace the local ones at
// the end. The autograd engine itself knows nothing of distribution.
[[maybe_unused]] const uint64_t g_grad_sync_hooks = add_backward_hooks([] {
  auto sync = std::make_shared<GradSync>();
  return BackwardHooks{
      .on_gradient_final =
          [sync](const Tensor& param, Tensor& gradient) {
            if (detail::Access::impl(param)->distributed) sync->add(param, gradient);
          },
      .on_backward_end = [sync](Gradients& grads) { sync->finish(grads); },
  };
});

}  // namespace
}  // namespace detail
}  // namespace backplane
