// The watchdog of the cuda plugin's collectives. A collective returns once it
// is queued (the device is async); the watchdog then polls it until it is
// done. When one fails, or is still running at its deadline (a peer died or
// hangs), it calls on_failure once with the op and the reason, which aborts
// the communicator (so NCCL's kernels return and nothing hangs) and leaves a
// sticky error on the device. Plain C++: the poll is a callback, so the CPU
// tests drive it with fakes.
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_HOST_WATCHDOG_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_HOST_WATCHDOG_HPP_

#include <backplane/abi.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_setup.hpp"

namespace backplane::cuda {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // Returns where the watched work stands; on failed, sets the reason.
  using Poll = std::function<Progress(std::string& error)>;
  // code: BP_STATUS_TIMEOUT or BP_STATUS_COLLECTIVE; message names the op.
  using OnFailure = std::function<void(bp_status_code code, const std::string& message)>;

  Watchdog(std::chrono::milliseconds interval, OnFailure on_failure);
  ~Watchdog();  // stops the thread; pending work is no longer watched
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches `what` ("all_reduce on rank 1 of 4") until poll says done, or
  // fails it at `deadline`. After a failure every later watch fails at once
  // (the communicator is gone) with the first failure's message.
  void watch(std::string what, Clock::time_point deadline, std::chrono::milliseconds timeout, Poll poll);
  // Work still watched.
  std::size_t pending() const;
  // True from just before on_failure runs; `message` is its message.
  bool failed(std::string* message = nullptr) const;
  // Blocks until nothing is pending or `deadline`; true when nothing is.
  bool drain(Clock::time_point deadline) const;

 private:
  struct Item {
    std::string what;
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;
    Poll poll;
  };
  void run();
  void fire(bp_status_code code, const std::string& message);

  const std::chrono::milliseconds interval_;
  const OnFailure on_failure_;
  mutable std::mutex mutex_;
  mutable std::condition_variable wake_;     // the thread: work arrived or stop
  mutable std::condition_variable changed_;  // drain(): the list shrank
  std::vector<Item> items_;
  std::size_t polling_ = 0;  // items the thread took out of items_ to poll
  bool stop_ = false;
  bool failed_ = false;
  std::string failure_;
  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_HOST_WATCHDOG_HPP_
