// Two-level OptiReduce mode (Mode::kBounded with Layout::kTwoLevel): 8 ranks in 4 groups
// of 2, ranks as threads over Gloo's TCP device, phase B over an in-memory bounded channel
// with seeded packet drops (tests/common/in_memory_bounded_hub.h). Under loss every rank
// holds the same bytes, repaired to the exact sum; a straggler holds up its group, which
// every column leaves out together — flagged alike on every rank, carried, never lost:
// over the operations the outputs add up to the exact sums; ranks of one group that call
// with different sizes raise naming both.
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gtest/gtest.h>

#include "algorithms/allreduce.h"
#include "algorithms/bounded_agreement.h"
#include "tests/common/gradients.h"
#include "tests/common/in_memory_bounded_hub.h"
#include "tests/common/ranks.h"
#include "transport_dpdk/device.h"

namespace optireduce {
namespace {

using testing::InMemoryBoundedHub;
using testing::RelL2;
using RawFunc = void (*)(void*, const void*, const void*, size_t);
using Layout = AllreduceOptions::Layout;

constexpr int kRanks = 8;
constexpr int kGroup = 2;
constexpr size_t kCount = size_t{1} << 16;  // 256 KiB of float32 per rank
constexpr uint64_t kSteps = 5;
constexpr int kCalibration = 2;

const testing::GradientSet& Data() {
  static const auto* data = new testing::GradientSet(kRanks, kSteps, kCount);
  return *data;
}

std::shared_ptr<TimeoutPolicy> Policy() {
  TimeoutOptions o;
  o.calibration_ops = kCalibration;
  // 8 threads on 2 shared cores: bounds far above scheduling noise, so that only the
  // scripted straggler is ever left out.
  o.min_bound = std::chrono::milliseconds(400);
  o.hard_cap = std::chrono::seconds(4);
  o.peer_timeout_factor = 0;
  return std::make_shared<TimeoutPolicy>(o);
}

// One two-level OptiReduce-mode sum of `buffer` in place over `channel` (nullptr: the
// context transport's own); its stats.
OpStats TwoLevelSum(const std::shared_ptr<gloo::Context>& ctx, BoundedChannel* channel,
                    const std::shared_ptr<TimeoutPolicy>& policy, std::vector<float>& buffer,
                    uint32_t tag = 0) {
  AllreduceOptions opts(ctx);
  opts.setOutput(buffer.data(), buffer.size());
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setMode(AllreduceOptions::Mode::kBounded);
  opts.setLayout(Layout::kTwoLevel);
  opts.setGroupSize(kGroup);
  if (channel != nullptr) opts.setBoundedChannel(channel);
  opts.setTimeoutPolicy(policy);
  opts.setTag(tag);
  OpStats stats;
  opts.setStatsOutput(&stats);
  allreduce(opts);
  return stats;
}

testing::RankOptions Loop() {
  testing::RankOptions options;
  options.device = [](int) { return transport::loop::CreateDevice(); };
  return options;
}

void Barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions opts(ctx);
  opts.setTag(77);
  gloo::barrier(opts);
}

TEST(TwoLevelOptiReduceMode, LossIsRepairedToTheSameExactSumOnEveryRank) {
  for (double p : {0.01, 0.05}) {
    InMemoryBoundedHub hub(kRanks, p, 42);
    std::vector<std::vector<float>> result[kSteps];
    for (auto& r : result) r.resize(kRanks);
    testing::RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
      auto policy = Policy();
      for (uint64_t step = 0; step < kSteps; step++) {
        std::vector<float> buffer = Data().Gradient(ctx->rank, step);
        const OpStats s = TwoLevelSum(ctx, hub.channel(ctx->rank), policy, buffer);
        EXPECT_EQ(s.group_size, kGroup) << s.ToJson();
        EXPECT_EQ(s.mode, step < kCalibration ? OpMode::kCalibration : OpMode::kBounded)
            << s.ToJson();
        if (s.mode == OpMode::kBounded) {
          EXPECT_TRUE(s.deferred_ranks.empty()) << "p=" << p << " " << s.ToJson();
          EXPECT_EQ(s.deferred_pct, 0.0) << s.ToJson();
          EXPECT_FALSE(s.damaged) << s.ToJson();
        }
        EXPECT_LT(RelL2(buffer, Data().Sum(step)), 1e-5) << "p=" << p << " step " << step;
        result[step][ctx->rank] = std::move(buffer);
      }
      Barrier(ctx);  // nobody leaves while a peer may still ask for repairs
    });
    EXPECT_GT(hub.dropped_packets(), 0u);
    for (uint64_t step = 0; step < kSteps; step++) {
      for (int r = 1; r < kRanks; r++) {
        ASSERT_EQ(0, std::memcmp(result[step][r].data(), result[step][0].data(), kCount * 4))
            << "p=" << p << " step " << step << ": ranks 0 and " << r << " differ";
      }
    }
  }
}

// A straggler's group waits for it in phase A, so it reaches phase B late in every
// column: each column's leader (or its deputy, when the leader is of that group) leaves the
// group out. Every rank names the same deferred ranks and share, holds the same bytes, and
// flags the next operation as carrying; over the operations the outputs add up to the
// exact sums.
TEST(TwoLevelOptiReduceMode, AStragglersGroupIsDeferredNotLostAndEveryRankHoldsTheSameBytes) {
  InMemoryBoundedHub hub(kRanks, 0.01, 5);
  constexpr uint64_t kCut = 3;  // the step the straggler is late for (after calibration)
  constexpr int kStraggler = 5;  // member 1 of group 2
  const std::vector<int> late_group = {4, 5};
  std::vector<std::vector<float>> out(kRanks), last(kRanks);
  std::vector<OpStats> cut(kRanks), flush(kRanks);
  testing::RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = Policy();
    const int rank = ctx->rank;
    std::vector<float> buffer(kCount);  // one buffer, as a DDP bucket
    std::vector<double> sum(kCount, 0);
    auto run = [&](uint64_t step, bool zero_input) {
      if (zero_input) {
        std::fill(buffer.begin(), buffer.end(), 0.0f);
      } else {
        buffer = Data().Gradient(rank, step);
      }
      const OpStats s = TwoLevelSum(ctx, hub.channel(rank), policy, buffer);
      for (size_t i = 0; i < kCount; i++) sum[i] += buffer[i];
      return s;
    };
    for (uint64_t step = 0; step < kCut; step++) run(step, false);
    Barrier(ctx);
    const double bound_s = policy->BoundFor(kCount * 4).bound.count() / 1e6;
    if (rank == kStraggler) {
      std::this_thread::sleep_for(std::chrono::duration<double>(5 * bound_s));
    }
    cut[rank] = run(kCut, false);
    Barrier(ctx);
    // The deferred part rides on the next operation of the buffer: one whose inputs are
    // zero, so its output is exactly what was carried.
    flush[rank] = run(kCut + 1, true);
    last[rank] = buffer;
    out[rank].assign(sum.begin(), sum.end());
    Barrier(ctx);
  });
  for (int r = 0; r < kRanks; r++) {
    const OpStats& s = cut[r];
    EXPECT_EQ(s.mode, OpMode::kBounded) << s.ToJson();
    EXPECT_EQ(s.group_size, kGroup) << s.ToJson();
    ASSERT_EQ(s.deferred_ranks, late_group) << "rank " << r << s.ToJson();
    EXPECT_TRUE(s.damaged) << s.ToJson();
    // 3 of 4 groups' sums to 3 of 4 pieces of each part (equal pieces): 1 - 9/16 deferred.
    EXPECT_NEAR(s.deferred_pct, 100.0 * 7 / 16, 1e-9) << s.ToJson();
    EXPECT_TRUE(flush[r].carried_in) << "rank " << r << flush[r].ToJson();
    EXPECT_TRUE(flush[r].deferred_ranks.empty()) << flush[r].ToJson();
    ASSERT_EQ(0, std::memcmp(last[r].data(), last[0].data(), kCount * 4)) << "rank " << r;
    ASSERT_EQ(0, std::memcmp(out[r].data(), out[0].data(), kCount * 4)) << "rank " << r;
  }
  // Nothing lost: the outputs of all the operations add up to the sum of all the inputs.
  std::vector<double> exact(kCount, 0);
  for (uint64_t step = 0; step <= kCut; step++) {
    for (size_t i = 0; i < kCount; i++) exact[i] += Data().Sum(step)[i];
  }
  EXPECT_LT(RelL2(out[0], exact), 1e-5);
  // And the deferred part was real: without the flush the sum is far from exact.
  std::vector<float> before_flush(kCount);
  for (size_t i = 0; i < kCount; i++) before_flush[i] = out[0][i] - last[0][i];
  EXPECT_GT(RelL2(before_flush, exact), 0.1);
}

// Two ranks of one group call with different sizes: both raise gloo::EnforceNotMet naming
// both counts before any data moves, and their outputs are NaN. The ranks of the other
// groups see no packet of another size: they return with that group left out, flagged.
// Over the loop device (its own bounded channel: a decider does not wait for its decision
// to be taken, as over Gloo's TCP device, by ranks that raised).
TEST(TwoLevelOptiReduceMode, RanksOfOneGroupWithDifferentSizesRaiseNamingBoth) {
  testing::RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = Policy();
    const int rank = ctx->rank;
    // Every rank calibrates both sizes (a calibrating operation is exact TAR, whose
    // fingerprint exchange would catch the mismatch itself).
    for (size_t count : {kCount, kCount / 2}) {
      for (int i = 0; i < kCalibration; i++) {
        std::vector<float> buffer(count, 1.0f);
        TwoLevelSum(ctx, nullptr, policy, buffer, 1);
      }
    }
    const size_t mine = rank == 1 ? kCount / 2 : kCount;
    std::vector<float> buffer(mine, 1.0f);
    std::string error;
    OpStats s;
    try {
      s = TwoLevelSum(ctx, nullptr, policy, buffer, 1);
    } catch (const gloo::EnforceNotMet& e) {
      error = e.what();
    }
    if (rank <= 1) {
      ASSERT_NE(error, "") << "rank " << rank << " returned";
      EXPECT_NE(error.find(std::to_string(kCount)), std::string::npos) << error;
      EXPECT_NE(error.find(std::to_string(kCount / 2)), std::string::npos) << error;
      for (float v : buffer) ASSERT_TRUE(std::isnan(v)) << "rank " << rank;
    } else {
      ASSERT_EQ(error, "") << "rank " << rank;
      EXPECT_EQ(s.mode, OpMode::kBounded) << s.ToJson();
      EXPECT_TRUE(s.damaged) << s.ToJson();
      EXPECT_EQ(s.deferred_ranks, (std::vector<int>{0, 1})) << s.ToJson();
    }
    Barrier(ctx);
  }, Loop());
}

// Fewer elements than ranks or groups (empty parts and pieces), and counts that do not
// divide: the sum on every rank, to the rounding of the transform.
TEST(TwoLevelOptiReduceMode, OddAndTinyCountsSumOnEveryRank) {
  testing::RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = Policy();
    for (size_t count : {size_t{1}, size_t{3}, size_t{7}, size_t{9}, size_t{1001}}) {
      for (int step = 0; step < kCalibration + 2; step++) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; i++) data[i] = static_cast<float>((i + ctx->rank) % 5);
        const OpStats s = TwoLevelSum(ctx, nullptr, policy, data);
        EXPECT_EQ(s.group_size, kGroup) << s.ToJson();
        EXPECT_EQ(s.mode, step < kCalibration ? OpMode::kCalibration : OpMode::kBounded)
            << s.ToJson();
        EXPECT_FALSE(s.damaged) << s.ToJson();
        for (size_t i = 0; i < count; i++) {
          float want = 0;
          for (int r = 0; r < ctx->size; r++) want += static_cast<float>((i + r) % 5);
          ASSERT_NEAR(data[i], want, 1e-4f * (1 + want))
              << "count " << count << " element " << i << " step " << step << s.ToJson();
        }
      }
    }
    Barrier(ctx);
  }, Loop());
}

}  // namespace
}  // namespace optireduce
