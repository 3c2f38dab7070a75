#!/usr/bin/env bash
# The main job: builds optireduce if needed, then compares how long one allreduce blocks
# for Gloo ring_chunked over Gloo's TCP, TAR over our UDP transport and OptiReduce mode, on
# 4 ranks under the same 1% per-packet loss and the same straggler schedule (bench/demo.py).
# As root it runs the cloud lab (bench/lab: a network namespace per rank, real loss through
# tc eBPF); otherwise the local comparison without loss, labelled as such.
# Arguments go to bench/demo.py (see `/usr/bin/python3 bench/demo.py --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
BUILD_DIR=${OPTIREDUCE_BUILD_DIR:-build}
exec /usr/bin/python3 bench/demo.py --bench-bin "$BUILD_DIR/bench/optireduce-bench" "$@"
