// OptiReduce mode's time bounds: calibration, moving history, censored samples, caps.
#include "algorithms/timeout_policy.h"
#include "tests/common/resident.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <gtest/gtest.h>

namespace optireduce {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TimeoutOptions Options() {
  TimeoutOptions o;
  o.calibration_ops = 4;
  o.history = 20;
  o.min_bound = microseconds(100);
  return o;
}

TEST(TimeoutPolicy, CalibratesOnTheFirstOperationsOfEachSize) {
  TimeoutPolicy policy(Options());
  EXPECT_TRUE(policy.Calibrating(1024));
  for (int i = 0; i < 4; i++) policy.Record(1024, milliseconds(10 + i));
  EXPECT_FALSE(policy.Calibrating(1024));
  EXPECT_TRUE(policy.Calibrating(2048));  // per bucket size
  // P95 of {10, 11, 12, 13} ms is 13 ms; the margin makes it 16.25 ms.
  EXPECT_EQ(policy.BoundFor(1024).bound, microseconds(16250));
}

TEST(TimeoutPolicy, OperationsCutByTheirBoundDoNotRatchetItUp) {
  TimeoutPolicy policy(Options());
  for (int i = 0; i < 4; i++) policy.Record(1024, milliseconds(40));
  const auto bound = policy.BoundFor(1024).bound;
  EXPECT_EQ(bound, milliseconds(50));
  // A persistent straggler: every operation ends at its deadline. Recorded as plain
  // durations they would grow the bound by the margin each time (50, 62.5, 78 ms, ...).
  for (int i = 0; i < 40; i++) policy.RecordCut(1024, policy.BoundFor(1024).bound);
  EXPECT_EQ(policy.BoundFor(1024).bound, bound);
}

TEST(TimeoutPolicy, FollowsFasterOperationsDown) {
  TimeoutPolicy policy(Options());
  for (int i = 0; i < 4; i++) policy.Record(1024, milliseconds(80));
  for (int i = 0; i < 20; i++) policy.Record(1024, milliseconds(20));  // the window moves
  EXPECT_EQ(policy.BoundFor(1024).bound, milliseconds(25));
}

TEST(TimeoutPolicy, RepairedSlowOperationsRaiseIt) {
  TimeoutPolicy policy(Options());
  for (int i = 0; i < 4; i++) policy.Record(1024, milliseconds(20));
  // The network got slower: operations are cut, repaired, and last 60 ms.
  for (int i = 0; i < 20; i++) policy.Record(1024, milliseconds(60));
  EXPECT_EQ(policy.BoundFor(1024).bound, milliseconds(75));
}

TEST(TimeoutPolicy, HardCapAndQuietPeriod) {
  TimeoutOptions o = Options();
  o.hard_cap = milliseconds(30);
  TimeoutPolicy policy(o);
  for (int i = 0; i < 4; i++) policy.Record(1024, milliseconds(100));
  const TimeBound b = policy.BoundFor(1024);
  EXPECT_EQ(b.bound, milliseconds(30));
  EXPECT_TRUE(b.capped);
  EXPECT_EQ(b.quiet, milliseconds(3));  // 10% of the bound, below max_quiet
  EXPECT_EQ(b.repair_budget, milliseconds(30));
}

TimeoutOptions StartOptions() {
  TimeoutOptions o = Options();
  o.learn_start_grace = true;
  o.start_history_min = 8;
  return o;
}

TEST(TimeoutPolicyStartGrace, OffByDefaultTheWholeRepairBudget) {
  TimeoutOptions o = Options();
  o.start_history_min = 8;
  TimeoutPolicy policy(o);
  for (int i = 0; i < 4; i++) policy.Record(1024, milliseconds(40));
  for (int i = 0; i < 20; i++) policy.RecordStartLag(1024, milliseconds(2), false);
  EXPECT_FALSE(policy.BoundFor(1024).start_grace_learned);
  EXPECT_EQ(policy.BoundFor(1024).start_grace, milliseconds(25 + 50));
}

TEST(TimeoutPolicyStartGrace, WholeRepairBudgetUntilEnoughHistory) {
  TimeoutPolicy policy(StartOptions());
  for (int i = 0; i < 4; i++) policy.Record(1024, milliseconds(40));  // bound 50 ms
  for (int i = 0; i < 7; i++) policy.RecordStartLag(1024, milliseconds(2), false);
  TimeBound b = policy.BoundFor(1024);
  EXPECT_FALSE(b.start_grace_learned);
  EXPECT_EQ(b.start_grace, milliseconds(25 + 50));  // phase 1's half + the repair budget
  policy.RecordStartLag(1024, milliseconds(2), false);
  b = policy.BoundFor(1024);
  EXPECT_TRUE(b.start_grace_learned);
  EXPECT_EQ(b.start_grace, microseconds(2500));  // P95 x margin
  EXPECT_TRUE(policy.BoundFor(2048).start_grace_learned == false);  // per bucket size
}

TEST(TimeoutPolicyStartGrace, PercentileOfHowLatePeersStart) {
  TimeoutPolicy policy(StartOptions());
  for (int i = 0; i < 4; i++) policy.Record(1024, milliseconds(40));
  // 18 of 20 operations: the latest peer starts within 1..18 ms; two stragglers at 300 ms
  // (beyond the 90th percentile) do not move the grace.
  for (int i = 1; i < 19; i++) policy.RecordStartLag(1024, milliseconds(i), false);
  policy.RecordStartLag(1024, milliseconds(300), false);
  policy.RecordStartLag(1024, milliseconds(300), false);
  EXPECT_EQ(policy.BoundFor(1024).start_grace, microseconds(18 * 1250));
  // Peers that usually start late are waited for: it moves with the history...
  for (int i = 0; i < 20; i++) policy.RecordStartLag(1024, milliseconds(40), false);
  EXPECT_EQ(policy.BoundFor(1024).start_grace, milliseconds(50));
  // ...but never beyond the end of phase 1's repairs.
  for (int i = 0; i < 20; i++) policy.RecordStartLag(1024, milliseconds(500), false);
  EXPECT_EQ(policy.BoundFor(1024).start_grace, milliseconds(25 + 50));
}

TEST(TimeoutPolicyStartGrace, StragglersGivenUpDoNotStretchIt) {
  TimeoutPolicy policy(StartOptions());
  for (int i = 0; i < 4; i++) policy.Record(1024, milliseconds(40));
  for (int i = 0; i < 20; i++) policy.RecordStartLag(1024, milliseconds(8), false);
  const auto grace = policy.BoundFor(1024).start_grace;
  EXPECT_EQ(grace, milliseconds(10));
  // A persistent straggler, given up at the grace every time: recorded with the margin on
  // top it would stretch the grace by 25% per operation until it is waited for again.
  for (int i = 0; i < 40; i++) {
    policy.RecordStartLag(1024, policy.BoundFor(1024).start_grace, /*gave_up=*/true);
  }
  EXPECT_EQ(policy.BoundFor(1024).start_grace, grace);
}

using testing::ResidentMiB;

// A job with dynamic shapes records operations of ever new sizes: 200 000 of them here.
// The policy keeps the histories of at most kMaxSizes sizes, forgetting the one recorded
// longest ago, so a size the job keeps using keeps its history (and its bound), and memory
// stays flat: 256 full histories take about 1 MiB, one history per size ~1.4 KiB each
// (280 MiB here); the bound leaves room for the allocator's own growth.
TEST(TimeoutPolicy, HistoriesOfAtMostKMaxSizesSizesTheOnesInUseKept) {
  TimeoutPolicy policy(Options());
  for (int i = 0; i < 4; i++) policy.Record(1024, milliseconds(40));
  const auto bound = policy.BoundFor(1024).bound;
  const double before = ResidentMiB();
  constexpr size_t kRounds = 100000;  // two new sizes each
  size_t most = 0;
  for (size_t n = 0; n < kRounds; n++) {
    const size_t bytes = 4096 + 4 * n;
    policy.Record(bytes, milliseconds(1));
    policy.RecordStartLag(bytes + 2, milliseconds(1), false);
    if (n % 64 == 0) policy.Record(1024, milliseconds(40));  // still in use
    most = std::max(most, policy.Sizes());
  }
  const double grown = ResidentMiB() - before;
  EXPECT_LT(grown, 16.0) << "resident memory grew by " << grown << " MiB over "
                         << 2 * kRounds << " sizes";
  EXPECT_LE(most, TimeoutPolicy::kMaxSizes);
  EXPECT_EQ(policy.Sizes(), TimeoutPolicy::kMaxSizes);
  ASSERT_TRUE(policy.Proposal(1024).has_value());
  EXPECT_EQ(policy.BoundFor(1024).bound, bound);
  EXPECT_FALSE(policy.Proposal(4096).has_value()) << "the first new size is long forgotten";
  EXPECT_TRUE(policy.Proposal(4096 + 4 * (kRounds - 1)).has_value());
}

}  // namespace
}  // namespace optireduce
