// Keeps SIGPIPE from killing the process while Gloo writes to sockets whose
// peer may have gone. On Linux such a write raises SIGPIPE, which kills a
// process that did not ignore it. The loop thread Gloo starts inherits the
// mask of the thread creating the device, and writes on the calling thread
// happen inside a collective: both run inside a SigpipeBlock, and a SIGPIPE
// raised meanwhile is consumed before the mask is restored. The process-wide
// disposition is left alone (it belongs to the application).
#ifndef BACKPLANE_PLUGINS_CPU_SIGPIPE_BLOCK_HPP_
#define BACKPLANE_PLUGINS_CPU_SIGPIPE_BLOCK_HPP_

#include <pthread.h>
#include <signal.h>

#include <cerrno>

namespace backplane::cpu {

class SigpipeBlock {
 public:
  SigpipeBlock() noexcept {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &previous_);
  }
  ~SigpipeBlock() {
    if (!was_pending_) {  // one raised inside this scope is ours to consume
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t previous_;
  bool was_pending_ = false;
};

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_SIGPIPE_BLOCK_HPP_
