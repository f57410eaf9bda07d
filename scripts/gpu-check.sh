#!/usr/bin/env bash
# The cuda backend's check on a GPU machine, run from a bundle that
# scripts/make-gpu-bundle.sh made (this script is copied into it):
#
#   bash gpu-bundle/gpu-check.sh [BUNDLE_DIR]    (default: this script's folder)
#
# It finds the machine's CUDA libraries (cuBLAS, NCCL: /usr/local/cuda, or a
# Python environment's nvidia/* packages), then runs each step under a time
# limit and prints a summary: backplane list and check (and that listing maps
# neither cuBLAS nor NCCL), the host-logic tests,
# the GPU tests (ops against the cpu backend, conformance, gather's sticky
# error, DLPack, NCCL all_reduce), backplane conformance on cuda, and a short
# backplane train on cuda. Exit status: 0 when every step passed, 1 when one
# failed, 2 when the machine has no usable GPU (the reason is printed).
set -uo pipefail
bundle="$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")}" && pwd)"
config="$bundle/backends.json"
cli="$bundle/bin/backplane"
step_limit="${STEP_LIMIT:-240}"  # seconds per step (conformance and tests are the long ones)

# ---- libraries ------------------------------------------------------------------
libs="$bundle/lib:$bundle/plugins"
have_lib() { ldconfig -p 2>/dev/null | grep -q "$1" || compgen -G "/usr/local/cuda/lib*/$1*" >/dev/null; }
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [[ -d "$d" ]] && libs="$libs:$d"; done
if ! have_lib libnccl.so.2 || ! have_lib libcublas.so.13; then
  for py in python3 python; do
    command -v "$py" >/dev/null 2>&1 || continue
    site="$("$py" -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null)" || continue
    [[ -n "$site" ]] || continue
    for d in "$site"/nvidia/*/lib; do [[ -d "$d" ]] && libs="$libs:$d"; done
    break
  done
fi
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# ---- steps ------------------------------------------------------------------------
declare -a names results
run_step() {  # run_step NAME COMMAND...
  local name="$1"
  shift
  echo
  echo "=== $name: $*"
  local start=$SECONDS
  timeout --kill-after=10 "$step_limit" "$@"
  local rc=$?
  local took=$((SECONDS - start))
  local verdict="PASS"
  if (( rc == 77 )); then verdict="SKIP"; elif (( rc == 124 || rc == 137 )); then verdict="TIMEOUT"; elif (( rc != 0 )); then verdict="FAIL (exit $rc)"; fi
  names+=("$name")
  results+=("$verdict (${took}s)")
  return $rc
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
run_step "list" "$cli" list --config "$config"
# The cuda backend's device count, from the list's "devices" line of its section.
gpus="$(timeout 60 "$cli" list --config "$config" 2>/dev/null | awk '/^cuda( |$)/{f=1; next} /^[^ ]/{f=0} f && $1=="devices"{print $2; exit}')"
gpus="${gpus:-0}"
run_step "check" "$cli" check --config "$config"
# Listing loads only the cuda plugin's front: the engine (cuBLAS, NCCL) loads at a device's first use.
# shellcheck disable=SC2016
run_step "list maps no cuBLAS or NCCL" bash -c 'loads="$(LD_DEBUG=files "$0" list --config "$1" 2>&1 >/dev/null)" &&
  ! grep -E "file=.*(libcublas|libnccl|libbackplane_cuda_nccl_engine)" <<<"$loads"' "$cli" "$config"
run_step "host-logic tests" "$bundle/bin/backplane_cuda_host_tests"
if [[ "$gpus" == "0" ]]; then
  reason="$("$cli" list --config "$config" 2>/dev/null | grep -m1 '^cuda: 0 devices' || echo 'cuda: 0 devices (see list above)')"
  echo
  echo "no usable GPU: $reason"
  names+=("gpu steps")
  results+=("NOT RUN: $reason")
  status=2
else
  run_step "cuda tests" "$bundle/bin/backplane_cuda_gpu_tests" --duration=true
  run_step "conformance (cuda)" "$cli" conformance --config "$config" --backend cuda
  run_step "train (cuda, 1 rank per GPU)" "$cli" train --config "$config" --backend cuda --nproc "$gpus" \
    --epochs 2 --data "$bundle/share/backplane/digits.csv.gz" --metrics-out "$work/train_cuda.json"
  run_step "train (cpu, the reference)" "$cli" train --config "$config" --backend cpu --nproc "$gpus" \
    --epochs 2 --data "$bundle/share/backplane/digits.csv.gz" --metrics-out "$work/train_cpu.json"
  [[ -f "$work/train_cuda.json" ]] && echo "cuda: $(cat "$work/train_cuda.json")"
  [[ -f "$work/train_cpu.json" ]] && echo "cpu:  $(cat "$work/train_cpu.json")"
  status=0
fi

echo
echo "=== summary ($gpus GPU(s))"
for i in "${!names[@]}"; do
  printf '  %-32s %s\n' "${names[$i]}" "${results[$i]}"
  [[ "${results[$i]}" == FAIL* || "${results[$i]}" == TIMEOUT* ]] && status=1
done
exit "$status"
