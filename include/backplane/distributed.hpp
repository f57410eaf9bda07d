// Distributed (data-parallel) parameters. Registration is a runtime lookup of
// the tensor's device capability `collective`; without it, the backend's
// collective_fallback from backends.json decides (see docs/configuration.md).
#ifndef BACKPLANE_DISTRIBUTED_HPP_
#define BACKPLANE_DISTRIBUTED_HPP_

#include <backplane/export.hpp>

#include <backplane/process_group.hpp>
#include <backplane/rendezvous.hpp>
#include <backplane/tensor.hpp>

#include <cstddef>
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
//   "local": returns the tensor unregistered and logs a warning once per backend;
//   "host:<backend>": registers the tensor; its gradient is staged through
//     that backend's device 0, which must have 'collective' (otherwise
//     throws Errc::backend_unavailable when it failed to load, or
//     Errc::capability_missing; both name the two backends).
// Throws Errc::invalid_argument for an undefined tensor.
// Copies of a tensor share its registration (as they share its data). Like
// setting requires_grad in PyTorch, register parameters before other threads
// use them: registration is not synchronised with concurrent readers.
BACKPLANE_API Tensor set_distributed_params(const Tensor& tensor, DistributedParamId id);
BACKPLANE_API std::optional<DistributedParams> distributed_params(const Tensor& tensor);
BACKPLANE_API bool is_distributed(const Tensor& tensor);

// ---- gradient synchronisation in backward --------------------------------
//
// After init_distributed(rendezvous), every Tensor::backward() all-reduces
// (mean over ranks) the gradient of each registered parameter as soon as it
// is final, in buckets: gradients are packed, in the order they become
// final, into one flat tensor per (device, dtype) until it holds
// bucket_bytes, which is then reduced with one collective. The last partial
// buckets are reduced when backward's graph is done. Every rank must run the
// same graph (the same model and ops; the data differ), as in PyTorch DDP.
// One ProcessGroup per device is made from the rendezvous the first time a
// gradient of that device needs it (ProcessGroup::create: blocks until every
// rank arrives; a device without 'collective' follows collective_fallback,
// so "host:<backend>" parameters are staged). On a backend with 'async' the
// collectives are queued on the device and overlap the rest of backward.
// BackwardOptions::on_gradient_final sees the local gradient;
// on_backward_end and the returned Gradients hold the reduced ones.
// Without init_distributed, backward() reaching a registered parameter throws
// Errc::invalid_argument saying so. The first time a bucket's layout (its
// parameter ids, sizes and dtype) is seen, the ranks check that they agree
// (two tiny collectives); ranks whose graphs differ get
// Errc::collective_error listing this rank's parameters instead of silently
// averaging unrelated gradients. Backwards that synchronise gradients run one
// at a time per process (a process-wide lock), so their collectives never
// interleave.
struct GradSyncOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;  // 25 MiB, as PyTorch DDP
};
BACKPLANE_API void init_distributed(const Rendezvous& rendezvous, const GradSyncOptions& options = {});
BACKPLANE_API bool distributed_initialized() noexcept;
// Drops the job's groups (their communicators close) and the rendezvous.
BACKPLANE_API void shutdown_distributed();
// The job's group for `device` (made on first use). Throws like above when
// init_distributed was not called.
BACKPLANE_API ProcessGroup distributed_group(const Device& device);

// Counters of the gradient synchronisation since the last reset, for
// reports: how much was reduced and the wall time spent in the collectives.
struct GradSyncStats {
  int64_t collectives = 0;  // bucket all-reduces issued
  int64_t gradients = 0;    // parameter gradients reduced
  int64_t bytes = 0;        // bytes reduced
  double seconds = 0;       // wall time in packing + all_reduce + unpacking
};
BACKPLANE_API GradSyncStats grad_sync_stats() noexcept;
BACKPLANE_API void reset_grad_sync_stats() noexcept;

}  // namespace backplane

#endif  // BACKPLANE_DISTRIBUTED_HPP_
