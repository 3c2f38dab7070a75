// The bounded service's incast control: how many peers a rank sends to at once.
#include "transport_dpdk/bounded/incast_control.h"

#include <gtest/gtest.h>

#include <thread>

namespace optireduce {
namespace transport {
namespace {

TEST(IncastControl, StartsWhereToldWithinRange) {
  EXPECT_EQ(IncastControl(3, 1).senders(), 1);
  EXPECT_EQ(IncastControl(3, 0).senders(), 1);   // at least one sender
  EXPECT_EQ(IncastControl(3, 9).senders(), 3);   // at most N-1
  EXPECT_EQ(IncastControl(0, 2).senders(), 1);   // a 1-rank context still has a limit of 1
}

TEST(IncastControl, GrowsOneStepPerRunOfCleanOperations) {
  IncastControl c(3, 1);
  for (int i = 1; i < IncastControl::kCleanOpsToGrow; i++) EXPECT_EQ(c.OnOperation(0.0), 1);
  EXPECT_EQ(c.OnOperation(0.0), 2);
  for (int i = 0; i < 2 * IncastControl::kCleanOpsToGrow; i++) c.OnOperation(0.0);
  EXPECT_EQ(c.senders(), 3);  // capped at N-1
}

TEST(IncastControl, HalvesOnLossAndRestartsTheCleanRun) {
  IncastControl c(7, 7);
  EXPECT_EQ(c.OnOperation(0.02), 3);
  EXPECT_EQ(c.OnOperation(1e-6), 1);
  EXPECT_EQ(c.OnOperation(0.5), 1);  // never below one
  // A loss in the middle of a clean run starts the run again.
  for (int i = 1; i < IncastControl::kCleanOpsToGrow; i++) c.OnOperation(0.0);
  c.OnOperation(0.01);
  for (int i = 1; i < IncastControl::kCleanOpsToGrow; i++) EXPECT_EQ(c.OnOperation(0.0), 1);
  EXPECT_EQ(c.OnOperation(0.0), 2);
}

TEST(IncastControl, LatenessTakesOneSenderOffAndRestartsTheCleanRun) {
  IncastControl c(7, 5);
  EXPECT_EQ(c.OnOperation(0.0, /*late=*/true), 4);
  EXPECT_EQ(c.OnOperation(0.0, true), 3);
  EXPECT_EQ(c.OnOperation(0.02, true), 1);  // loss halves, whatever the lateness
  EXPECT_EQ(c.OnOperation(0.0, true), 1);   // never below one
  for (int i = 1; i < IncastControl::kCleanOpsToGrow; i++) c.OnOperation(0.0);
  c.OnOperation(0.0, true);  // a late operation in a clean run starts it again
  for (int i = 1; i < IncastControl::kCleanOpsToGrow; i++) EXPECT_EQ(c.OnOperation(0.0), 1);
  EXPECT_EQ(c.OnOperation(0.0), 2);
}

// Two threads report operations at once (ProcessGroupGloo runs two allreduces on one
// context): no report is lost, so the limit grows exactly once per run of clean ones.
TEST(IncastControl, ConcurrentReportsAreAllCounted) {
  IncastControl c(1 << 20, 1);
  constexpr int kPerThread = 16 * IncastControl::kCleanOpsToGrow * 64;
  std::thread a([&] { for (int i = 0; i < kPerThread; i++) c.OnOperation(0.0); });
  std::thread b([&] { for (int i = 0; i < kPerThread; i++) c.OnOperation(0.0); });
  a.join();
  b.join();
  EXPECT_EQ(c.senders(), 1 + 2 * kPerThread / IncastControl::kCleanOpsToGrow);
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
