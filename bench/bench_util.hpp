// Timing helpers shared by the benchmarks: median of repeated batches.
#ifndef BACKPLANE_BENCH_UTIL_HPP_
#define BACKPLANE_BENCH_UTIL_HPP_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace bench {

inline double now_ns() {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count());
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Nanoseconds per call of fn: median over `batches` batches of `iters` calls.
template <class Fn>
double ns_per_call(Fn&& fn, int iters, int batches) {
  std::vector<double> samples;
  for (int b = 0; b < batches; ++b) {
    const double t0 = now_ns();
    for (int i = 0; i < iters; ++i) fn();
    samples.push_back((now_ns() - t0) / iters);
  }
  return median(samples);
}

// Runs a Python one-liner that prints one number (a median, like ours), with the first interpreter
// that has torch: Debian's python3-torch lives under the system python3, which
// may not be the first python3 on PATH. Returns -1 when none has torch.
// PyTorch runs in a separate process so its threads never disturb ours.
inline double torch_measure(const std::string& python_code) {
  for (const char* python : {"/usr/bin/python3", "python3"}) {
    const std::string cmd =
        std::string(python) + " -c \"import torch,timeit;" + python_code + "\" 2>/dev/null";
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), &pclose);
    if (!pipe) continue;
    char buf[128] = {};
    if (std::fgets(buf, sizeof buf, pipe.get()) != nullptr && std::atof(buf) > 0) return std::atof(buf);
  }
  return -1;
}

// Runs a shell command; returns what it printed on stdout and stderr.
inline std::string run_command(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen((cmd + " 2>&1").c_str(), "r"), &pclose);
  std::string out;
  if (!pipe) return out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe.get()) != nullptr) out += buf;
  return out;
}

}  // namespace bench

#endif  // BACKPLANE_BENCH_UTIL_HPP_
