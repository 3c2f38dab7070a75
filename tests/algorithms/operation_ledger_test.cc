// The per-context ledger OptiReduce mode takes its agreed decisions from: fresh Hadamard
// seeds for every operation (unique tags too), calibration counted per context and size,
// and memory that stays flat however many tags a job uses.
#include "algorithms/operation_ledger.h"

#include <unistd.h>

#include <cstdio>
#include <memory>

#include <gloo/context.h>
#include <gtest/gtest.h>

#include "algorithms/allreduce.h"
#include "algorithms/hadamard.h"

namespace optireduce {
namespace {

size_t RssBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

uint64_t Seed(const OperationLedger::Operation& op) {
  return hadamard::OperationSeed(AllreduceOptions::kDefaultHadamardSeed, op.key);
}

// Two ranks' ledgers of one context see the same calls: PyTorch's ProcessGroupGloo gives
// every collective a new tag. Every seed differs from the previous one, both ranks agree,
// and 100 000 tags leave no state behind.
TEST(OperationLedger, UniqueTagsGetFreshEqualSeedsInFlatMemory) {
  auto ctx0 = std::make_shared<gloo::Context>(0, 2);
  auto ctx1 = std::make_shared<gloo::Context>(1, 2);
  auto rank0 = OperationLedger::Of(ctx0);
  auto rank1 = OperationLedger::Of(ctx1);
  // Warm up the allocator and both ledgers' tables before measuring.
  for (uint32_t tag = 0; tag < 2 * OperationLedger::kTagSlots; tag++) {
    rank0->Next(tag, 4096, 20);
    rank1->Next(tag, 4096, 20);
  }
  const size_t rss_before = RssBytes();
  uint64_t previous = 0;
  for (uint32_t i = 0; i < 100000; i++) {
    const uint32_t tag = 1000000 + i;
    const auto a = rank0->Next(tag, 4096, 20);
    const auto b = rank1->Next(tag, 4096, 20);
    ASSERT_EQ(a.sequence, 0u) << "a new tag starts at 0";
    ASSERT_EQ(Seed(a), Seed(b)) << "op " << i;
    ASSERT_NE(Seed(a), previous) << "op " << i << " has the seed of the one before";
    ASSERT_EQ(a.calibrate, b.calibrate);
    previous = Seed(a);
  }
  const size_t rss_after = RssBytes();
  EXPECT_LT(rss_after, rss_before + (1u << 20)) << rss_before << " -> " << rss_after;
}

TEST(OperationLedger, ARepeatedTagCountsItsOperations) {
  auto ctx = std::make_shared<gloo::Context>(0, 2);
  auto ledger = OperationLedger::Of(ctx);
  uint64_t previous = 0;
  for (uint64_t i = 0; i < 100; i++) {
    const auto op = ledger->Next(7, 1024, 0);
    EXPECT_EQ(op.sequence, i);
    EXPECT_NE(Seed(op), previous);
    previous = Seed(op);
  }
  // A tag that shares its table slot replaces it: both start again at 0, whichever order
  // they come in (each rank's table takes the same path).
  EXPECT_EQ(ledger->Next(7 + OperationLedger::kTagSlots, 1024, 0).sequence, 0u);
  EXPECT_EQ(ledger->Next(7, 1024, 0).sequence, 0u);
  EXPECT_EQ(ledger->Next(7, 1024, 0).sequence, 1u);
}

// A rank in two process groups: each context calibrates its own first operations of each
// size, whatever the other context did with the same sizes (one process-wide count made
// this rank run bounded in the second group while its other members calibrated).
TEST(OperationLedger, CalibrationIsCountedPerContextAndSize) {
  auto group_a = std::make_shared<gloo::Context>(0, 2);
  auto group_b = std::make_shared<gloo::Context>(0, 3);
  auto a = OperationLedger::Of(group_a);
  auto b = OperationLedger::Of(group_b);
  constexpr int kCalibration = 3;
  int calibrated_a_small = 0, calibrated_b_small = 0, calibrated_b_large = 0;
  for (int i = 0; i < 10; i++) {
    calibrated_a_small += a->Next(1, 4096, kCalibration).calibrate;
    calibrated_b_small += b->Next(1, 4096, kCalibration).calibrate;
    calibrated_b_large += b->Next(2, 1 << 20, kCalibration).calibrate;
    calibrated_a_small += a->Next(3, 4096, kCalibration).calibrate;
  }
  EXPECT_EQ(calibrated_a_small, kCalibration);
  EXPECT_EQ(calibrated_b_small, kCalibration);
  EXPECT_EQ(calibrated_b_large, kCalibration);
  // Not OptiReduce mode: never calibrates, counts no size.
  EXPECT_FALSE(OperationLedger::Of(std::make_shared<gloo::Context>(0, 2))->Next(1, 64, 0).calibrate);
}

TEST(OperationLedger, ANewContextStartsAFreshLedgerAndDeadOnesAreForgotten) {
  const size_t live_before = OperationLedger::Live();
  {
    auto ctx = std::make_shared<gloo::Context>(0, 2);
    auto ledger = OperationLedger::Of(ctx);
    EXPECT_EQ(ledger->Next(5, 64, 2).sequence, 0u);
    EXPECT_EQ(ledger->Next(5, 64, 2).sequence, 1u);
    EXPECT_FALSE(ledger->Next(5, 64, 2).calibrate);
    EXPECT_EQ(OperationLedger::Of(ctx), ledger);
    EXPECT_EQ(OperationLedger::Live(), live_before + 1);
  }
  EXPECT_EQ(OperationLedger::Live(), live_before);
  // A restarted rank's new context (maybe at the same address): from 0, calibrating again.
  auto ctx = std::make_shared<gloo::Context>(0, 2);
  const auto op = OperationLedger::Of(ctx)->Next(5, 64, 2);
  EXPECT_EQ(op.sequence, 0u);
  EXPECT_TRUE(op.calibrate);
}

}  // namespace
}  // namespace optireduce
