#!/usr/bin/env bash
# Installs the Debian 12 packages backplane needs to build and test.
# Idempotent: when every package is already installed it does nothing (fast).
set -euo pipefail

packages=(
  build-essential cmake ninja-build g++ pkg-config python3 git
  libboost-dev nlohmann-json3-dev doctest-dev libcli11-dev
  libopenblas-dev libdlpack-dev libgloo-dev libssl-dev
  libopenmpi-dev openmpi-bin zlib1g-dev
  iproute2 clang-format
  libflatbuffers-dev flatbuffers-compiler clang libclang-rt-14-dev
  pybind11-dev python3-dev python3-numpy python3-torch libtorch-dev python3-pytest
  munge slurmctld slurmd slurm-client
)

missing=()
for pkg in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
  [[ "$status" == "installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages are installed"
  exit 0
fi

if [[ "$(id -u)" -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "install-deps: error: not root and sudo is not available; install as root: ${missing[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# munge, slurmctld and slurmd are daemons whose packages start them on
# install; scripts/local-slurm.sh starts its own, with its own config and key,
# when asked. A policy-rc.d that denies every start keeps the install from
# starting them (or failing to, in a container without systemd); one already
# there (Docker images have one) is left as it is.
policy=/usr/sbin/policy-rc.d
if [[ ! -e "$policy" ]]; then
  "${sudo[@]}" sh -c "printf '#!/bin/sh\n# install-deps.sh: no daemon starts during its install\nexit 101\n' >$policy && chmod 0755 $policy"
  trap '"${sudo[@]}" rm -f "$policy"' EXIT
fi
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
