#!/usr/bin/env bash
# The main job: builds optireduce if needed, then on 4 local ranks (processes, no Redis)
#  1. compares Gloo's ring, TAR and OptiReduce mode under stragglers and 1% packet loss,
#  2. sweeps message sizes for Gloo's algorithms vs TAR on Gloo's TCP device.
# Extra arguments go to the first comparison (see `build/bench/optireduce-demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
BUILD_DIR=${OPTIREDUCE_BUILD_DIR:-build}
"$BUILD_DIR/bench/optireduce-demo" "$@"
echo
"$BUILD_DIR/bench/optireduce-sweep" --sizes 64K,1M,16M
