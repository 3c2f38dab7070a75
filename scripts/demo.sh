#!/usr/bin/env bash
# The main job: builds optireduce if needed, then runs a 4-rank allreduce comparison on this
# host (local processes, no Redis) and prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
BUILD_DIR=${OPTIREDUCE_BUILD_DIR:-build}
exec "$BUILD_DIR/bench/optireduce-demo" "$@"
