#!/usr/bin/env bash
# Builds backplane with the cuda plugin (release) and gathers into one folder
# what scripts/gpu-check.sh runs on a GPU machine that has CUDA, cuBLAS, NCCL
# and PyTorch but none of backplane's other dependencies (Boost, Gloo,
# OpenBLAS, ...) and where nothing can be installed: the CLI, libbackplane,
# the plugins, the cuda tests, the digits data, a backends.json naming the
# bundled plugins, gpu-check.sh itself, and every shared library those need
# that a GPU image does not bring (what ldd resolves, minus the C/C++
# runtime, which the image has newer, and the CUDA/NCCL libraries, which
# must be the image's own).
#
#   scripts/make-gpu-bundle.sh [OUT_DIR]    (default: gpu-bundle)
#   BUILD_DIR=...  the build folder (default: build-gpu-bundle)
#   JOBS=...       parallel build jobs (default: 2)
#   extra CMake arguments in CMAKE_ARGS (e.g. -DCMAKE_CUDA_ARCHITECTURES=...)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-gpu-bundle}")"
build="$(realpath -m "${BUILD_DIR:-$root/build-gpu-bundle}")"
jobs="${JOBS:-2}"
# The bundle must stay small enough to carry (the GPU machine's limit).
max_bytes=$((64 * 1024 * 1024))

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
# shellcheck disable=SC2086
cmake -S "$root" --preset release -B "$build" -DBACKPLANE_WITH_CUDA=ON -DBACKPLANE_BUILD_BENCH=OFF \
  -DBACKPLANE_BUILD_EXAMPLES=OFF "${launcher[@]}" ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$jobs" --target backplane_cli backplane_cpu backplane_cuda_nccl \
  backplane_cuda_nccl_engine backplane_cuda_gpu_tests backplane_cuda_host_tests

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/plugins" "$out/share/backplane"
cp "$build/bin/backplane" "$build/bin/backplane_cuda_gpu_tests" "$build/bin/backplane_cuda_host_tests" "$out/bin/"
cp -P "$build"/lib/libbackplane.so* "$out/lib/"
cp "$build"/plugins/libbackplane_cpu.so "$build"/plugins/libbackplane_cpu_engine.so \
  "$build"/plugins/libbackplane_cuda_nccl.so "$build"/plugins/libbackplane_cuda_nccl_engine.so "$out/plugins/"
cp "$root/data/digits.csv.gz" "$out/share/backplane/"
cp "$root/scripts/gpu-check.sh" "$out/"
cat > "$out/backends.json" <<'JSON'
{
  "schema_version": 1,
  "plugin_dirs": ["plugins"],
  "default_backend": "cpu",
  "backends": [
    {"name": "cpu", "library": "backplane_cpu", "required": true, "collective_fallback": "error"},
    {"name": "cuda", "library": "backplane_cuda_nccl", "required": false, "collective_fallback": "error"}
  ]
}
JSON

# Libraries a GPU image has itself: the C/C++ runtime (newer there) and the
# CUDA/NCCL/driver libraries (which must be the image's).
is_system() {
  case "$(basename "$1")" in
    ld-linux*|libc.so*|libm.so*|libmvec.so*|libdl.so*|librt.so*|libpthread.so*|libstdc++.so*|libgcc_s.so*|linux-vdso*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas*|libnccl*|libnvidia*|libnvrtc*|libnvJitLink*) return 0 ;;
  esac
  return 1
}
# Every library ldd resolves for the bundle's binaries (the plugins' own
# folder and lib/ first, as gpu-check.sh arranges at run time).
export LD_LIBRARY_PATH="$out/lib:$out/plugins${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for f in "$out"/bin/* "$out"/lib/libbackplane.so* "$out"/plugins/*.so; do
  [[ -L "$f" ]] && continue
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" && -f "$path" ]] || continue
    is_system "$name" && continue
    case "$path" in "$out"/*) continue ;; esac
    [[ -e "$out/lib/$name" ]] || cp -L "$path" "$out/lib/$name"
  done < <(ldd "$f" 2>/dev/null)
done
# The copied libraries' own dependencies (libgloo -> libibverbs, ...): one more pass.
for f in "$out"/lib/*.so*; do
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" && -f "$path" ]] || continue
    is_system "$name" && continue
    case "$path" in "$out"/*) continue ;; esac
    [[ -e "$out/lib/$name" ]] || cp -L "$path" "$out/lib/$name"
  done < <(ldd "$f" 2>/dev/null)
done
# Symbols only make the bundle bigger. One file at a time, in a subshell: a
# strip that fails (or crashes) on one file leaves that file as it was.
for f in "$out"/bin/* "$out"/lib/*.so* "$out"/plugins/*.so; do
  [[ -L "$f" ]] && continue
  (strip --strip-unneeded "$f") >/dev/null 2>&1 || true
done

bytes=$(du -sb "$out" | cut -f1)
echo "bundle: $out ($((bytes / 1024 / 1024)) MiB; libraries: $(cd "$out/lib" && ls | tr '\n' ' '))"
if (( bytes > max_bytes )); then
  echo "error: the bundle is $((bytes / 1024 / 1024)) MiB, over the 64 MiB a GPU machine accepts" >&2
  exit 1
fi
echo "on the GPU machine: bash $(basename "$out")/gpu-check.sh"
