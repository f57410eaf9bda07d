// The process supervisor behind `backplane launch`: starts N local ranks of one
// command, relays their output line by line with a "[rank K] " prefix, and
// stops the whole job when one rank fails or the launcher is signalled.
// Not thread-safe: one launch per process, run from the main thread.
#ifndef BACKPLANE_TOOLS_LAUNCHER_HPP_
#define BACKPLANE_TOOLS_LAUNCHER_HPP_

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace backplane::cli {

struct LaunchSpec {
  std::string program;                    // the file to execute: a path (contains '/'), already resolved
  std::vector<std::string> argv;          // argv[0] as the user wrote it, then the arguments
  int32_t nproc = 1;                      // ranks to start: RANK 0 .. nproc-1
  std::string master_addr;                // MASTER_ADDR
  uint16_t master_port = 0;               // MASTER_PORT; 0: a free port, chosen afresh for each start
  std::optional<int64_t> timeout;         // BACKPLANE_TIMEOUT (seconds) when set; else inherited
  std::chrono::milliseconds grace{5000};  // between the stop signal and SIGKILL
  bool prefix = true;                     // "[rank K] " before each relayed line
  // Rank 0 writes straight to the launcher's stdout and stderr instead of
  // being relayed: a terminal stays a terminal (progress bars, colours), no
  // prefix. Its lines may then mix with the other ranks' relayed lines.
  bool rank0_passthrough = false;
  // Starts of the whole job after a rank failed (exited non-zero or was
  // killed): every rank is stopped, then all are started again with a fresh
  // rendezvous (another port unless master_port is fixed, a new job secret
  // unless the caller gave one) and BACKPLANE_RESTART_COUNT set to the
  // restart's number. Not after the launcher itself was signalled.
  int32_t max_restarts = 0;
  // The pause before restart k is restart_delay * 2^(k-1), at most
  // max(restart_delay, restart_delay_max): a job that fails at once does not spin (1000 restarts
  // in seconds), and one that fails on a flaky node waits that node out. A
  // stop signal during the pause ends the job without restarting.
  std::chrono::milliseconds restart_delay{1000};
  std::chrono::milliseconds restart_delay_max{60'000};
  // The job's trace file (--trace; else BACKPLANE_TRACE as the launcher
  // found it): every rank records its part (BACKPLANE_TRACE) and the
  // launcher, not rank 0, merges the parts when the job has ended, so a
  // rank that died is in the file with what it recorded. Empty: no trace.
  std::string trace;
};

// Runs the job to its end and returns the launcher's exit code: 0 when every
// rank of the last start exited 0; else the first failing rank's exit code
// of the last start (128 + signal for a rank
// killed by a signal); 128 + signal when the launcher itself was stopped by
// SIGINT, SIGTERM or SIGHUP. Throws CommandError with kExitNotExecutable (127)
// when a rank cannot be executed, and kExitFailed when the system refuses a
// pipe or a process; ranks already started are killed first.
int run_ranks(const LaunchSpec& spec);

// The file to execute for `command`, resolved before anything starts: as
// given when it contains '/', else the first executable match in PATH.
// Throws CommandError(kExitNotExecutable) saying what is wrong (missing, a
// directory, not executable) and CommandError(kExitUsage) for "".
std::string resolve_program(const std::string& command);

// A TCP port that is free on every local interface now (bind to port 0).
// Another process may still take it before rank 0 binds it; pass
// --master-port for a fixed port.
uint16_t choose_free_port();

// BACKPLANE_TRACE made absolute (empty when unset), removed from this
// process's environment: a process that launches ranks hands the variable to
// them and must not record a part of its own (its registry would).
std::string take_trace_from_env();

// --trace FILE and --trace-max-events N, as train and launch take them.
void add_trace_options(CLI::App& app, std::string& trace, uint64_t& max_events);
// Sets BACKPLANE_TRACE (absolute) and BACKPLANE_TRACE_MAX_EVENTS from them;
// nothing for an empty trace / 0 events.
void set_trace_environment(const std::string& trace, uint64_t max_events);

// Splits one rank stream into lines and prefixes each one. A line longer than
// kMaxLine bytes is emitted in pieces of at most kMaxLine bytes, cut before a
// UTF-8 lead byte where possible, so no multibyte character is split.
class LineFramer {
 public:
  static constexpr std::size_t kMaxLine = 64 * 1024;

  explicit LineFramer(std::string prefix) : prefix_(std::move(prefix)) {}

  // Appends every complete line of `data` (prefixed, '\n'-terminated) to `out`
  // and keeps the unterminated rest for the next call.
  void feed(std::string_view data, std::string& out);
  // Appends the kept partial line, if any, with a '\n' added.
  void finish(std::string& out);

 private:
  void emit(std::string_view line, std::string& out) const;

  std::string prefix_;
  std::string partial_;
};

}  // namespace backplane::cli

#endif  // BACKPLANE_TOOLS_LAUNCHER_HPP_
