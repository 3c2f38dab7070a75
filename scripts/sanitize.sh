#!/usr/bin/env bash
# CI sanitizer stage (after scripts/test.sh). Builds two separate trees and runs:
#   build-asan (AddressSanitizer + UndefinedBehaviorSanitizer): the unit and conformance
#       suites of transport, algorithms, rendezvous and gloo_ext, plus the fuzz corpora;
#   build-tsan (ThreadSanitizer): the engine's threading tests (loop-device conformance,
#       bounded receiver/transpose, OptiReduce mode over loop and udp, udp processes).
# Any sanitizer report fails the test that triggered it (halt_on_error / exitcode).
# Known, explained reports are suppressed in tests/sanitizers/*.supp.
#
# Usage: scripts/sanitize.sh [asan|tsan]...      (default: both)
# Env:   OPTIREDUCE_SANITIZE_JOBS (default 2): build parallelism and ctest -j.
#
# Both trees leave out PyTorch (an ASan/TSan runtime cannot be loaded into an uninstrumented
# python3), the benchmarks, and DPDK (EAL's own memory management and its hugepage/mmap
# tricks are not sanitizer-clean, and no DPDK test runs without a vdev anyway; the engine
# code DPDK uses is the same one the udp/loop tests exercise).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${OPTIREDUCE_SANITIZE_JOBS:-2}
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(asan tsan)

COMMON=(-G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=-g1"
        -DOPTIREDUCE_WITH_TORCH=OFF -DOPTIREDUCE_BUILD_BENCH=OFF -DOPTIREDUCE_WITH_DPDK=OFF)

configure() {  # dir sanitizer
  if [ ! -f "$1/build.ninja" ] ||
     ! grep -q "OPTIREDUCE_SANITIZE:STRING=$2\$" "$1/CMakeCache.txt" 2>/dev/null ||
     grep -q "OPTIREDUCE_WITH_DPDK:BOOL=ON" "$1/CMakeCache.txt"; then
    cmake -S . -B "$1" "${COMMON[@]}" "-DOPTIREDUCE_SANITIZE=$2" >/dev/null
  fi
}

# Test binaries each stage needs (building only these keeps the stage inside its budget).
ASAN_TARGETS=(transport_unit_test transport_loop_test transport_worker transport_udp_test
              transport_isolation_test allreduce_test bounded_transpose_test two_level_test
              two_level_bounded_test
              optireduce_mode_test agreed_mode_test operation_ledger_test timeout_policy_test hadamard_test reduce_classifier_test redis_url_test
              redis_store_test gloo_ext_config_test fuzz_wire_format_corpus
              fuzz_bounded_receiver_corpus fuzz_receive_window_corpus fuzz_send_scoreboard_corpus
              fuzz_config_corpus
              fuzz_redis_url_corpus)
TSAN_TARGETS=(transport_loop_test transport_worker transport_udp_test bounded_transpose_test
              agreed_mode_test)

# ASan+UBSan: everything in the listed suites except
#  - the straggler test OptiReduceModeLoop.StragglerDoesNot...: asserts a duration with 2 s
#    of slack,
#    which ASan's slowdown eats (measured 15.1 s vs 12 s, 1.8 s vs 1.7 s);
#  - transport.Workers.UdpAllreduce64MiB: 64 MiB ring allreduce, ~2 min under ASan on
#    2 cores and no code path the 256 KiB conformance cases do not already cover;
#  - reliability tests (soak, peer kill): timing-based, run in the normal build;
#  - tests that count page faults or resident memory, which ASan's shadow memory and
#    allocator quarantine change: BoundedTranspose.FirstBoundedOperationFindsItsScratchFaultedIn,
#    BoundedSources.ReservedDetachCopiesIntoFaultedInMemory,
#    TimeoutPolicy.HistoriesOfAtMostKMaxSizesSizesTheOnesInUseKept.
ASAN_REGEX='^(transport\.|TransposeAllreduce|BoundedTranspose|OptiReduceMode|TwoLevel|AgreedMode|OperationLedger|TimeoutPolicy|HadamardTest|ReduceClassifier|RedisUrl|All/RedisUrlBad|RedisStore|ConfigTest|fuzz_corpus)'
# The late-rank tests (LateRankIsCut...) assert that the adaptive peer timeout ended a
# phase: timing again. HeavyLossRepairsToExact stays in: under ASan's slowdown its repairs
# run out of time, which is what exposed the undeclared-damage bug (SECURITY.md).
ASAN_EXCLUDE='FirstBoundedOperationFindsItsScratchFaultedIn|ReservedDetachCopiesIntoFaultedInMemory|HistoriesOfAtMostKMaxSizes|LateRankIsCut|OnePercentDropIsMeasuredAndSmall|StragglerCostsOnlyItsContribution|StragglerDoesNotStall|UdpAllreduce64MiB|Reliability|Soak|PeerFailure|LargeBuffer|IdleProgressThreadUsesLittleCpu'
# TSan: the tests that run the progress thread against application threads: loop-device
# conformance (2-4 ranks) and faults, LoopDevice.*, udp conformance (4 ranks) and faults,
# the peer-kill test, and the bounded-transpose tests that assert no timing. Left out:
#  - tests that assert a phase's end or duration against a deadline (instrumented code is
#    5-15x slower, so phases end by deadline): BoundedTranspose.{NoFaultsEqualsExactSum,
#    LossIsRepairedToTheSameExactSumOnEveryRank, AStragglerIsDeferredNotLost...} and
#    OptiReduceMode* (whose udp processes also need
#    >120 s to draw their gradients under TSan);
#  - of AgreedMode only the two concurrent bounded allreduces on one context under loss
#    (ProcessGroupGloo's two worker threads): the others assert modes, which the slowdown
#    does not change but which add minutes;
#  - the 5-rank loop conformance (>2 min, nothing the 4-rank case does not run) and the
#    heavy LoopFaults spec: under TSan on a loaded host these stalled a reliable transfer
#    until the 30 s timeout (see the branch report; not seen without TSan).
TSAN_REGEX='^(transport\.(Ranks/LoopConformance\.AllCollectivesExact/[234]|Specs/LoopFaults\.ExactUnderFaults/"drop=0\.01|LoopDevice|Ranks/UdpConformance\.AllCollectivesExact/4|Specs/UdpFaults|Workers\.PeerKilled)|BoundedTranspose\.(AboveLossLimitRepairsToExact|WithoutBoundedServiceRunsExactTar)|AgreedMode\.TwoConcurrentBoundedAllreducesOnOneContextUnderLoss)'
TSAN_EXCLUDE='^$'

run_asan() {
  configure build-asan address,undefined
  cmake --build build-asan -j "$JOBS" --target "${ASAN_TARGETS[@]}"
  (cd build-asan &&
   ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0" \
   LSAN_OPTIONS="suppressions=$ROOT/tests/sanitizers/lsan.supp:print_suppressions=0" \
   UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$ROOT/tests/sanitizers/ubsan.supp" \
   ctest -j "$JOBS" --timeout 600 --output-on-failure -R "$ASAN_REGEX" -E "$ASAN_EXCLUDE")
}

run_tsan() {
  configure build-tsan thread
  cmake --build build-tsan -j "$JOBS" --target "${TSAN_TARGETS[@]}"
  (cd build-tsan &&
   TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/tests/sanitizers/tsan.supp" \
   ctest -j "$JOBS" --timeout 600 --output-on-failure -R "$TSAN_REGEX" -E "$TSAN_EXCLUDE")
}

for s in "${STAGES[@]}"; do
  case "$s" in
    asan) echo "== sanitize: ASan+UBSan (build-asan)"; time run_asan ;;
    tsan) echo "== sanitize: TSan (build-tsan)"; time run_tsan ;;
    *) echo "sanitize.sh: unknown stage '$s' (want asan or tsan)" >&2; exit 2 ;;
  esac
done
