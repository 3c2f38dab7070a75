#!/usr/bin/env bash
# Installs the Debian 12 packages optireduce needs. Idempotent: when every package is
# already installed it does nothing (no apt-get update, no network).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git iproute2 procps file
  libgloo-dev libhiredis-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  dpdk-dev libdpdk-dev libbpf-dev libxdp-dev clang
  libtorch-dev python3-torch python3-pytest python3-redis python3-matplotlib python3-sklearn
  redis-server
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
