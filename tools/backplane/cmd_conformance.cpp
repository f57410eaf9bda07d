// `backplane conformance`: runs the conformance suite (conformance/) on
// every device of one backend (or of every loaded backend, or one device) and
// prints a pass/fail table per (op, dtype) and a summary. Exit 0 when no case
// failed, 1 when one did (or a backend under test failed to load), 2 on a
// config problem, 64 on a bad command line. The normal mode tests a device's
// own ops (every op_fallback off); --placement runs every case through op
// placement, proving the backend's op_fallback.
#include "cli.hpp"

#include <backplane/conformance.hpp>

#include <backplane/error.hpp>
#include <backplane/registry.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace backplane::cli {
namespace {

namespace fs = std::filesystem;
namespace bc = backplane::conformance;

struct ConformanceOptions {
  std::string config;
  std::string backend;  // "" = every backend of the config
  int64_t device = -1;
  CLI::Option* device_option = nullptr;  // count() > 0 when --device was given
  std::string op;
  bool large = false;
  bool verbose = false;
  bool placement = false;     // run every case through op placement (Options::placement)
  std::string fallback_host;  // --fallback-host B: set_op_fallback(backend, "host:B") first
};

constexpr std::size_t kDetailWidth = 150;

std::string pad(std::string text, std::size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

std::string pad_left(const std::string& text, std::size_t width) {
  return text.size() < width ? std::string(width - text.size(), ' ') + text : text;
}

std::string one_line(std::string text, std::size_t width) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  if (text.size() > width) text = text.substr(0, width - 3) + "...";
  return text;
}

// A device of another loaded backend for the cross-backend `to` cases:
// cpu when it is not the backend under test, else the first other one.
Device peer_for(const Registry& registry, const Backend& tested) {
  std::optional<Device> first;
  for (const Backend& b : registry.backends()) {
    if (b.name() == tested.name() || !b.loaded() || b.device_count() == 0) continue;
    if (b.name() == "cpu") return b.device(0);
    if (!first) first = b.device(0);
  }
  return first.value_or(Device{});
}

// A row's op: the suite's name, with the plugin op it runs on when that is
// named otherwise ("to (copy)", "reshape (copy)").
std::string row_name(const bc::Tally& t) {
  return t.plugin_op.empty() || t.plugin_op == t.op ? t.op : t.op + " (" + t.plugin_op + ")";
}

// The rows that ran at least one case; an (op, dtype) that is wholly
// unsupported is left to the per-group lines below the table.
std::string table(const std::vector<bc::Tally>& all) {
  std::vector<bc::Tally> rows;
  for (const bc::Tally& t : all)
    if (t.passed + t.failed + t.skipped > 0) rows.push_back(t);
  if (rows.empty()) return "(no case ran: every op is unsupported)\n";
  std::size_t op_width = 2, dtype_width = 5;
  for (const bc::Tally& t : rows) {
    op_width = std::max(op_width, row_name(t).size());
    dtype_width = std::max(dtype_width, t.dtype.size());
  }
  op_width += 2;
  dtype_width += 2;
  std::string out =
      pad("op", op_width) + pad("dtype", dtype_width) + "  pass  fail  skip  unsup  first failure\n";
  for (const bc::Tally& t : rows) {
    out += pad(row_name(t), op_width) + pad(t.dtype, dtype_width) + pad_left(std::to_string(t.passed), 6) +
           pad_left(std::to_string(t.failed), 6) + pad_left(std::to_string(t.skipped), 6) +
           pad_left(std::to_string(t.unsupported), 7);
    if (!t.first_failure.empty()) out += "  " + one_line(t.first_failure, kDetailWidth);
    out += '\n';
  }
  return out;
}

// Placement mode: what ran on the op_fallback during the run, in one line.
std::string placed_summary(const Backend& backend) {
  const std::vector<OpFallbackStats> stats = backend.op_fallback_stats();
  uint64_t calls = 0, moved = 0;
  for (const OpFallbackStats& s : stats) {
    calls += s.calls;
    moved += s.bytes_moved();
  }
  return "op_fallback \"" + backend.op_fallback().to_string() + "\" ran " + std::to_string(calls) +
         " op call(s) for " + std::to_string(stats.size()) + " (op, dtype) pair(s), moving " +
         (moved == 0 ? std::string("0 bytes") : format_bytes(moved)) + "\n";
}

int run_conformance_command(const ConformanceOptions& options) {
  const std::vector<std::string>& ops = bc::op_names();
  if (!options.op.empty() && std::find(ops.begin(), ops.end(), options.op) == ops.end()) {
    std::string known;
    for (const std::string& op : ops) known += (known.empty() ? "" : " ") + op;
    throw CommandError(kExitUsage,
                       "--op: the suite has no op named '" + options.op + "'\nknown ops: " + known);
  }

  if (!options.fallback_host.empty()) {
    if (options.backend.empty()) throw CommandError(kExitUsage, "--fallback-host needs --backend NAME");
    if (!options.placement) {
      throw CommandError(
          kExitUsage,
          "--fallback-host needs --placement: without it the suite tests the backend's own ops "
          "with every op_fallback off");
    }
  }

  const fs::path config = choose_config(options.config);
  const Registry registry = load_for_report(config);
  const bool one_device = options.device_option != nullptr && options.device_option->count() > 0;

  // The backends to test: the one named, else every configured one (those that
  // failed to load are reported; a required one among them fails the run).
  std::vector<Backend> backends;
  if (!options.backend.empty()) {
    backends.push_back(find_backend(registry, options.backend, kExitConfig));
    if (!options.fallback_host.empty()) {
      OpFallback fallback;
      fallback.kind = OpFallback::Kind::host;
      fallback.host_backend = options.fallback_host;
      try {
        registry.set_op_fallback(options.backend, fallback);
      } catch (const Error& e) {
        throw CommandError(kExitConfig, "--fallback-host " + options.fallback_host + ": " + e.message());
      }
    }
  } else {
    if (one_device) throw CommandError(kExitUsage, "--device needs --backend NAME");
    backends = registry.backends();
  }

  bool load_failed = false;
  std::vector<std::pair<Backend, Device>> targets;
  std::vector<std::string> not_tested;  // --placement without --backend: those with no op_fallback
  for (const Backend& backend : backends) {
    if (!backend.loaded()) {
      const bool unavailable = backend.status() == Backend::Status::unavailable;
      const std::string message =
          "backend \"" + backend.name() + "\" " + (unavailable ? "is unavailable" : "failed to load") +
          ", not tested: " + backend.error() + "\nhint: " + failure_hint(backend, config);
      if (backend.required() || !options.backend.empty()) {
        print_error(message);
        load_failed = true;
      } else {
        print_warning(message);
      }
      continue;
    }
    if (options.placement && backend.op_fallback().kind != OpFallback::Kind::host) {
      const char* env = std::getenv("BACKPLANE_OP_FALLBACK");
      const bool disabled = env != nullptr && std::string_view(env) == "error";
      const std::string why =
          "backend \"" + backend.name() + "\" has op_fallback \"" + backend.op_fallback().to_string() +
          "\": --placement tests op placement and needs one (\"op_fallback\": \"host:<backend>\" in " +
          config.string() + ", or --fallback-host NAME)" +
          (disabled ? "; BACKPLANE_OP_FALLBACK=error is set, which turns every op_fallback off" : "");
      if (!options.backend.empty()) throw CommandError(kExitConfig, why);
      not_tested.push_back("not tested with --placement: " + why);
      continue;
    }
    if (one_device) {
      if (options.device < 0 || options.device >= backend.device_count()) {
        throw CommandError(kExitFailed, "--device " + std::to_string(options.device) + ": backend \"" +
                                            backend.name() + "\" has " +
                                            std::to_string(backend.device_count()) + " device(s)");
      }
      targets.emplace_back(backend, backend.device(static_cast<int32_t>(options.device)));
      continue;
    }
    for (const Device& device : backend.devices()) targets.emplace_back(backend, device);
  }
  if (targets.empty()) {
    if (options.placement && !load_failed)
      throw CommandError(kExitConfig,
                         "--placement: no backend of " + config.string() + " has an op_fallback");
    throw CommandError(kExitFailed,
                       load_failed ? "no backend left to test" : "no device to test in " + config.string());
  }

  bc::Options run_options;
  run_options.op = options.op;
  run_options.verbose = options.verbose;
  run_options.max_bytes = options.large ? std::numeric_limits<uint64_t>::max() : 0;
  run_options.placement = options.placement;
  if (options.verbose) {
    run_options.on_result = [](const bc::CaseResult& r) {
      std::cout << pad(bc::to_string(r.outcome), 12) << r.op << " " << r.dtype << "  " << r.case_name;
      if (!r.detail.empty()) std::cout << "\n            " << indent_continuation(r.detail, 12);
      std::cout << std::endl;
    };
  }

  std::cout << "config " << shown_config_path(registry, config).string() << "\n";
  for (const std::string& line : not_tested) std::cout << line << "\n";
  int total_failed = 0;
  std::vector<std::string> summaries, failing;
  for (const auto& [backend, device] : targets) {
    run_options.peer = peer_for(registry, backend);
    std::cout << "\nconformance of " << device.id() << " (" << device.name() << "), plugin " << backend.name()
              << " " << backend.version();
    if (run_options.peer.valid()) std::cout << "; peer for `to`: " << run_options.peer.id();
    if (options.placement)
      std::cout << "\nplacement mode: every case runs, what the device lacks on op_fallback \""
                << backend.op_fallback().to_string() << "\"";
    std::cout << "\n" << std::flush;
    if (options.placement) backend.reset_op_fallback_stats();
    const std::vector<bc::CaseResult> results = bc::run_conformance(device, run_options);
    const std::vector<bc::Tally> rows = bc::tally(results);
    std::cout << (options.verbose ? "\n" : "") << table(rows);
    if (options.placement) std::cout << placed_summary(backend);
    for (const bc::UnsupportedGroup& f : bc::unsupported_by_group(results))
      std::cout << "unsupported: " << f.group << ": " << f.text << " (" << f.cases << " case"
                << (f.cases == 1 ? "" : "s") << ")\n";
    int passed = 0, failed = 0, skipped = 0, unsupported = 0;
    for (const bc::Tally& t : rows) {
      passed += t.passed;
      failed += t.failed;
      skipped += t.skipped;
      unsupported += t.unsupported;
    }
    total_failed += failed;
    if (failed > 0) failing.push_back(device.id());
    summaries.push_back(device.id() + ": " + std::to_string(results.size()) + " cases, " +
                        std::to_string(passed) + " passed, " + std::to_string(failed) + " failed, " +
                        std::to_string(skipped) + " skipped, " + std::to_string(unsupported) +
                        " unsupported");
  }
  std::cout << "\n";
  for (const std::string& s : summaries) std::cout << "summary " << s << "\n";
  std::cout << (total_failed == 0 && !load_failed ? "conformance: PASS" : "conformance: FAIL") << std::endl;
  if (total_failed > 0) {
    std::string where;
    for (const std::string& id : failing) where += (where.empty() ? "" : ", ") + id;
    print_error(std::to_string(total_failed) + " conformance case(s) failed on " + where +
                "; rerun with --op NAME --verbose for every case's detail");
  }
  return total_failed > 0 || load_failed ? kExitFailed : kExitOk;
}

}  // namespace

Command add_conformance_command(CLI::App& parent) {
  auto options = std::make_shared<ConformanceOptions>();
  CLI::App* sub = parent.add_subcommand(
      "conformance",
      "Run the conformance suite (every op and dtype against a double-precision reference) on a backend");
  sub->add_option("-c,--config", options->config, "The backends.json to read")->type_name("FILE");
  sub->add_option("-b,--backend", options->backend,
                  "The backend to test (default: every backend of the config)")
      ->type_name("NAME");
  options->device_option =
      sub->add_option("-d,--device", options->device, "Test only this device index (default: every device)")
          ->type_name("I");
  sub->add_option("--op", options->op, "Run only the cases of this op (e.g. add, matmul, softmax)")
      ->type_name("NAME");
  sub->add_flag(
      "--large", options->large,
      "Also run the large cases (tensors over 2^31 bytes) where MemAvailable allows; off by default");
  sub->add_flag("-v,--verbose", options->verbose, "Print every case as it runs, with its detail");
  sub->add_flag("--placement", options->placement,
                "Run every case through op placement: what the device lacks runs on its backend's "
                "op_fallback and must still pass (needs an op_fallback)");
  sub->add_option("--fallback-host", options->fallback_host,
                  "With --placement: use backend NAME as the tested backend's op_fallback (host:NAME) "
                  "instead of the config's")
      ->type_name("NAME");
  sub->footer(
      "Unsupported ops are reported, not failures; every op_fallback is off, so only the backend's own\n"
      "ops are tested. With --placement every case must pass, through the op_fallback where needed.\n"
      "Tolerances: docs/plugins.md#tolerances.\n"
      "Exit codes: 0 no case failed, 1 a case failed or the backend did not load, 2 config problem\n"
      "(unknown backend included), 64 bad command line.");
  return {sub, [options] { return run_conformance_command(*options); }};
}

}  // namespace backplane::cli
