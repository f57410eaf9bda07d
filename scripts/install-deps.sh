#!/usr/bin/env bash
# Installs the Debian 12 packages backplane needs to build and test, then the
# trace viewer test's npm packages (tests/trace_viewer, pinned by its
# package-lock.json).
# Idempotent: when every package is already installed it does nothing (fast).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(
  build-essential cmake ninja-build g++ pkg-config python3 git
  libboost-dev nlohmann-json3-dev doctest-dev libcli11-dev
  libopenblas-dev libdlpack-dev libgloo-dev libssl-dev
  libopenmpi-dev openmpi-bin zlib1g-dev
  iproute2 clang-format
  libflatbuffers-dev flatbuffers-compiler clang libclang-rt-14-dev
  pybind11-dev python3-dev python3-numpy python3-torch libtorch-dev python3-pytest
  munge slurmctld slurmd slurm-client
  chromium nodejs
)
# npm: Debian's package, unless the nodejs installed already carries npm
# (NodeSource's does, and conflicts with Debian's npm package).
command -v npm >/dev/null 2>&1 || packages+=(npm)

# The trace viewer test's speedscope and playwright-core, as its lock file
# pins them; run again only when the lock file changed.
viewer=tests/trace_viewer
install_viewer_packages() {
  if cmp -s "$viewer/package-lock.json" "$viewer/node_modules/.installed-package-lock.json"; then
    echo "install-deps: $viewer/node_modules is up to date"
    return
  fi
  echo "install-deps: npm ci in $viewer"
  (cd "$viewer" && npm ci --prefer-offline --no-audit --no-fund)
  cp "$viewer/package-lock.json" "$viewer/node_modules/.installed-package-lock.json"
}

missing=()
for pkg in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
  [[ "$status" == "installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages are installed"
  install_viewer_packages
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
install_viewer_packages
