// Timing helpers shared by the benchmarks: median of repeated batches.
#ifndef BACKPLANE_BENCH_UTIL_HPP_
#define BACKPLANE_BENCH_UTIL_HPP_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace bench {

inline double now_ns() {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
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

}  // namespace bench

#endif  // BACKPLANE_BENCH_UTIL_HPP_
