// Threading and copy kernels of the cpu plugin. Pure functions over raw pointers
// (no ABI types, no state), so benchmarks compile and time the very same code.
// Build with OpenMP (-fopenmp) for threads and `omp simd`; without it they run serially.
#ifndef BACKPLANE_PLUGINS_CPU_KERNELS_HPP_
#define BACKPLANE_PLUGINS_CPU_KERNELS_HPP_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <backplane/plugin/strided.hpp>

#include "fp_mode.hpp"

#ifdef _OPENMP
#include <omp.h>
#define BP_CPU_PRAGMA(x) _Pragma(#x)
#else
#define BP_CPU_PRAGMA(x)
#endif

// Hot contiguous loops are compiled twice, for AVX2 and for the x86-64 baseline, and
// picked once at load time (an ifunc), so one binary runs everywhere yet uses AVX2
// where it exists. Define BACKPLANE_CPU_NO_CLONES to get the baseline only (to compare).
// Not under ThreadSanitizer: it instruments the ifunc resolvers, which an executable
// runs before the sanitizer's runtime is initialised (a crash at startup).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(BACKPLANE_CPU_NO_CLONES) && \
    !defined(__SANITIZE_THREAD__)
#define BP_CPU_CLONES     __attribute__((target_clones("avx2", "default")))
#define BP_CPU_HAS_CLONES 1
#else
#define BP_CPU_CLONES
#define BP_CPU_HAS_CLONES 0
#endif

namespace backplane::cpu {

// Below this many elements an op runs on the calling thread: waking a team costs
// microseconds, more than a small op itself.
inline constexpr int64_t kParallelMinElements = 32768;
// Each extra thread must get at least this much work.
inline constexpr int64_t kElementsPerThread = 16384;
// Largest ndim a strided kernel accepts (fixed arrays keep the hot path allocation-free).
using plugin::kMaxDims;

// Threads to use for `elements` of work given the configured count (>= 1).
inline int threads_for(int64_t elements, int threads) noexcept {
  if (threads <= 1 || elements < kParallelMinElements) return 1;
  return static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(1, elements / kElementsPerThread)));
}

// Runs fn(lo, hi) -> bool over [0, n) split into one chunk for each of `team`
// threads; chunk starts are multiples of 64 elements so threads do not write the
// same cache lines. Returns the AND of all results. fn must not throw.
template <class Fn>
bool run_chunks(int64_t n, int team, Fn&& fn) {
  if (team <= 1) return fn(int64_t{0}, n);
  bool ok = true;
#ifdef _OPENMP
  const unsigned mode = fp_mode();  // the team computes as the caller does (fp_mode.hpp)
  BP_CPU_PRAGMA(omp parallel num_threads(team) reduction(&& : ok)) {
    const FpModeScope fp(mode);
    const int64_t nt = omp_get_num_threads();
    const int64_t per = ((n + nt - 1) / nt + 63) / 64 * 64;
    const int64_t lo = std::min(n, omp_get_thread_num() * per);
    const int64_t hi = std::min(n, lo + per);
    if (lo < hi) ok = fn(lo, hi);
  }
#else
  ok = fn(int64_t{0}, n);
#endif
  return ok;
}

// run_chunks with a team sized for n elements of work.
template <class Fn>
bool parallel_for_chunks(int64_t n, int threads, Fn&& fn) {
  return run_chunks(n, threads_for(n, threads), static_cast<Fn&&>(fn));
}

// Like parallel_for_chunks, over `rows` rows of `row_elements` elements each.
template <class Fn>
bool parallel_for_rows(int64_t rows, int64_t row_elements, int threads, Fn&& fn) {
  const int t = threads_for(rows * row_elements, threads);
  if (t <= 1 || rows < 2) return fn(int64_t{0}, rows);
  bool ok = true;
#ifdef _OPENMP
  const unsigned mode = fp_mode();
  BP_CPU_PRAGMA(omp parallel num_threads(static_cast<int>(std::min<int64_t>(t, rows))) reduction(&& : ok)) {
    const FpModeScope fp(mode);
    const int64_t nt = omp_get_num_threads();
    const int64_t id = omp_get_thread_num();
    const int64_t lo = rows * id / nt;
    const int64_t hi = rows * (id + 1) / nt;
    if (lo < hi) ok = fn(lo, hi);
  }
#else
  ok = fn(int64_t{0}, rows);
#endif
  return ok;
}

// ---------------------------------------------------------------------------
// Iteration space: the SDK's (operand 0 is the output by convention here)
// ---------------------------------------------------------------------------

using plugin::coalesce;
using plugin::for_each_row;
using plugin::StridedLayout;

// ---------------------------------------------------------------------------
// Copy (any dtype, moved as raw elements of 1, 2, 4 or 8 bytes)
// ---------------------------------------------------------------------------

// Contiguous copy; large copies use several threads (one thread does not saturate
// memory bandwidth). dst and src must not overlap.
inline void copy_bytes(void* dst, const void* src, int64_t bytes, int threads) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // The threading threshold counts 8-byte elements; chunks are in bytes.
  run_chunks(bytes, threads_for(bytes / 8, threads), [=](int64_t lo, int64_t hi) {
    std::memcpy(d + lo, s + lo, static_cast<std::size_t>(hi - lo));
    return true;
  });
}

// dst = src over a coalesced layout (operands: 0 = dst, 1 = src) of elements of type
// E (an unsigned integer of the element's size). dst must not overlap src.
template <class E>
void copy_strided(const StridedLayout<2>& l, const E* src, E* dst, int threads) {
  const int inner = l.ndim - 1;
  const int64_t n = l.shape[inner];
  const int64_t sd = l.strides[0][inner];
  const int64_t ss = l.strides[1][inner];
  if (l.ndim == 1 && sd == 1 && ss == 1) {
    copy_bytes(dst, src, n * static_cast<int64_t>(sizeof(E)), threads);
    return;
  }
  const auto copy_row = [=](E* d, const E* s, int64_t count) {
    if (sd == 1 && ss == 1) {
      std::memcpy(d, s, static_cast<std::size_t>(count) * sizeof(E));
    } else if (sd == 1 && ss == 0) {
      std::fill(d, d + count, *s);
    } else if (sd == 1) {
      for (int64_t i = 0; i < count; ++i) d[i] = s[i * ss];
    } else {
      for (int64_t i = 0; i < count; ++i) d[i * sd] = s[i * ss];
    }
  };
  if (l.ndim == 1) {  // one long strided row: split it, not the (single) row count
    parallel_for_chunks(n, threads, [=](int64_t lo, int64_t hi) {
      copy_row(dst + lo * sd, src + lo * ss, hi - lo);
      return true;
    });
    return;
  }
  int64_t rows = 1;
  for (int d = 0; d < inner; ++d) rows *= l.shape[d];
  parallel_for_rows(rows, n, threads, [&](int64_t r0, int64_t r1) {
    for_each_row(l, r0, r1, [&](const int64_t* off) { copy_row(dst + off[0], src + off[1], n); });
    return true;
  });
}

// copy_strided for an element size known only at run time (1, 2, 4 or 8 bytes).
// Returns false for any other size.
inline bool copy_strided_bytes(const StridedLayout<2>& l, const void* src, void* dst, int element_size,
                               int threads) {
  switch (element_size) {
    case 1:
      copy_strided(l, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), threads);
      return true;
    case 2:
      copy_strided(l, static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), threads);
      return true;
    case 4:
      copy_strided(l, static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), threads);
      return true;
    case 8:
      copy_strided(l, static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst), threads);
      return true;
    default:
      return false;
  }
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_KERNELS_HPP_
