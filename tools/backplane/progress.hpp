// The progress board between `backplane launch` (or `train --nproc`) and its
// ranks: a small shared memory file (memfd) the launcher makes for each start
// of the job and hands to every rank as an inherited descriptor named by
// BACKPLANE_PROGRESS_FD. Each rank posts, in its own slot, the training step
// it reached and the step of the checkpoint it would resume from; the
// launcher reads them when a rank fails, to say where the job stood
// ("rank 1 was killed by signal 9 at step 812; resuming from step 800").
//
// Posting is two relaxed atomic stores into mapped memory: no system call,
// nothing on a training step's path that could fail or block. A program that
// never posts (any command under `backplane launch`) leaves its slots unknown.
#ifndef BACKPLANE_TOOLS_PROGRESS_HPP_
#define BACKPLANE_TOOLS_PROGRESS_HPP_

#include <backplane_common/unique_fd.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace backplane::cli {

inline constexpr const char* kProgressFdVariable = "BACKPLANE_PROGRESS_FD";

// One rank's slot: -1 while unknown.
struct ProgressSlot {
  std::atomic<int64_t> step;             // training steps done
  std::atomic<int64_t> checkpoint_step;  // the newest checkpoint's step (written or resumed from)
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "the board is shared between processes");

// The launcher's side: a board of `nproc` slots, all unknown.
class ProgressBoard {
 public:
  // Throws CommandError(kExitFailed) when the kernel refuses the memory.
  explicit ProgressBoard(int32_t nproc);
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  // The descriptor the ranks inherit (not close-on-exec).
  int fd() const noexcept { return fd_.get(); }
  std::optional<int64_t> step(int32_t rank) const noexcept;
  std::optional<int64_t> checkpoint_step(int32_t rank) const noexcept;

 private:
  common::UniqueFd fd_;
  ProgressSlot* slots_ = nullptr;
  std::size_t bytes_ = 0;
  int32_t nproc_ = 0;
};

// A rank's side: its slot on the board named by BACKPLANE_PROGRESS_FD and
// RANK, or nothing (every call does nothing) when there is no board, the
// variables are malformed, or the board is too small for this rank.
class ProgressReporter {
 public:
  static ProgressReporter from_env() noexcept;
  ProgressReporter() = default;
  ~ProgressReporter();
  ProgressReporter(ProgressReporter&& other) noexcept;
  ProgressReporter& operator=(ProgressReporter&& other) noexcept;

  void step(int64_t step) noexcept {
    if (slot_ != nullptr) slot_->step.store(step, std::memory_order_relaxed);
  }
  void checkpoint(int64_t step) noexcept {
    if (slot_ != nullptr) slot_->checkpoint_step.store(step, std::memory_order_relaxed);
  }

 private:
  void* map_ = nullptr;
  std::size_t bytes_ = 0;
  ProgressSlot* slot_ = nullptr;
};

}  // namespace backplane::cli

#endif  // BACKPLANE_TOOLS_PROGRESS_HPP_
