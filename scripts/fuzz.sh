#!/usr/bin/env bash
# Runs every libFuzzer target in tests/fuzz for N seconds each (default 60), starting
# from its seed corpus. Needs clang; builds into ./build-fuzz (OPTIREDUCE_FUZZ_BUILD_DIR),
# separate from ./build. Fails on the first crash; the crashing input is left in
# build-fuzz/fuzz-out/<target>/ — fix the bug and add the input to
# tests/fuzz/corpus/<target>/ as a regression input.
#
# Usage: scripts/fuzz.sh [seconds] [target...]   targets: wire_format bounded_receiver receive_window
#                                                 send_scoreboard config redis_url (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(wire_format bounded_receiver receive_window send_scoreboard config redis_url)
fi
BUILD_DIR=${OPTIREDUCE_FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${OPTIREDUCE_FUZZ_JOBS:-2}
# OPTIREDUCE_FUZZ_SEED=N: libFuzzer's -seed (CI sets one, so a run explores the same way
# each time up to machine speed; unset: a new seed per run).
SEED_FLAG=${OPTIREDUCE_FUZZ_SEED:+-seed=$OPTIREDUCE_FUZZ_SEED}
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found" >&2; exit 2; }

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DOPTIREDUCE_FUZZ=ON -DOPTIREDUCE_WITH_TORCH=OFF -DOPTIREDUCE_BUILD_BENCH=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS" --target $(printf 'fuzz_%s ' "${TARGETS[@]}")

status=0
for t in "${TARGETS[@]}"; do
  out="$BUILD_DIR/fuzz-out/$t"
  mkdir -p "$out/corpus"
  echo "== fuzz_$t for ${SECONDS_EACH}s"
  # New corpus entries go to $out/corpus (the committed seeds stay untouched).
  if ! "$BUILD_DIR/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=10 $SEED_FLAG \
      -rss_limit_mb=2048 -artifact_prefix="$out/" -print_final_stats=1 \
      "$out/corpus" "tests/fuzz/corpus/$t" 2>"$out/log.txt"; then
    echo "fuzz_$t FAILED: see $out/log.txt and the crash-*/leak-*/timeout-* files in $out/" >&2
    tail -n 40 "$out/log.txt" >&2
    status=1
  else
    grep -E '^stat::(number_of_executed_units|peak_rss_mb)|cov: ' "$out/log.txt" | tail -n 3
  fi
done
exit $status
