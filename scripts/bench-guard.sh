#!/usr/bin/env bash
# The training step's regression guard, run after the test suite by the
# README's test command (and so by .ci/run): build/bin/bench_train_guard
# times the 1-rank training step against the same step written on
# cblas_sgemm, in one process, and fails only when the CPU-time ratio exceeds
# the limit below, twice the ratio recorded in docs/benchmarks.md: a gross
# regression, never the noise of a shared machine. It prints its figures
# either way and takes a few seconds.
#
#   scripts/bench-guard.sh [BUILD_DIR]     (default build, the release preset's)
#
# A build configured with BACKPLANE_BUILD_BENCH=OFF has no guard to run: it is
# skipped, saying so. Re-record the ratio (docs/benchmarks.md says how) when
# the step gets faster on purpose, and move the limit with it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

limit=1.9  # 2 x 0.95, the CPU-time ratio recorded in docs/benchmarks.md

build="${1:-build}"
guard="$build/bin/bench_train_guard"
if [[ ! -x "$guard" ]]; then
  if grep -qx 'BACKPLANE_BUILD_BENCH:BOOL=OFF' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "bench-guard: skipped: $build is configured with BACKPLANE_BUILD_BENCH=OFF (no benchmarks)"
    exit 0
  fi
  echo "bench-guard: $guard is missing; build it: cmake --build $build --target bench_train_guard" >&2
  exit 1
fi
# One thread for both sides: no OpenMP team, and no OpenBLAS pool started only to idle.
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 exec "$guard" --check-ratio "$limit"
