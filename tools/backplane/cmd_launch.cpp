// `backplane launch -n N -- CMD ARGS...`: starts N local ranks of a command with
// the variables Rendezvous::from_env reads (RANK, WORLD_SIZE, MASTER_ADDR, ...),
// like torchrun's local launcher. This file is the command line; the process
// supervision is in launcher.cpp.
#include "cli.hpp"
#include "launcher.hpp"

#include <backplane_common/atomic_file.hpp>

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace backplane::cli {
namespace {

struct LaunchOptions {
  int32_t nproc = 0;
  std::string master_addr = "127.0.0.1";
  int32_t master_port = 0;  // 0: pick a free one
  std::optional<int64_t> timeout;
  double grace = 5.0;
  bool no_prefix = false;
  bool rank0_passthrough = false;
  int32_t max_restarts = 0;
  double restart_delay = 1.0;
  std::string trace;
  uint64_t trace_max_events = 0;
  std::vector<std::string> command;
};

constexpr int64_t kMaxTimeoutSeconds = 365LL * 24 * 3600;
constexpr double kMaxGraceSeconds = 24.0 * 3600;

// A CLI11 validator for an integer option in [min, max] with a message that
// says what the option means.
CLI::Validator integer_in(int64_t min, int64_t max, const std::string& what) {
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        int64_t value = 0;
        if (!CLI::detail::lexical_cast(input, value)) return "'" + input + "' is not a whole number";
        if (value < min || value > max) {
          return std::to_string(value) + " is not a valid " + what + "; pass " + std::to_string(min) +
                 " to " + std::to_string(max);
        }
        return {};
      },
      "", "");
}

// A CLI11 validator for a duration in seconds, 0 to a day; `what` names it
// in the message ("grace period").
CLI::Validator seconds_up_to_a_day(const std::string& what) {
  return CLI::Validator(
      [what](std::string& input) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(input, value) || !std::isfinite(value) || value < 0 ||
            value > kMaxGraceSeconds) {
          return "'" + input + "' is not a valid " + what + "; pass seconds from 0 to 86400 (e.g. 5 or 0.5)";
        }
        return {};
      },
      "", "");
}

int run_launch(const LaunchOptions& options) {
  if (options.master_addr.empty()) {
    throw CommandError(kExitUsage,
                       "launch: --master-addr is empty; pass a host name or address (default 127.0.0.1)");
  }
  LaunchSpec spec;
  // Resolved first: a missing command must fail before any rank starts.
  spec.program = resolve_program(options.command.front());
  spec.argv = options.command;
  spec.nproc = options.nproc;
  spec.master_addr = options.master_addr;
  spec.master_port = static_cast<uint16_t>(options.master_port);  // 0: a free one for each start
  spec.timeout = options.timeout;
  spec.grace = std::chrono::milliseconds(std::llround(options.grace * 1000.0));
  spec.prefix = !options.no_prefix;
  spec.rank0_passthrough = options.rank0_passthrough;
  spec.max_restarts = options.max_restarts;
  spec.restart_delay = std::chrono::milliseconds(std::llround(options.restart_delay * 1000.0));
  set_trace_environment(options.trace, options.trace_max_events);
  spec.trace = take_trace_from_env();
  if (!spec.trace.empty()) {  // before any rank starts: one message, not one per rank
    try {
      common::check_file_writable(spec.trace);
    } catch (const common::FileWriteError& e) {
      throw CommandError(kExitFailed, std::string("launch: --trace: ") + e.what());
    }
  }
  return run_ranks(spec);
}

}  // namespace

Command add_launch_command(CLI::App& parent) {
  auto options = std::make_shared<LaunchOptions>();
  CLI::App* sub = parent.add_subcommand(
      "launch",
      "Start N local ranks of a command with RANK, WORLD_SIZE, MASTER_ADDR, ... set (like torchrun)");
  sub->add_option("-n,--nproc,--nproc-per-node", options->nproc, "Number of ranks to start (1 or more)")
      ->required()
      ->type_name("N")
      ->check(integer_in(1, 1 << 20, "number of ranks"));
  sub->add_option("--master-addr", options->master_addr, "MASTER_ADDR for the ranks (default 127.0.0.1)")
      ->type_name("ADDR");
  sub->add_option("--master-port", options->master_port,
                  "MASTER_PORT for the ranks (default: a port that is free now)")
      ->type_name("PORT")
      ->check(integer_in(1, 65535, "port"));
  sub->add_option("--timeout", options->timeout,
                  "BACKPLANE_TIMEOUT for the ranks: seconds before a rendezvous or collective gives up")
      ->type_name("SECONDS")
      ->check(integer_in(1, kMaxTimeoutSeconds, "timeout in seconds"));
  sub->add_option("--grace", options->grace,
                  "Seconds between the stop signal and SIGKILL when the job is stopped (default 5)")
      ->type_name("SECONDS")
      ->check(seconds_up_to_a_day("grace period"));
  sub->add_flag("--no-prefix", options->no_prefix, "Relay output lines without the \"[rank K] \" prefix");
  sub->add_flag("--rank0-passthrough", options->rank0_passthrough,
                "Rank 0 writes straight to the launcher's stdout and stderr (a terminal stays a terminal, "
                "no prefix); the other ranks are relayed");
  add_trace_options(*sub, options->trace, options->trace_max_events);
  sub->add_option("--max-restarts", options->max_restarts,
                  "When a rank fails, stop every rank and start them all again, at most K times (default 0)")
      ->type_name("K")
      ->check(integer_in(0, 1000, "number of restarts"));
  sub->add_option("--restart-delay", options->restart_delay,
                  "Seconds before the first restart; each further restart waits twice as long as the one "
                  "before, up to 60 s (default 1)")
      ->type_name("SECONDS")
      ->check(seconds_up_to_a_day("restart delay"));
  sub->add_option("command", options->command, "The program to run and its arguments (after --)")
      ->required()
      ->type_name("CMD");
  // Everything from the first positional argument on is the command's own,
  // so `launch -n 2 python train.py --lr 1` works without `--` too.
  sub->positionals_at_end();
  sub->footer(
      "Each rank gets the launcher's environment plus RANK and LOCAL_RANK (0..N-1), WORLD_SIZE and\n"
      "LOCAL_WORLD_SIZE (N), MASTER_ADDR, MASTER_PORT, and BACKPLANE_TIMEOUT when --timeout is given.\n"
      "Each job gets a fresh random BACKPLANE_JOB_TOKEN (the secret its ranks prove to the rendezvous\n"
      "store) unless BACKPLANE_JOB_TOKEN or BACKPLANE_JOB_TOKEN_FILE is already set.\n"
      "Ranks read stdin from /dev/null. Their stdout and stderr are relayed line by line to the\n"
      "launcher's stdout and stderr, each line prefixed \"[rank K] \"; lines never interleave, and a\n"
      "line longer than 64 KiB is relayed in pieces.\n"
      "\n"
      "When a rank exits non-zero or is killed, the launcher says which, sends SIGTERM to the other\n"
      "ranks (to each rank's process group), and SIGKILL after --grace seconds. SIGINT, SIGTERM and\n"
      "SIGHUP sent to the launcher are forwarded the same way; a second one kills at once. The rank\n"
      "processes themselves die with the launcher even when the launcher is SIGKILLed.\n"
      "\n"
      "With --max-restarts K, a failed rank (not a signalled launcher) stops every rank as above, then,\n"
      "after a pause (--restart-delay, doubling with each restart up to 60 s), all ranks start again,\n"
      "with a fresh rendezvous (a new free port unless --master-port is given, a new job secret unless\n"
      "the caller set one) and BACKPLANE_RESTART_COUNT=1, 2, ...; after K restarts the next failure\n"
      "ends the job. A rank that exits 64 (a usage or environment error) or 2 (a configuration error,\n"
      "or argparse's usage error), which every start would repeat, is not restarted. A program that\n"
      "checkpoints resumes from its checkpoint\n"
      "(`backplane train --checkpoint-dir` does).\n"
      "\n"
      "Exit code: 0 when every rank of the last start exited 0; else the first failing rank's exit\n"
      "code (128 + N for a rank killed by signal N); 128 + N when the launcher was stopped by signal\n"
      "N; 127 when the command cannot be found or executed (nothing is started); 64 for a bad command\n"
      "line.");
  return {sub, [options] { return run_launch(*options); }};
}

}  // namespace backplane::cli
