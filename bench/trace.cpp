// What --trace costs the main job: `backplane train` with and without
// --trace, alternating in the same run, so that a change in the machine's
// load falls on both.
//
//   bench_trace [nproc] [epochs] [repeats]        (default 2, 5 and 5)
//
// Prints each run's ms/step (train's own --metrics-out seconds_per_step: one
// step from making the batch to the loss read back, averaged over every step
// of rank 0) and the median of the repeats' ratios traced / untraced; the
// target is at most 1.15. Also the traced file's size and event count, and
// that nothing was dropped.
#include "bench_util.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// seconds_per_step of one run, in ms; -1 when it failed (printed).
double ms_per_step(const fs::path& config, int nproc, int epochs, const fs::path& dir,
                   const fs::path& trace) {
  const fs::path metrics = dir / "metrics.json";
  fs::remove(metrics);
  std::string cmd = std::string(BP_BENCH_CLI) + " train --nproc " + std::to_string(nproc) + " --epochs " +
                    std::to_string(epochs) + " --config " + config.string() + " --data " + BP_BENCH_DATA +
                    " --metrics-out " + metrics.string();
  if (!trace.empty()) cmd += " --trace " + trace.string();
  const std::string out = bench::run_command(cmd);
  std::ifstream in(metrics);
  if (!in) {
    std::cerr << "bench_trace: `" << cmd << "` failed:\n" << out;
    return -1;
  }
  return nlohmann::json::parse(in)["seconds_per_step"].get<double>() * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const int nproc = argc > 1 ? std::atoi(argv[1]) : 2;
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 5;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  if (nproc < 1 || epochs < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: bench_trace [nproc >= 1] [epochs >= 1] [repeats >= 1]\n");
    return 64;
  }
  const fs::path dir = fs::temp_directory_path() / ("bench_trace_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path config = dir / "backends.json";
  std::ofstream(config)
      << R"({"schema_version": 1, "plugin_dirs": [")" << BP_BENCH_PLUGIN_DIR
      << R"("], "backends": [{"name": "cpu", "library": "backplane_cpu", "required": true}]})";
  const fs::path trace = dir / "trace.json";
  std::vector<double> off, on, ratios;
  for (int r = 0; r < repeats; ++r) {
    // Alternate the order, so neither side always runs first.
    double a = 0, b = 0;
    if (r % 2 == 0) {
      a = ms_per_step(config, nproc, epochs, dir, {});
      b = ms_per_step(config, nproc, epochs, dir, trace);
    } else {
      b = ms_per_step(config, nproc, epochs, dir, trace);
      a = ms_per_step(config, nproc, epochs, dir, {});
    }
    if (a <= 0 || b <= 0) return 1;
    off.push_back(a);
    on.push_back(b);
    ratios.push_back(b / a);
    std::printf("repeat %d: untraced %.4f ms/step, traced %.4f ms/step, ratio %.3f\n", r + 1, a, b, b / a);
  }
  std::ifstream in(trace);
  const nlohmann::json t = nlohmann::json::parse(in, nullptr, false);
  uint64_t events = 0, dropped = 0;
  if (!t.is_discarded()) {
    for (const auto& rank : t["otherData"]["backplane_trace"]["ranks"]) {
      events += rank["events"].get<uint64_t>();
      dropped += rank["dropped"].get<uint64_t>();
    }
  }
  std::printf(
      "\nbackplane train --nproc %d --epochs %d, %d repeats alternating: untraced %.4f ms/step, traced %.4f "
      "ms/step (medians)\ntraced / untraced: %.3f (median of the repeats' ratios; target <= 1.15)\n"
      "the last trace: %.1f MB, %llu events, %llu dropped\n",
      nproc, epochs, repeats, bench::median(off), bench::median(on), bench::median(ratios),
      static_cast<double>(fs::file_size(trace)) / 1e6, static_cast<unsigned long long>(events),
      static_cast<unsigned long long>(dropped));
  fs::remove_all(dir);
  return 0;
}
