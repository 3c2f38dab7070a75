#!/usr/bin/env bash
# Installs dependencies, builds everything and runs every test (GoogleTest and pytest)
# through ctest. Tests that need redis-server start their own on a free loopback port.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
BUILD_DIR=${OPTIREDUCE_BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 900 "$@"
