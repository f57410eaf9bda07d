// Gradient synchronisation inside backward (the contract is in
// <backplane/distributed.hpp>): a backward hook installed at load hands each
// final gradient of a registered parameter to a GradSync, which packs them into
// per-(device, dtype) buckets and all-reduces (mean) each full bucket
// through the job's process group for that device.
#ifndef BACKPLANE_CORE_GRAD_SYNC_HPP_
#define BACKPLANE_CORE_GRAD_SYNC_HPP_

#include <backplane/autograd.hpp>
#include <backplane/process_group.hpp>
#include <backplane/tensor.hpp>

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

namespace backplane::detail {

// One per backward(). Not thread-safe (a backward runs on one thread).
// From its first gradient on it holds the job's backward lock, so backwards
// that synchronise gradients run one at a time per process.
class GradSync {
 public:
  // `param` is registered (is_distributed); `gradient` is final and has the
  // param's shape, dtype and device. May reduce a full bucket right away.
  void add(const Tensor& param, const Tensor& gradient);
  // Reduces the partial buckets and puts every reduced gradient in `grads`.
  void finish(Gradients& grads);

 private:
  struct Bucket {
    ProcessGroup group;
    DType dtype = DType::f32;
    std::vector<std::pair<Tensor, Tensor>> items;  // (param, local gradient)
    std::size_t bytes = 0;
  };
  void flush(Bucket& bucket);
  void verify_layout(Bucket& bucket);

  std::unique_lock<std::mutex> backward_lock_;  // the job's backward_mutex, from the first gradient on
  std::vector<Bucket> open_;
  std::vector<std::pair<Tensor, Tensor>> reduced_;  // (param, reduced gradient)
};

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_GRAD_SYNC_HPP_
