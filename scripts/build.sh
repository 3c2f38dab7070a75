#!/usr/bin/env bash
# Configures and builds optireduce into ./build (Release by default).
# Usage: scripts/build.sh [extra cmake args...]   e.g. -DOPTIREDUCE_SANITIZE=address
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
BUILD_DIR=${OPTIREDUCE_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release} "$@" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
