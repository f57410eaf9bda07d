// The server's one memory account: every byte a session makes the server
// hold (hosted buffers, Write payloads staged for the worker, replies not yet
// sent, payload buffers kept for reuse, a Read's staging) is taken from it
// against --max-total-bytes, and given back when freed.
//
// Thread-safety: every method may be called from any thread (one atomic).
#ifndef BACKPLANE_REMOTE_SERVER_ACCOUNT_HPP_
#define BACKPLANE_REMOTE_SERVER_ACCOUNT_HPP_

#include <atomic>
#include <cstdint>

namespace backplane::remote::server {

class MemoryAccount {
 public:
  // Takes `n` bytes unless the account would then hold more than `cap`;
  // false (nothing taken) then.
  bool take(uint64_t n, uint64_t cap) noexcept {
    uint64_t held = held_.load(std::memory_order_relaxed);
    do {
      if (n > cap || held > cap - n) return false;
    } while (!held_.compare_exchange_weak(held, held + n, std::memory_order_relaxed));
    return true;
  }
  // Takes `n` bytes even past the cap: for what must go through and is
  // bounded elsewhere (one reply frame of a session with nothing else unsent).
  void force(uint64_t n) noexcept { held_.fetch_add(n, std::memory_order_relaxed); }
  void give(uint64_t n) noexcept { held_.fetch_sub(n, std::memory_order_relaxed); }
  uint64_t held() const noexcept { return held_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> held_{0};
};

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_ACCOUNT_HPP_
