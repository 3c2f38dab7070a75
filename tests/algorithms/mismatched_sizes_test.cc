// OptiReduce mode with ranks that call one operation with different sizes: every rank
// raises gloo::EnforceNotMet naming both sizes (also a rank that received no wrong packet
// itself), well within the operation's bound; every output is NaN; the next operation
// of equal sizes is exact again. Over the loop device (ranks as threads) and the udp
// device (processes).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gtest/gtest.h>

#include "algorithms/allreduce.h"
#include "algorithms/bounded_channel.h"
#include "tests/common/ranks.h"
#include "transport_dpdk/bounded/bounded_endpoint.h"
#include "transport_dpdk/device.h"

namespace optireduce {
namespace {

using RawFunc = void (*)(void*, const void*, const void*, size_t);
using Clock = std::chrono::steady_clock;

constexpr int kCalibration = 3;

std::shared_ptr<TimeoutPolicy> Policy() {
  TimeoutOptions o;
  o.calibration_ops = kCalibration;
  o.peer_timeout_factor = 0;
  o.min_bound = std::chrono::seconds(1);
  o.max_quiet = std::chrono::milliseconds(200);
  return std::make_shared<TimeoutPolicy>(o);
}

// One OptiReduce-mode allreduce of `count` elements of value `value`; returns the buffer.
std::vector<float> Reduce(const std::shared_ptr<gloo::Context>& ctx,
                          const std::shared_ptr<TimeoutPolicy>& policy, size_t count,
                          float value, uint32_t tag, OpStats* stats = nullptr) {
  std::vector<float> data(count, value);
  AllreduceOptions opts(ctx);
  opts.setOutput(data.data(), count);
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setMode(AllreduceOptions::Mode::kBounded);
  opts.setTimeoutPolicy(policy);
  opts.setTag(tag);
  if (stats != nullptr) opts.setStatsOutput(stats);
  allreduce(opts);
  return data;
}

uint64_t SizeMismatchPackets(const std::shared_ptr<gloo::Context>& ctx) {
  auto* endpoint = dynamic_cast<transport::BoundedEndpoint*>(BoundedChannelOf(*ctx));
  return endpoint == nullptr ? 0 : endpoint->counters().size_mismatch_packets;
}

// Every rank calibrates every count (`next` is one of them), then allreduces its
// own count at once: each must raise naming its own byte count and one of the others',
// within the bound, leave NaN in the output, and the next operation of `next` elements
// must be exact.
void MismatchedOperation(const std::shared_ptr<gloo::Context>& ctx,
                         const std::vector<size_t>& counts, size_t next) {
  auto policy = Policy();
  const size_t mine = counts[ctx->rank];
  uint32_t tag = 1;
  // Every rank calibrates every size (a calibrating operation is exact TAR, whose
  // fingerprint exchange would catch the mismatch itself).
  const std::set<size_t> sizes(counts.begin(), counts.end());
  for (size_t count : sizes) {
    for (int i = 0; i < kCalibration; i++) Reduce(ctx, policy, count, 1, tag++);
  }
  // The peers' sizes this rank differs from, in bytes.
  std::vector<std::string> others;
  for (size_t c : counts) {
    if (c != mine) others.push_back(std::to_string(c * sizeof(float)));
  }
  ASSERT_FALSE(others.empty());
  const auto bound = policy->BoundFor(mine * sizeof(float));
  std::vector<float> data(mine, static_cast<float>(ctx->rank + 1));
  AllreduceOptions opts(ctx);
  opts.setOutput(data.data(), mine);
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setMode(AllreduceOptions::Mode::kBounded);
  opts.setTimeoutPolicy(policy);
  opts.setTag(tag++);
  const auto start = Clock::now();
  std::string error;
  try {
    allreduce(opts);
  } catch (const gloo::EnforceNotMet& e) {
    error = e.what();
  }
  const auto took = Clock::now() - start;
  std::printf("rank %d raised after %.1f ms: %s\n", ctx->rank,
              std::chrono::duration<double, std::milli>(took).count(), error.c_str());
  ASSERT_NE(error, "") << "rank " << ctx->rank << " returned from an allreduce of " << mine
                       << " elements while a peer's size differs";
  EXPECT_NE(error.find(std::to_string(mine * sizeof(float))), std::string::npos) << error;
  bool names_other = false;
  for (const std::string& o : others) names_other |= error.find(o) != std::string::npos;
  EXPECT_TRUE(names_other) << error;
  // Found from the first packets (or a peer's notice), not at a deadline.
  EXPECT_LT(took, bound.bound / 2) << error;
  for (float v : data) ASSERT_TRUE(std::isnan(v)) << "rank " << ctx->rank;
  // The context stays usable: the next operation of equal sizes is exact.
  const std::vector<float> after = Reduce(ctx, policy, next, ctx->rank + 1.0f, tag++);
  const float want = ctx->size * (ctx->size + 1) / 2.0f;
  for (float v : after) ASSERT_NEAR(v, want, 1e-4f * want) << "rank " << ctx->rank;
  gloo::BarrierOptions b(ctx);
  b.setTag(77);
  gloo::barrier(b);  // nobody tears down while a peer may still ask for repairs
}

testing::RankOptions Loop() {
  testing::RankOptions options;
  options.device = [](int) { return transport::loop::CreateDevice(); };
  return options;
}

TEST(MismatchedSizesLoop, BothRanksRaiseNamingBothSizes) {
  testing::RunThreads(2, [](const std::shared_ptr<gloo::Context>& ctx) {
    MismatchedOperation(ctx, {65536, 32768}, 65536);
    // Each saw the other's packets state another size.
    EXPECT_GT(SizeMismatchPackets(ctx), 0u) << "rank " << ctx->rank;
  }, Loop());
}

TEST(MismatchedSizesLoop, ARankThatReceivesNoWrongPacketLearnsFromANotice) {
  // 2 elements on rank 0 (shards 1, 1, 0), 3 on ranks 1 and 2 (shards 1, 1, 1): rank 0
  // sends rank 2 nothing in phase 1 (its shard 2 is empty), finds the sizes differ in its
  // own phase 1 and never sends phase 2; only rank 0's notice tells rank 2.
  testing::RunThreads(3, [](const std::shared_ptr<gloo::Context>& ctx) {
    MismatchedOperation(ctx, {2, 3, 3}, 3);
  }, Loop());
}

TEST(MismatchedSizesLoop, ThreeRanksWithThreeSizes) {
  testing::RunThreads(3, [](const std::shared_ptr<gloo::Context>& ctx) {
    MismatchedOperation(ctx, {1000, 1001, 999}, 1000);
  }, Loop());
}

TEST(MismatchedSizesUdp, BothRanksRaiseNamingBothSizes) {
  testing::RankOptions options;
  options.device = [](int) { return transport::udp::CreateDevice({}); };
  EXPECT_EQ(testing::RunProcesses(2, [](const std::shared_ptr<gloo::Context>& ctx) {
    MismatchedOperation(ctx, {65536, 32768}, 65536);
    EXPECT_GT(SizeMismatchPackets(ctx), 0u) << "rank " << ctx->rank;
  }, options), "");
}

TEST(MismatchedSizesUdp, ARankThatReceivesNoWrongPacketLearnsFromANotice) {
  testing::RankOptions options;
  options.device = [](int) { return transport::udp::CreateDevice({}); };
  EXPECT_EQ(testing::RunProcesses(3, [](const std::shared_ptr<gloo::Context>& ctx) {
    MismatchedOperation(ctx, {2, 3, 3}, 3);
  }, options), "");
}

}  // namespace
}  // namespace optireduce
