// A backend's op_fallback as placement keeps it: the policy, its resolved
// target and the fallback report's counters. Owned by placement
// (core/tensor/placement.cpp is the one reader of the target and writer of
// the counters); BackendImpl holds one. Not to be confused with the
// collective fallback (BackendImpl::collective_fallback), which stages
// collectives, not ops.
#ifndef BACKPLANE_CORE_TENSOR_OP_FALLBACK_STATE_HPP_
#define BACKPLANE_CORE_TENSOR_OP_FALLBACK_STATE_HPP_

#include <backplane/abi.h>
#include <backplane/registry.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

namespace backplane::detail {

struct BackendImpl;

// Thread-safe: the policy and target change under the state's own lock; the
// op slow path reads whether a target is set without it, and the counters
// are atomics.
class OpFallbackState {
 public:
  // The report: one slot per (op, dtype).
  struct Counter {
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> bytes_to_host{0};
    std::atomic<uint64_t> bytes_from_host{0};
    std::atomic<uint64_t> timed_calls{0};        // the calls whose time was taken (a sample)
    std::atomic<uint64_t> timed_nanoseconds{0};  // their time
    std::atomic<uint64_t> copy_nanoseconds{0};   // time in copies back home (every one timed)
    std::atomic<bool> logged{false};             // the first fallback of the pair is logged once
    // The target found to run the pair (with a result of the same dtype) for
    // a home device that surely lacks it (the matmul or dtype rule, or
    // supports_op's no): placement's decision in one load, made again when
    // the target changes (a pointer into keep_, unique per target).
    std::atomic<const std::shared_ptr<BackendImpl>*> runs_there{nullptr};
  };
  static constexpr std::size_t kSlots = static_cast<std::size_t>(BP_OP_COUNT_) * BP_DTYPE_COUNT_;

  // The policy as configured (Kind::error when none).
  OpFallback configured() const {
    std::lock_guard lock(mutex_);
    return fallback_;
  }
  // The resolved target of a host:<backend> policy, whatever switches are
  // in force (placement's op_fallback_host applies those); null for none.
  std::shared_ptr<BackendImpl> target() const {
    const std::shared_ptr<BackendImpl>* h = host_.load(std::memory_order_acquire);
    return h != nullptr ? *h : nullptr;
  }
  // The same, without touching its reference count (the slow path's test):
  // null for none, else a pointer that stays valid while this state lives.
  const std::shared_ptr<BackendImpl>* target_ref() const noexcept {
    return host_.load(std::memory_order_acquire);
  }
  // Whether a target is set, without the lock.
  bool has_target() const noexcept { return host_.load(std::memory_order_acquire) != nullptr; }
  // Sets the policy and its target (null for Kind::error). Every target ever
  // set is kept, at an address that never moves (a deque grown at its end),
  // so a pointer read without the lock never dangles (the config forbids
  // chains, so this keeps no cycle).
  void set(const OpFallback& fallback, const std::shared_ptr<BackendImpl>& target) {
    std::lock_guard lock(mutex_);
    fallback_ = fallback;
    const std::shared_ptr<BackendImpl>* kept = nullptr;
    for (const auto& k : keep_)
      if (k == target) kept = &k;
    if (target && kept == nullptr) kept = &keep_.emplace_back(target);
    host_.store(target ? kept : nullptr, std::memory_order_release);
  }

  // The counter of (op, dtype); slot 0 (no pair) for values outside abi.h's tables.
  Counter& counter(int32_t op, int32_t dtype) noexcept {
    const std::size_t i =
        (op > 0 && op < BP_OP_COUNT_ && dtype > 0 && dtype < BP_DTYPE_COUNT_)
            ? static_cast<std::size_t>(op) * BP_DTYPE_COUNT_ + static_cast<std::size_t>(dtype)
            : 0;
    return counters_[i];
  }
  const Counter& slot(std::size_t i) const noexcept { return counters_[i]; }
  Counter& slot(std::size_t i) noexcept { return counters_[i]; }

 private:
  mutable std::mutex mutex_;
  OpFallback fallback_;
  std::atomic<const std::shared_ptr<BackendImpl>*> host_{nullptr};  // into keep_
  std::deque<std::shared_ptr<BackendImpl>> keep_;                   // guarded by mutex_
  std::unique_ptr<Counter[]> counters_{new Counter[kSlots]};
};

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_TENSOR_OP_FALLBACK_STATE_HPP_
