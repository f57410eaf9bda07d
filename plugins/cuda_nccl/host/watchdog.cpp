// The collectives' watchdog (watchdog.hpp).
#include "watchdog.hpp"

#include <utility>

namespace backplane::cuda {

Watchdog::Watchdog(std::chrono::milliseconds interval, OnFailure on_failure)
    : interval_(interval), on_failure_(std::move(on_failure)), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch(std::string what, Clock::time_point deadline, std::chrono::milliseconds timeout,
                     Poll poll) {
  std::unique_lock<std::mutex> lock(mutex_);
  // After a failure the communicator is aborted: the collective itself
  // reports that, so there is nothing left to watch.
  if (failed_) return;
  items_.push_back(Item{std::move(what), deadline, timeout, std::move(poll)});
  lock.unlock();
  wake_.notify_all();
}

std::size_t Watchdog::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return items_.size() + polling_;
}

bool Watchdog::failed(std::string* message) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_ && message != nullptr) *message = failure_;
  return failed_;
}

bool Watchdog::drain(Clock::time_point deadline) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_until(lock, deadline, [&] { return items_.empty() && polling_ == 0; });
}

void Watchdog::fire(bp_status_code code, const std::string& message) {
  // Outside the lock: on_failure aborts the communicator, which may take a while.
  on_failure_(code, message);
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (items_.empty()) {
      wake_.wait(lock, [&] { return stop_ || !items_.empty(); });
    } else {
      wake_.wait_for(lock, interval_, [&] { return stop_; });
    }
    if (stop_) return;
    // Poll in order: collectives finish in the order they were queued, so the
    // first one still running is the one to blame.
    std::vector<Item> items = std::move(items_);
    items_.clear();
    polling_ = items.size();  // still pending while the lock is released
    lock.unlock();
    std::size_t finished = 0;
    bp_status_code code = BP_STATUS_OK;
    std::string message;
    for (Item& item : items) {
      std::string error;
      const Progress p = item.poll(error);
      if (p == Progress::done) {
        ++finished;
        continue;
      }
      if (p == Progress::failed) {
        code = BP_STATUS_COLLECTIVE;
        message = item.what + " failed: " + error + "; the communicator was aborted";
      } else if (Clock::now() >= item.deadline) {
        code = BP_STATUS_TIMEOUT;
        message = item.what + " did not complete within " + std::to_string(item.timeout.count()) +
                  " ms (a peer died, hangs, or called another collective), so the communicator was aborted "
                  "(comm_abort)";
      }
      break;
    }
    lock.lock();
    polling_ = 0;
    if (code != BP_STATUS_OK) {
      // Failed before on_failure runs, so whoever on_failure wakes already
      // sees failed() and no new work is accepted.
      failed_ = true;
      failure_ = message;
      items_.clear();  // aborted: nothing left worth watching
      lock.unlock();
      fire(code, message);
      lock.lock();
    } else {
      // Keep the unfinished (in order), then whatever arrived meanwhile.
      items.erase(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(finished));
      for (Item& late : items_) items.push_back(std::move(late));
      items_ = std::move(items);
    }
    changed_.notify_all();
  }
}

}  // namespace backplane::cuda
