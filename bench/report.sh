#!/usr/bin/env bash
# Regenerates the results page: builds optireduce if needed, then runs the key experiments
# and writes bench/RESULTS.md and bench/results/ (bench/report.py; its --help lists the
# sections). Root runs the cloud-lab sections; --quick is CI-sized; --tta adds time to
# accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
exec /usr/bin/python3 bench/report.py "$@"
