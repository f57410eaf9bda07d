// ProcessGroup: collectives across the ranks of a job, on one device per
// rank, dispatched through the ABI to the device's collective entries (Gloo
// on cpu, NCCL on cuda). Rendezvous (rendezvous.hpp) joins the ranks.
//
// Every rank must call the same collectives in the same order with the same
// shapes and dtypes (as in MPI, NCCL and c10d). Every collective obeys the
// group's timeout; a peer that dies or stalls makes every survivor throw
// backplane::Error (Errc::collective_error or Errc::timeout) naming it; that
// failure aborts the group (see abort()), except a refusal before anything
// moved (Errc::unsupported_op: the device cannot reduce that dtype), which is
// the same on every rank and leaves the group usable.
// A group serialises its own collectives; it may be used from any thread.
#ifndef BACKPLANE_PROCESS_GROUP_HPP_
#define BACKPLANE_PROCESS_GROUP_HPP_

#include <backplane/export.hpp>

#include <backplane/registry.hpp>
#include <backplane/rendezvous.hpp>
#include <backplane/tensor.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace backplane {

enum class ReduceOp { sum, mean, min, max, prod };
BACKPLANE_API const char* to_string(ReduceOp op) noexcept;

struct ProcessGroupOptions {
  // Overrides the Rendezvous timeout for this group's collectives.
  std::optional<std::chrono::milliseconds> timeout;
};

class BACKPLANE_API ProcessGroup {
 public:
  // Makes a group on `device` (every rank passes its own device) and
  // connects it with every other rank: blocks until all ranks arrive.
  // A device without Capability::collective follows its backend's
  // collective_fallback, as set_distributed_params does:
  //   "error" (default): throws Errc::capability_missing;
  //   "local": warns once and returns a group of one: rank 0 of world 1,
  //     collectives return their input, nothing is synchronised;
  //   "host:<backend>": the group runs on that backend's device 0 and each
  //     collective copies the tensor there and back.
  static ProcessGroup create(const Device& device, const Rendezvous& rendezvous,
                             const ProcessGroupOptions& options = {});

  ProcessGroup() = default;  // an invalid group; valid() is false
  bool valid() const noexcept { return impl_ != nullptr; }

  int32_t rank() const;
  int32_t world_size() const;
  // The device the collectives are issued for (the one given to create).
  Device device() const;
  // The device the collectives run on: device(), or the host:<backend>
  // staging device.
  Device collective_device() const;
  // True for a "local" fallback group (world of one, no synchronisation).
  bool is_local() const;
  std::chrono::milliseconds timeout() const;

  // The reduction over all ranks, elementwise. mean on integer dtypes
  // divides with truncation toward zero. Returns a new tensor.
  Tensor all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  // In place: `tensor` must be contiguous and own its storage region; used
  // by gradient buckets to avoid a copy.
  void all_reduce_(Tensor& tensor, ReduceOp op = ReduceOp::sum);
  // root's tensor on every rank (shapes and dtypes must agree).
  Tensor broadcast(const Tensor& tensor, int32_t root);
  // Every rank's tensor, concatenated along a new leading axis of size
  // world_size: shape [world_size, *tensor.shape].
  Tensor all_gather(const Tensor& tensor);
  // tensor's leading axis must be world_size; rank r receives the reduction
  // of slice [r] over all ranks: shape tensor.shape[1:].
  Tensor reduce_scatter(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  void barrier();

  // Into the caller's memory, for hosts that own their tensors (the PyTorch
  // bridge: torch's tensors, imported through DLPack, are written where they
  // are). Every output must be contiguous, on this group's device, of the
  // input's dtype. When its bytes are on the collective device the plugin
  // writes them directly; otherwise through a private copy, copied back.
  // broadcast_: root's tensor into `tensor` on every rank.
  void broadcast_(Tensor& tensor, int32_t root);
  // every rank's input back to back: output holds world_size x input.numel()
  // elements (any shape).
  void all_gather_into(const Tensor& input, Tensor& output);
  // input holds world_size x output.numel() elements; rank r receives the
  // reduction of block r over all ranks.
  void reduce_scatter_into(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::sum);

  // Interrupts the group: the plugin's comm_abort makes pending collectives
  // (on any thread, on every rank's communicator) fail promptly, and every
  // later collective on this group throws Errc::collective_error at once.
  // Thread-safe; idempotent. The group is also aborted by the first
  // collective that fails or times out, so survivors do not hang on it.
  void abort();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace backplane

#endif  // BACKPLANE_PROCESS_GROUP_HPP_
