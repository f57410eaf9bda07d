// The cuda plugin's communicators: NCCL, joined through the host's store
// (host/comm_setup.hpp) with a non-blocking init bounded by the timeout. Each
// collective is queued on the device's communication stream after an event of
// the compute stream (so it sees every earlier op), and the buffers it uses
// remember its completion event (so later compute work touching them waits,
// while other compute work overlaps it). The watchdog (host/watchdog.hpp)
// polls every queued collective; one that fails or outlives the timeout
// aborts the communicator and leaves a sticky error on the device naming the
// op and rank, so nothing ever hangs.
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_COLLECTIVES_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_COLLECTIVES_HPP_

#include <backplane/abi.h>

#include <memory>

#include "device.hpp"

namespace backplane::cuda {

class Communicator {
 public:
  // Joins the group (blocks until every rank joined or the timeout).
  static std::unique_ptr<Communicator> create(Device& device, const bp_comm_create_args& args);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  bp_comm* handle() noexcept { return reinterpret_cast<bp_comm*>(this); }
  // INVALID_ARGUMENT for NULL or a handle that is not a live communicator.
  static Communicator& from_handle(bp_comm* comm, const char* op);
  Device& device() noexcept;

  void all_reduce(const bp_tensor& in, const bp_tensor& out, int32_t reduce_op);
  void broadcast(const bp_tensor& tensor, int32_t root);
  void all_gather(const bp_tensor& in, const bp_tensor& out);
  void reduce_scatter(const bp_tensor& in, const bp_tensor& out, int32_t reduce_op);
  // Blocks until every rank reached it (or the watchdog aborted).
  void barrier();
  // Any thread, any time: aborts NCCL; every pending and later collective
  // fails with COLLECTIVE.
  void abort(const std::string& reason) noexcept;
  // Waits (bounded by the timeout) for queued collectives, then finalises.
  void destroy() noexcept;

  struct Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  uint64_t magic_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_COLLECTIVES_HPP_
