// The process supervisor of `backplane launch` (see launcher.hpp). One poll()
// loop watches every rank's stdout and stderr pipe plus a self-pipe that the
// signal handlers write to, so output, rank exits and signals are handled in
// one thread, in a well-defined order, and a whole line is always written
// with one write loop before the next one starts.
#include "launcher.hpp"

#include "cli.hpp"
#include "progress.hpp"

#include <backplane/error.hpp>
#include <backplane/trace.hpp>
#include <backplane_common/hex.hpp>
#include <backplane_common/unique_fd.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace backplane::cli {
namespace {

using Clock = std::chrono::steady_clock;

// The variables the launcher sets; inherited values of these are dropped.
constexpr std::array<std::string_view, 6> kRankVariables = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
constexpr std::string_view kTimeoutVariable = "BACKPLANE_TIMEOUT";
// Set for each start of the job; inherited values are dropped.
constexpr std::array<std::string_view, 2> kStartVariables = {kProgressFdVariable, "BACKPLANE_RESTART_COUNT"};

// Signals the launcher forwards to every rank before stopping the job.
constexpr std::array<int, 3> kStopSignals = {SIGINT, SIGTERM, SIGHUP};

// Bytes read from a rank pipe at a time; also the pipe's default capacity.
constexpr std::size_t kReadChunk = 64 * 1024;
// After a rank exited, its pipes are drained without blocking, but at most
// this many chunks: a process it left behind may keep writing forever.
constexpr int kMaxDrainChunks = 16;

// ---- small RAII and system helpers ------------------------------------------

using common::UniqueFd;

[[noreturn]] void fail_system(const std::string& what, int err);

// A fresh job secret: 32 random bytes from the kernel, as 64 hex digits.
std::string fresh_job_token() {
  uint8_t bytes[32];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_system("cannot make a job secret (getrandom; set BACKPLANE_JOB_TOKEN yourself)", errno);
    got += static_cast<std::size_t>(n);
  }
  return common::to_hex(bytes);
}

[[noreturn]] void fail_system(const std::string& what, int err) {
  throw CommandError(kExitFailed, "launch: " + what + ": " + std::strerror(err));
}

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

// Both ends close-on-exec: a rank must not hold another rank's pipes open,
// or that rank's EOF would never come.
Pipe make_pipe(const std::string& what, int extra_flags = 0) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | extra_flags) != 0) fail_system("cannot create " + what, errno);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) fail_system("fcntl(O_NONBLOCK)", errno);
}

// Descriptors 0-2 closed at startup would be handed out by pipe() and then
// clobbered by a rank's dup2(); fill them with /dev/null first.
void ensure_standard_fds_open() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int opened = ::open("/dev/null", O_RDWR);
    if (opened < 0) fail_system("cannot open /dev/null", errno);
    if (opened != fd) ::close(opened);  // a lower descriptor was free after all
  }
}

std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string format_seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

std::string plural(std::size_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

// ---- signals ------------------------------------------------------------------

// Set by the handler, cleared by the loop; the self-pipe byte wakes poll().
volatile std::sig_atomic_t g_pending[NSIG] = {};
volatile std::sig_atomic_t g_wake_fd = -1;

void on_signal(int sig) {
  const int saved_errno = errno;
  g_pending[sig] = 1;
  const char byte = 0;
  [[maybe_unused]] const ssize_t n = ::write(g_wake_fd, &byte, 1);  // full pipe: a wakeup is pending anyway
  errno = saved_errno;
}

bool take_pending(int sig) {
  if (g_pending[sig] == 0) return false;
  g_pending[sig] = 0;
  return true;
}

// Installs the launcher's handlers for the scope and restores the previous
// dispositions afterwards; a rank gets the previous dispositions back
// between fork and exec (restore_in_child), so an ignored SIGINT or SIGHUP
// (nohup) stays ignored in the ranks, as it would without the launcher.
class SignalScope {
 public:
  explicit SignalScope(int wake_fd) {
    g_wake_fd = wake_fd;
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigfillset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < kStopSignals.size(); ++i) install(kStopSignals[i], action);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    install(SIGCHLD, action);
    // A closed stdout must not kill the launcher and orphan the job; writes
    // then fail with EPIPE and the output is dropped.
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    install(SIGPIPE, ignore);
  }
  ~SignalScope() {
    for (std::size_t i = 0; i < count_; ++i) ::sigaction(signals_[i], &previous_[i], nullptr);
    g_wake_fd = -1;
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  // Async-signal-safe: runs in the forked child.
  void restore_in_child() const noexcept {
    for (std::size_t i = 0; i < count_; ++i) ::sigaction(signals_[i], &previous_[i], nullptr);
  }

 private:
  void install(int sig, const struct sigaction& action) {
    if (::sigaction(sig, &action, &previous_[count_]) != 0) fail_system("sigaction", errno);
    signals_[count_++] = sig;
  }

  std::array<int, 5> signals_{};
  std::array<struct sigaction, 5> previous_{};
  std::size_t count_ = 0;
};

// ---- output -----------------------------------------------------------------

// The launcher's stdout or stderr. A write error (EPIPE: the reader is gone)
// breaks the sink for good; see Launcher::close_pipes_to.
class Sink {
 public:
  explicit Sink(int fd) : fd_(fd) {}

  void write(std::string_view text) {
    while (!text.empty() && !broken_) {
      const ssize_t n = ::write(fd_, text.data(), text.size());
      if (n > 0) {
        text.remove_prefix(static_cast<std::size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd_, POLLOUT, 0};  // an inherited non-blocking descriptor
        ::poll(&p, 1, -1);
      } else {
        broken_ = true;
      }
    }
  }

  bool broken() const noexcept { return broken_; }

 private:
  int fd_;
  bool broken_ = false;
};

// ---- ranks --------------------------------------------------------------------

struct Stream {
  UniqueFd fd;  // read end, non-blocking; reset at EOF
  LineFramer framer;
  Sink* sink;
};

struct Rank {
  int32_t index = 0;
  pid_t pid = -1;
  bool running = false;  // started and not yet reaped
  Stream out;
  Stream err;
};

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// What a forked child needs, all prepared before fork(): after it, only
// async-signal-safe calls are allowed.
struct ChildSetup {
  const char* program;
  char* const* argv;
  char* const* envp;
  pid_t launcher;
  int stdin_fd;
  int stdout_fd;  // -1: keep the launcher's (passthrough)
  int stderr_fd;  // -1: keep the launcher's
  int exec_error_fd;
  const SignalScope* signals;
  const sigset_t* mask;
};

[[noreturn]] void exec_child(const ChildSetup& c) noexcept {
  // A process group per rank: stopping a rank also reaches what it started.
  ::setpgid(0, 0);
  // Die with the launcher, even when it is SIGKILLed; the check closes the
  // window in which the launcher died before prctl().
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != c.launcher) ::_exit(kExitFailed);
  int err = 0;
  if (::dup2(c.stdin_fd, STDIN_FILENO) < 0 || (c.stdout_fd >= 0 && ::dup2(c.stdout_fd, STDOUT_FILENO) < 0) ||
      (c.stderr_fd >= 0 && ::dup2(c.stderr_fd, STDERR_FILENO) < 0)) {
    err = errno;
  } else {
    c.signals->restore_in_child();
    ::sigprocmask(SIG_SETMASK, c.mask, nullptr);
    ::execve(c.program, c.argv, c.envp);
    err = errno;
  }
  [[maybe_unused]] const ssize_t n = ::write(c.exec_error_fd, &err, sizeof err);
  ::_exit(kExitNotExecutable);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  const int sig = WTERMSIG(status);
  std::string text = "was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
  if (WCOREDUMP(status)) text += ", core dumped";
  return text;
}

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// Signals a rank's process group, or the rank alone when it left its group.
void signal_rank(const Rank& rank, int sig) {
  if (::kill(-rank.pid, sig) != 0 && errno == ESRCH) ::kill(rank.pid, sig);
}

class Launcher {
 public:
  explicit Launcher(const LaunchSpec& spec)
      : spec_(spec), wake_(make_pipe("the signal pipe", O_NONBLOCK)), signals_(wake_.write.get()) {}

  // Reached with ranks still running only on an exception: kill and reap them.
  ~Launcher() {
    for (Rank& rank : ranks_) {
      if (!rank.running) continue;
      signal_rank(rank, SIGKILL);
      while (::waitpid(rank.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      rank.running = false;
    }
  }

  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  int run() {
    for (int32_t restart = 0;; ++restart) {
      start_all(restart);
      while (running_ > 0) poll_once();
      finish_streams();
      if (!failure_ || signalled_) return exit_code_;
      // A usage or configuration error fails the same way on every start:
      // restarting would only repeat it. 64 is EX_USAGE (backplane's usage
      // and environment errors); 2 is backplane's configuration error and
      // the usage error of argparse and the shell.
      if (spec_.max_restarts > 0 && WIFEXITED(failure_->status) &&
          (WEXITSTATUS(failure_->status) == kExitUsage || WEXITSTATUS(failure_->status) == kExitConfig)) {
        const bool usage = WEXITSTATUS(failure_->status) == kExitUsage;
        say("backplane launch: not restarting: rank " + std::to_string(failure_->rank) + " exited with " +
            (usage ? "64, a usage error" : "2, a configuration or usage error") +
            ", which a restart would repeat");
        return exit_code_;
      }
      if (restart == spec_.max_restarts) {
        if (spec_.max_restarts > 0)
          say("backplane launch: giving up: the job failed again after " +
              plural(static_cast<std::size_t>(spec_.max_restarts), "restart", "restarts") +
              " (--max-restarts " + std::to_string(spec_.max_restarts) + ")");
        return exit_code_;
      }
      const std::chrono::milliseconds pause = restart_pause(restart + 1);
      say(restart_message(restart + 1) + "; restarting in " + format_seconds(pause));
      reset_for_restart();
      if (!wait_before_restart(pause)) return exit_code_;
    }
  }

 private:
  // ---- starting ----

  void start_all(int32_t restart) {
    argv_storage_ = spec_.argv;
    argv_ = pointers(argv_storage_);

    base_env_.clear();
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view entry(*e);
      const std::string_view name = entry.substr(0, entry.find('='));
      const bool ours =
          std::find(kRankVariables.begin(), kRankVariables.end(), name) != kRankVariables.end() ||
          std::find(kStartVariables.begin(), kStartVariables.end(), name) != kStartVariables.end() ||
          (spec_.timeout && name == kTimeoutVariable);
      if (!ours) base_env_.emplace_back(entry);
    }
    base_env_.push_back("WORLD_SIZE=" + std::to_string(spec_.nproc));
    base_env_.push_back("LOCAL_WORLD_SIZE=" + std::to_string(spec_.nproc));
    base_env_.push_back("MASTER_ADDR=" + spec_.master_addr);
    const uint16_t port = spec_.master_port != 0 ? spec_.master_port : choose_free_port();
    base_env_.push_back("MASTER_PORT=" + std::to_string(port));
    if (!spec_.trace.empty()) {
      base_env_.push_back("BACKPLANE_TRACE=" + spec_.trace);
      base_env_.push_back("BACKPLANE_TRACE_MERGE=launcher");
    }
    if (spec_.timeout)
      base_env_.push_back(std::string(kTimeoutVariable) + "=" + std::to_string(*spec_.timeout));
    // Each job gets its own secret for the rendezvous store, unless the
    // launcher's caller gave one (then every rank inherits it).
    if (std::getenv("BACKPLANE_JOB_TOKEN") == nullptr && std::getenv("BACKPLANE_JOB_TOKEN_FILE") == nullptr)
      base_env_.push_back("BACKPLANE_JOB_TOKEN=" + fresh_job_token());
    board_.reset();
    board_.emplace(spec_.nproc);
    base_env_.push_back(std::string(kProgressFdVariable) + "=" + std::to_string(board_->fd()));
    if (spec_.max_restarts > 0) base_env_.push_back("BACKPLANE_RESTART_COUNT=" + std::to_string(restart));

    dev_null_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!dev_null_.valid()) fail_system("cannot open /dev/null", errno);

    ranks_.reserve(static_cast<std::size_t>(spec_.nproc));
    for (int32_t k = 0; k < spec_.nproc; ++k) {
      const std::string prefix = spec_.prefix ? "[rank " + std::to_string(k) + "] " : std::string();
      ranks_.push_back(Rank{k, -1, false, Stream{UniqueFd(), LineFramer(prefix), &stdout_},
                            Stream{UniqueFd(), LineFramer(prefix), &stderr_}});
      start(ranks_.back());
    }
  }

  void start(Rank& rank) {
    const std::string which = "rank " + std::to_string(rank.index);
    const bool relayed = !(spec_.rank0_passthrough && rank.index == 0);
    Pipe out = relayed ? make_pipe("the stdout pipe of " + which) : Pipe{};
    Pipe err = relayed ? make_pipe("the stderr pipe of " + which) : Pipe{};
    Pipe exec_error = make_pipe("the exec pipe of " + which);

    std::vector<std::string> env = base_env_;
    env.push_back("RANK=" + std::to_string(rank.index));
    env.push_back("LOCAL_RANK=" + std::to_string(rank.index));
    const std::vector<char*> envp = pointers(env);

    // Signals stay blocked across fork() so that no handler of the launcher
    // runs in the child before it restored the original dispositions.
    sigset_t all;
    sigset_t previous;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &previous);
    const ChildSetup setup{spec_.program.c_str(),
                           argv_.data(),
                           envp.data(),
                           ::getpid(),
                           dev_null_.get(),
                           out.write.get(),
                           err.write.get(),
                           exec_error.write.get(),
                           &signals_,
                           &previous};
    const pid_t pid = ::fork();
    if (pid == 0) exec_child(setup);
    const int fork_errno = errno;
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    if (pid < 0) fail_system("cannot start " + which + ": fork", fork_errno);

    rank.pid = pid;
    rank.running = true;
    ++running_;
    out.write.reset();
    err.write.reset();
    exec_error.write.reset();

    // EOF: exec succeeded (the close-on-exec write end went away); an int:
    // the child's errno from execve or dup2.
    int child_errno = 0;
    ssize_t n;
    do {
      n = ::read(exec_error.read.get(), &child_errno, sizeof child_errno);
    } while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(sizeof child_errno)) {
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      rank.running = false;
      --running_;
      throw CommandError(kExitNotExecutable,
                         "launch: cannot start " + which + ": cannot execute '" + spec_.program +
                             "': " + std::strerror(child_errno) +
                             (rank.index > 0 ? "; killed the ranks already started" : ""));
    }

    if (!relayed) return;
    set_nonblocking(out.read.get());
    set_nonblocking(err.read.get());
    rank.out.fd = std::move(out.read);
    rank.err.fd = std::move(err.read);
  }

  // ---- the loop ----

  void poll_once() {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    fds.push_back({wake_.read.get(), POLLIN, 0});
    for (Rank& rank : ranks_) {
      for (Stream* stream : {&rank.out, &rank.err}) {
        if (!stream->fd.valid()) continue;
        fds.push_back({stream->fd.get(), POLLIN, 0});
        streams.push_back(stream);
      }
    }

    int timeout_ms = -1;
    if (stopping_ && !killed_) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(kill_deadline_ - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 60'000));
    }
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) fail_system("poll", errno);

    if (ready > 0 && fds[0].revents != 0) {
      char buf[256];
      while (::read(wake_.read.get(), buf, sizeof buf) > 0) {
      }
    }
    handle_signals();
    if (ready > 0) {
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) read_chunk(*streams[i - 1]);
      }
    }
    if (stopping_ && !killed_ && running_ > 0 && Clock::now() >= kill_deadline_) kill_remaining();
  }

  void handle_signals() {
    if (take_pending(SIGCHLD)) reap_exited();
    for (const int sig : kStopSignals) {
      if (take_pending(sig)) on_stop_signal(sig);
    }
  }

  enum class ReadResult { data, again, closed };

  ReadResult read_chunk(Stream& stream) {
    if (!stream.fd.valid()) return ReadResult::closed;
    buffer_.resize(kReadChunk);
    ssize_t n;
    do {
      n = ::read(stream.fd.get(), buffer_.data(), buffer_.size());
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ReadResult::again;
    text_.clear();
    if (n > 0) {
      stream.framer.feed(std::string_view(buffer_.data(), static_cast<std::size_t>(n)), text_);
      stream.sink->write(text_);
      if (!stream.sink->broken()) return ReadResult::data;
      close_pipes_to(*stream.sink);
      return ReadResult::closed;
    }
    // EOF, or a read error, which ends the stream just the same.
    stream.framer.finish(text_);
    stream.sink->write(text_);
    stream.fd.reset();
    return ReadResult::closed;
  }

  // The launcher's output is gone (`backplane launch ... | head`): close the
  // ranks' pipes to it, so their next writes fail as they would on that
  // broken pipe itself (SIGPIPE or EPIPE), rather than run on unheard.
  void close_pipes_to(const Sink& sink) {
    for (Rank& rank : ranks_) {
      for (Stream* stream : {&rank.out, &rank.err}) {
        if (stream->sink == &sink) stream->fd.reset();
      }
    }
  }

  void drain(Stream& stream) {
    for (int i = 0; i < kMaxDrainChunks; ++i) {
      if (read_chunk(stream) != ReadResult::data) return;
    }
  }

  void finish_streams() {
    for (Rank& rank : ranks_) {
      for (Stream* stream : {&rank.out, &rank.err}) {
        drain(*stream);
        if (!stream->fd.valid()) continue;
        // A process the rank left behind still holds the pipe: stop here.
        text_.clear();
        stream->framer.finish(text_);
        stream->sink->write(text_);
        stream->fd.reset();
      }
    }
  }

  // ---- exits and stopping ----

  void reap_exited() {
    for (Rank& rank : ranks_) {
      if (!rank.running) continue;
      siginfo_t info{};
      int rc;
      do {
        rc = ::waitid(P_PID, static_cast<id_t>(rank.pid), &info, WEXITED | WNOHANG | WNOWAIT);
      } while (rc < 0 && errno == EINTR);
      if (rc < 0) fail_system("waitid on rank " + std::to_string(rank.index), errno);
      if (info.si_pid == 0) continue;  // still running

      const bool failed = !(info.si_code == CLD_EXITED && info.si_status == 0);
      // Until it is reaped, the exited rank's pid (= its process group id)
      // cannot be reused, so killing what it left in its group is safe now.
      if (failed || stopping_) ::kill(-rank.pid, SIGKILL);
      int status = 0;
      while (::waitpid(rank.pid, &status, 0) < 0 && errno == EINTR) {
      }
      rank.running = false;
      --running_;
      // The rank's last words come before the launcher's verdict on it.
      drain(rank.out);
      drain(rank.err);
      if (failed && !stopping_) on_rank_failed(rank, status);
    }
  }

  void on_rank_failed(const Rank& rank, int status) {
    exit_code_ = exit_code_of(status);
    failure_ = Failure{rank.index, status};
    std::string message = "backplane launch: rank " + std::to_string(rank.index) + " (pid " +
                          std::to_string(rank.pid) + ") " + describe_status(status);
    if (running_ > 0) {
      message += running_ == 1 ? std::string("; stopping the other rank")
                               : "; stopping the other " + std::to_string(running_) + " ranks";
    }
    say(message);
    begin_stop(SIGTERM);
  }

  void on_stop_signal(int sig) {
    if (running_ == 0) return;
    if (!stopping_) {
      exit_code_ = 128 + sig;
      signalled_ = true;
      say("backplane launch: received " + signal_name(sig) + "; forwarding it to the " +
          plural(running_, "running rank", "running ranks") + " (SIGKILL after " +
          format_seconds(spec_.grace) + ")");
      begin_stop(sig);
    } else if (!killed_) {
      say("backplane launch: received " + signal_name(sig) + " while stopping; killing the " +
          plural(running_, "remaining rank", "remaining ranks") + " now");
      kill_remaining(/*announce=*/false);
    }
  }

  void begin_stop(int sig) {
    stopping_ = true;
    kill_deadline_ = Clock::now() + spec_.grace;
    for (const Rank& rank : ranks_) {
      if (rank.running) signal_rank(rank, sig);
    }
  }

  void kill_remaining(bool announce = true) {
    killed_ = true;
    std::vector<std::string> names;
    for (const Rank& rank : ranks_) {
      if (!rank.running) continue;
      names.push_back(std::to_string(rank.index) + " (pid " + std::to_string(rank.pid) + ")");
      signal_rank(rank, SIGKILL);
    }
    if (!announce || names.empty()) return;
    std::string list;
    for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
    say("backplane launch: " + std::string(names.size() == 1 ? "rank " : "ranks ") + list +
        " did not stop within " + format_seconds(spec_.grace) + "; sending SIGKILL");
  }

  void say(const std::string& line) { stderr_.write(line + "\n"); }

  // ---- restarts ----

  // "restart 1/3: rank 1 was killed by signal 9 (SIGKILL) at step 812;
  // resuming from step 800", with what the ranks posted on the board.
  std::string restart_message(int32_t restart) const {
    std::string text = "backplane launch: restart " + std::to_string(restart) + "/" +
                       std::to_string(spec_.max_restarts) + ": rank " + std::to_string(failure_->rank) + " " +
                       describe_status(failure_->status);
    const std::optional<int64_t> step = board_->step(failure_->rank);
    if (step) text += " at step " + std::to_string(*step);
    if (const std::optional<int64_t> checkpoint = board_->checkpoint_step(0))
      text += "; resuming from step " + std::to_string(*checkpoint);
    else if (step)
      text += "; no checkpoint yet, so from the start";
    else
      text += "; starting every rank again";
    return text;
  }

  // restart_delay doubled for each restart before this one, capped.
  std::chrono::milliseconds restart_pause(int32_t restart) const {
    const std::chrono::milliseconds cap = std::max(spec_.restart_delay, spec_.restart_delay_max);
    std::chrono::milliseconds pause = spec_.restart_delay;
    for (int32_t k = 1; k < restart && pause < cap; ++k) pause *= 2;
    return std::min(pause, cap);
  }

  // Sleeps `pause` while still answering stop signals: false when one came
  // (exit_code_ is then 128 + signal and nothing restarts).
  bool wait_before_restart(std::chrono::milliseconds pause) {
    const Clock::time_point until = Clock::now() + pause;
    for (;;) {
      for (const int sig : kStopSignals) {
        if (!take_pending(sig)) continue;
        exit_code_ = 128 + sig;
        signalled_ = true;
        say("backplane launch: received " + signal_name(sig) + " while waiting to restart; not restarting");
        return false;
      }
      take_pending(SIGCHLD);  // no rank runs now
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) return true;
      pollfd fd{wake_.read.get(), POLLIN, 0};
      const int ready = ::poll(&fd, 1, static_cast<int>(std::min<int64_t>(left.count(), 60'000)));
      if (ready < 0 && errno != EINTR) fail_system("poll", errno);
      if (ready > 0) {
        char buf[256];
        while (::read(wake_.read.get(), buf, sizeof buf) > 0) {
        }
      }
    }
  }

  void reset_for_restart() {
    ranks_.clear();
    running_ = 0;
    stopping_ = false;
    killed_ = false;
    exit_code_ = kExitOk;
    failure_.reset();
  }

  const LaunchSpec& spec_;
  Pipe wake_;
  SignalScope signals_;
  Sink stdout_{STDOUT_FILENO};
  Sink stderr_{STDERR_FILENO};
  UniqueFd dev_null_;
  std::vector<std::string> argv_storage_;
  std::vector<char*> argv_;
  std::vector<std::string> base_env_;
  std::vector<Rank> ranks_;
  std::size_t running_ = 0;
  bool stopping_ = false;
  bool killed_ = false;
  bool signalled_ = false;  // the launcher itself was told to stop: no restart
  struct Failure {
    int32_t rank;
    int status;
  };
  std::optional<Failure> failure_;  // the first rank that failed in this start
  std::optional<ProgressBoard> board_;
  Clock::time_point kill_deadline_{};
  int exit_code_ = kExitOk;
  std::string buffer_;
  std::string text_;
};

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Where to cut `text` (longer than `limit`) so the first piece has at most
// `limit` bytes and the second does not start inside a UTF-8 sequence.
std::size_t utf8_cut(std::string_view text, std::size_t limit) {
  std::size_t cut = limit;
  for (int back = 0; back < 3 && cut > 0 && is_continuation(text[cut]); ++back) --cut;
  return is_continuation(text[cut]) || cut == 0 ? limit : cut;  // not UTF-8: cut anywhere
}

bool is_executable_file(const std::string& path, int& why) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    why = errno;
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    why = EISDIR;
    return false;
  }
  if (!S_ISREG(st.st_mode) || ::access(path.c_str(), X_OK) != 0) {
    why = EACCES;
    return false;
  }
  return true;
}

std::string not_executable_message(const std::string& command, const std::string& path, int why) {
  const std::string shown = path == command ? "'" + command + "'" : "'" + command + "' (" + path + ")";
  switch (why) {
    case ENOENT:
    case ENOTDIR:
      return "launch: command " + shown + " does not exist; nothing was started";
    case EISDIR:
      return "launch: command " + shown + " is a directory, not a program; nothing was started";
    case EACCES:
      return "launch: command " + shown +
             " is not executable; make it executable (chmod +x) or run it through its interpreter "
             "(e.g. -- sh " +
             command + "); nothing was started";
    default:
      return "launch: command " + shown + " cannot be used: " + std::strerror(why) + "; nothing was started";
  }
}

void reserve_descriptors(int32_t nproc) {
  // Per rank the launcher holds two pipe read ends, plus a few of its own.
  const rlim_t needed = 2 * static_cast<rlim_t>(nproc) + 16;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) fail_system("getrlimit(RLIMIT_NOFILE)", errno);
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed) return;
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed) {
    limit.rlim_cur = needed;
    if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) return;
  }
  throw CommandError(kExitFailed,
                     "launch: " + std::to_string(nproc) + " ranks need " + std::to_string(needed) +
                         " open files in the launcher, but the limit is " + std::to_string(limit.rlim_cur) +
                         "; raise it (ulimit -n) or start fewer ranks");
}

}  // namespace

// ---- LineFramer ------------------------------------------------------------------

void LineFramer::emit(std::string_view line, std::string& out) const {
  while (line.size() > kMaxLine) {
    const std::size_t cut = utf8_cut(line, kMaxLine);
    out.append(prefix_).append(line.substr(0, cut)).push_back('\n');
    line.remove_prefix(cut);
  }
  out.append(prefix_).append(line).push_back('\n');
}

void LineFramer::feed(std::string_view data, std::string& out) {
  while (!data.empty()) {
    const std::size_t newline = data.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(data);
      break;
    }
    if (partial_.empty()) {
      emit(data.substr(0, newline), out);
    } else {
      partial_.append(data.substr(0, newline));
      emit(partial_, out);
      partial_.clear();
    }
    data.remove_prefix(newline + 1);
  }
  // A line that keeps growing is flushed in pieces rather than held forever.
  if (partial_.size() > kMaxLine) {
    std::string_view rest = partial_;
    while (rest.size() > kMaxLine) {
      const std::size_t cut = utf8_cut(rest, kMaxLine);
      out.append(prefix_).append(rest.substr(0, cut)).push_back('\n');
      rest.remove_prefix(cut);
    }
    partial_.erase(0, partial_.size() - rest.size());
  }
}

void LineFramer::finish(std::string& out) {
  if (partial_.empty()) return;
  emit(partial_, out);
  partial_.clear();
}

// ---- entry points ------------------------------------------------------------------

std::string resolve_program(const std::string& command) {
  if (command.empty()) throw CommandError(kExitUsage, "launch: the command is an empty string");
  int why = 0;
  if (command.find('/') != std::string::npos) {
    if (is_executable_file(command, why)) return command;
    throw CommandError(kExitNotExecutable, not_executable_message(command, command, why));
  }

  std::string search;
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    search = path;
  } else {
    search = "/usr/local/bin:/usr/bin:/bin";  // execvp's default when PATH is unset
  }
  std::string found_unusable;
  int unusable_why = 0;
  std::size_t begin = 0;
  while (begin <= search.size()) {
    std::size_t end = search.find(':', begin);
    if (end == std::string::npos) end = search.size();
    const std::string dir = end == begin ? "." : search.substr(begin, end - begin);  // empty entry: cwd
    const std::string candidate = dir + "/" + command;
    if (is_executable_file(candidate, why)) return candidate;
    if (why != ENOENT && why != ENOTDIR && found_unusable.empty()) {
      found_unusable = candidate;
      unusable_why = why;
    }
    begin = end + 1;
  }
  if (!found_unusable.empty()) {
    throw CommandError(kExitNotExecutable, not_executable_message(command, found_unusable, unusable_why));
  }
  throw CommandError(kExitNotExecutable, "launch: command '" + command + "' not found in PATH (" + search +
                                             "); nothing was started");
}

uint16_t choose_free_port() {
  UniqueFd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) fail_system("cannot pick a free MASTER_PORT (pass --master-port): socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;  // the kernel picks a port that is free on every interface
  if (::bind(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    fail_system("cannot pick a free MASTER_PORT (pass --master-port): bind", errno);
  }
  socklen_t len = sizeof addr;
  if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    fail_system("cannot pick a free MASTER_PORT (pass --master-port): getsockname", errno);
  }
  return ntohs(addr.sin_port);
}

namespace {

// The parts the ranks left, merged into the trace file; a failure to merge
// is reported, not fatal (the job's own result stands).
void merge_trace(const std::string& path) {
  const std::vector<std::string> parts = trace::parts_of(path);
  if (parts.empty()) {
    std::fprintf(stderr, "backplane launch: warning: --trace %s: no rank wrote a trace part\n", path.c_str());
    return;
  }
  try {
    const trace::MergeResult m = trace::merge(parts, path);
    for (const std::string& p : parts) ::unlink(p.c_str());
    std::fprintf(stderr, "backplane launch: trace of %zu part(s), %llu events%s written to %s\n", m.ranks,
                 static_cast<unsigned long long>(m.events),
                 m.incomplete > 0 ? " (some ranks ended early: their parts stop where they died)" : "",
                 path.c_str());
  } catch (const std::exception& e) {  // the job's own exit code stands
    std::fprintf(stderr, "backplane launch: warning: the ranks' trace parts were left as they are: %s\n",
                 e.what());
  }
}

}  // namespace

int run_ranks(const LaunchSpec& given) {
  ensure_standard_fds_open();
  LaunchSpec spec = given;
  if (spec.trace.empty()) spec.trace = take_trace_from_env();
  // Parts an earlier job left under this name (killed before its merge)
  // would be merged into this one's: gone before the ranks start.
  if (!spec.trace.empty())
    for (const std::string& p : trace::parts_of(spec.trace)) ::unlink(p.c_str());
  reserve_descriptors(spec.nproc);
  Launcher launcher(spec);
  const int code = launcher.run();
  if (!spec.trace.empty()) merge_trace(spec.trace);
  return code;
}

void add_trace_options(CLI::App& app, std::string& trace, uint64_t& max_events) {
  app.add_option(
         "--trace", trace,
         "Record a timeline of every rank (ops, op fallbacks and copies, collectives) into FILE, in the "
         "Trace Event Format that Perfetto and chrome://tracing open (docs/tracing.md)")
      ->type_name("FILE");
  app.add_option("--trace-max-events", max_events,
                 "With --trace: events each rank keeps; later ones are counted in the file, not kept "
                 "(default " +
                     std::to_string(trace::kDefaultMaxEvents) + ")")
      ->type_name("N")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
}

void set_trace_environment(const std::string& trace, uint64_t max_events) {
  if (!trace.empty()) ::setenv("BACKPLANE_TRACE", std::filesystem::absolute(trace).c_str(), 1);
  if (max_events > 0) ::setenv("BACKPLANE_TRACE_MAX_EVENTS", std::to_string(max_events).c_str(), 1);
}

std::string take_trace_from_env() {
  const char* path = std::getenv("BACKPLANE_TRACE");
  std::string out =
      path != nullptr && *path != '\0' ? std::filesystem::absolute(path).string() : std::string();
  ::unsetenv("BACKPLANE_TRACE");  // the launching process itself records nothing
  return out;
}

}  // namespace backplane::cli
