// OptiReduce mode (TAR over a bounded channel): exactness without faults, bounded time and
// measured damage under loss, Hadamard's spreading of damage, stragglers, and repair above
// the loss limit. Ranks are threads; calibration runs over Gloo TCP, bounded phases over
// an in-memory channel with seeded packet drops.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <chrono>
#include <cmath>
#include <random>
#include <mutex>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gtest/gtest.h>

#include "algorithms/allreduce.h"
#include "algorithms/bounded_agreement.h"
#include "algorithms/operation_ledger.h"
#include "algorithms/transpose_plan.h"
#include "tests/common/gradients.h"
#include "tests/common/in_memory_bounded_hub.h"
#include "tests/common/ranks.h"

namespace optireduce {
namespace {

using testing::InMemoryBoundedHub;
using testing::RunThreads;
using RawFunc = void (*)(void*, const void*, const void*, size_t);
using Clock = std::chrono::steady_clock;

constexpr int kRanks = 4;
constexpr size_t kCount = 1 << 18;  // 1 MiB of float32 per rank
constexpr double kNoise = 0.1;      // per-rank deviation from the common gradient

constexpr uint64_t kSteps = 6;

const testing::GradientSet& Data() {
  static const auto* data = new testing::GradientSet(kRanks, kSteps, kCount, kNoise);
  return *data;
}

const std::vector<float>& Gradient(int rank, uint64_t step) { return Data().Gradient(rank, step); }
const std::vector<double>& ExactSum(uint64_t step) { return Data().Sum(step); }

struct Errors {
  double rel_l2 = 0;
  double max_abs = 0;
};

Errors Compare(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0, max_abs = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double d = got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
    max_abs = std::max(max_abs, std::fabs(d));
  }
  return {std::sqrt(num / den), max_abs};
}

std::shared_ptr<TimeoutPolicy> TestPolicy(bool long_quiet = false) {
  TimeoutOptions o;
  if (long_quiet) {
    // The early timeout's quiet period far above a loaded host's descheduling: a test of
    // something else (page faults) must not see a late shard cut by it.
    o.early_quiet_fraction = 0.5;
    o.max_quiet = std::chrono::milliseconds(100);
  }
  o.calibration_ops = 2;
  // Threads on 2 shared cores: keep bounds far above scheduling noise.
  o.min_bound = std::chrono::milliseconds(150);
  o.hard_cap = std::chrono::seconds(2);
  // Threads of a loaded host may be descheduled longer than the adaptive peer timeout
  // allows; tests that need it turn it on.
  o.peer_timeout_factor = 0;
  return std::make_shared<TimeoutPolicy>(o);
}

struct Call {
  std::vector<float> data;
  OpStats stats;
  double seconds = 0;
};

Call Allreduce(const std::shared_ptr<gloo::Context>& ctx, BoundedChannel* channel,
               const std::shared_ptr<TimeoutPolicy>& policy, uint64_t step, bool hadamard,
               double max_loss, Compensation compensation = Compensation::kDebias) {
  Call call;
  call.data = Gradient(ctx->rank, step);
  AllreduceOptions opts(ctx);
  opts.setOutput(call.data.data(), call.data.size());
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setMode(AllreduceOptions::Mode::kBounded);
  opts.setHadamard(hadamard ? AllreduceOptions::Hadamard::kOn : AllreduceOptions::Hadamard::kOff);
  opts.setBoundedChannel(channel);
  opts.setTimeoutPolicy(policy);
  opts.setMaxLoss(max_loss);
  opts.setCompensation(compensation);
  opts.setStatsOutput(&call.stats);
  const auto start = Clock::now();
  allreduce(opts);
  call.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return call;
}

void Barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions opts(ctx);
  opts.setTag(77);
  gloo::barrier(opts);
}

// One bounded allreduce (sum) of `buffer` in place over the hub; its stats. The transform
// is left at its default unless `hadamard_off`.
OpStats BoundedSum(const std::shared_ptr<gloo::Context>& ctx, InMemoryBoundedHub& hub,
                   const std::shared_ptr<TimeoutPolicy>& policy, std::vector<float>& buffer,
                   bool hadamard_off = false) {
  AllreduceOptions opts(ctx);
  opts.setOutput(buffer.data(), buffer.size());
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setMode(AllreduceOptions::Mode::kBounded);
  if (hadamard_off) opts.setHadamard(AllreduceOptions::Hadamard::kOff);
  opts.setBoundedChannel(hub.channel(ctx->rank));
  opts.setTimeoutPolicy(policy);
  OpStats stats;
  opts.setStatsOutput(&stats);
  allreduce(opts);
  return stats;
}

TEST(BoundedTranspose, NoFaultsEqualsExactSum) {
  Data();
  InMemoryBoundedHub hub(kRanks, 0.0, 1);
  RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = TestPolicy();
    for (uint64_t step = 0; step < 4; step++) {
      Call c = Allreduce(ctx, hub.channel(ctx->rank), policy, step, true, 0.05);
      EXPECT_EQ(c.stats.mode, step < 2 ? OpMode::kCalibration : OpMode::kBounded) << step;
      EXPECT_LT(Compare(c.data, ExactSum(step)).rel_l2, 1e-5) << step;
      if (step >= 2) {
        EXPECT_EQ(c.stats.loss_pct, 0.0);
        EXPECT_FALSE(c.stats.damaged);
      }
    }
  });
}

// Under packet loss every counted contribution and every counted owner's shard is repaired
// until whole: the result is the exact sum (to the transform's rounding), the same bytes
// on every rank, nothing deferred.
TEST(BoundedTranspose, LossIsRepairedToTheSameExactSumOnEveryRank) {
  for (double p : {0.01, 0.05}) {
    InMemoryBoundedHub hub(kRanks, p, 42);
    std::vector<std::vector<float>> result[kSteps];
    for (auto& r : result) r.resize(kRanks);
    RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
      auto policy = TestPolicy();
      for (uint64_t step = 0; step < kSteps; step++) {
        Call c = Allreduce(ctx, hub.channel(ctx->rank), policy, step, true, 0.05);
        if (c.stats.mode == OpMode::kBounded) {
          EXPECT_TRUE(c.stats.deferred_ranks.empty()) << "p=" << p << " " << c.stats.ToJson();
          EXPECT_EQ(c.stats.deferred_pct, 0.0) << c.stats.ToJson();
          EXPECT_FALSE(c.stats.damaged) << c.stats.ToJson();
        }
        EXPECT_LT(Compare(c.data, ExactSum(step)).rel_l2, 1e-5) << "p=" << p << " step " << step;
        result[step][ctx->rank] = std::move(c.data);
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

// The leader of the `sequence`-th operation with tag 0 (the tests' tag) among kRanks.
int LeaderOfStep(uint64_t sequence) {
  return LeaderOf(OperationLedger::Key(0, sequence), kRanks);
}

// A rank that has not started by the start grace is left out: the others finish without
// it, every rank holds the same bytes, and what was left out (its whole contribution, and
// every contribution to its shard) comes back in the next operation on the same buffers:
// over the operations the outputs add up to the exact sums. A straggler that is not the
// step's leader is left out by the leader; one that leads it is left out by its deputy,
// to which its transport hands the decision (it had not begun the operation).
void StragglerIsDeferredNotLost(bool straggler_leads) {
  InMemoryBoundedHub hub(kRanks, 0.01, 5);
  constexpr uint64_t kCut = 3;  // the step the straggler is late for
  const int leader = LeaderOfStep(kCut);
  const int deputy = DeputyOf(leader, kRanks);
  int straggler = leader;
  if (!straggler_leads) {
    straggler = 0;
    while (straggler == leader) straggler++;
  }
  const int decider = straggler_leads ? deputy : leader;
  std::vector<std::vector<float>> out(kRanks);  // per rank, the sum of its outputs
  std::vector<std::vector<float>> last(kRanks);
  std::vector<OpStats> cut_stats(kRanks);
  RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = TestPolicy();
    const int rank = ctx->rank;
    std::vector<float> buffer(kCount);  // one buffer, as a DDP bucket
    std::vector<double> sum(kCount, 0);
    auto run = [&](uint64_t step, bool zero_input) {
      if (zero_input) {
        std::fill(buffer.begin(), buffer.end(), 0.0f);
      } else {
        buffer = Gradient(rank, step);
      }
      const OpStats stats = BoundedSum(ctx, hub, policy, buffer);
      for (size_t i = 0; i < kCount; i++) sum[i] += buffer[i];
      return stats;
    };
    for (uint64_t step = 0; step < kCut; step++) run(step, false);
    // Twice: the second carry is written into the memory of the first one applied (its
    // old values must not leak into the blocks it transforms back).
    for (const uint64_t cut : {kCut, kCut + 2}) {
      Barrier(ctx);
      const double bound_s = policy->BoundFor(kCount * 4).bound.count() / 1e6;
      if (rank == straggler) {
        std::this_thread::sleep_for(std::chrono::duration<double>(5 * bound_s));
      }
      const OpStats stats = run(cut, false);
      if (cut == kCut) cut_stats[rank] = stats;
      EXPECT_EQ(stats.deferred_ranks, std::vector<int>{straggler}) << stats.ToJson();
      Barrier(ctx);
      // The deferred part rides on the next operation of the buffer: here one whose inputs
      // are zero, so its output is exactly what was carried.
      const OpStats flush = run(cut + 1, true);
      EXPECT_TRUE(flush.carried_in) << "every rank flags it; rank " << rank << flush.ToJson();
      EXPECT_TRUE(flush.deferred_ranks.empty()) << flush.ToJson();
    }
    last[rank] = buffer;
    out[rank].assign(sum.begin(), sum.end());
    Barrier(ctx);
  });
  for (int r = 0; r < kRanks; r++) {
    const OpStats& s = cut_stats[r];
    EXPECT_EQ(s.leader, decider) << "rank " << r << s.ToJson();
    EXPECT_EQ(s.deputy_decided, straggler_leads) << "rank " << r << s.ToJson();
    ASSERT_EQ(s.deferred_ranks, std::vector<int>{straggler}) << "rank " << r << s.ToJson();
    EXPECT_TRUE(s.damaged);
    // 3 of 4 contributions to 3 of 4 shards (equal shards): 1 - 9/16 of the sum deferred.
    EXPECT_NEAR(s.deferred_pct, 100.0 * 7 / 16, 1e-9) << s.ToJson();
    EXPECT_EQ(s.deferred_pct, cut_stats[0].deferred_pct);
    ASSERT_EQ(0, std::memcmp(last[r].data(), last[0].data(), kCount * 4)) << "rank " << r;
    ASSERT_EQ(0, std::memcmp(out[r].data(), out[0].data(), kCount * 4)) << "rank " << r;
  }
  // Nothing lost: the outputs of all the operations add up to the sum of all the inputs.
  std::vector<double> exact(kCount, 0);
  for (uint64_t step = 0; step <= kCut + 2; step++) {
    if (step == kCut + 1) continue;  // a flush: zero inputs
    for (size_t i = 0; i < kCount; i++) exact[i] += ExactSum(step)[i];
  }
  EXPECT_LT(Compare(out[0], exact).rel_l2, 1e-5);
  // And the deferred part was real: the cut operation alone is far from its exact sum.
  EXPECT_GT(hub.counters(decider).absent_answers, 0u)
      << "the decider never heard 'not started' from the straggler";
}

TEST(BoundedTranspose, AStragglerIsDeferredNotLostAndEveryRankHoldsTheSameBytes) {
  StragglerIsDeferredNotLost(/*straggler_leads=*/false);
}

// The leader of the step is the straggler: its peers do not wait for it either.
TEST(BoundedTranspose, AStragglingLeaderIsLeftOutByItsDeputy) {
  StragglerIsDeferredNotLost(/*straggler_leads=*/true);
}

// The deputy's request is answered "ceded" but the answer is lost, and the leader begins
// the operation before the deputy asks again: its data reaches the deputy, yet the leader
// waits for the deputy's decision. The deputy asks again (the same answer) and decides
// rather than taking the leader's data for a refusal — else each waits for the other's
// decision until the timeout.
TEST(BoundedTranspose, ALostCedeAnswerLeavesTheDeputyDeciding) {
  InMemoryBoundedHub hub(kRanks, 0.0, 9);
  constexpr uint64_t kCut = 3;
  const int leader = LeaderOfStep(kCut);
  const int deputy = DeputyOf(leader, kRanks);
  std::mutex go_mu;
  std::condition_variable go_cv;
  bool go = false;
  std::atomic<bool> leader_sent{false};
  hub.LoseFirstCedeAnswer([&](int l, int d, uint64_t op) {
    {
      std::lock_guard<std::mutex> lock(go_mu);
      go = true;
    }
    go_cv.notify_all();
    leader_sent = hub.WaitSent(l, d, op, std::chrono::seconds(60));
  });
  std::vector<OpStats> cut_stats(kRanks);
  std::vector<std::vector<float>> cut_out(kRanks);
  RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = TestPolicy();
    const int rank = ctx->rank;
    std::vector<float> buffer;
    auto run = [&](uint64_t step) {
      buffer = Gradient(rank, step);
      return BoundedSum(ctx, hub, policy, buffer);
    };
    for (uint64_t step = 0; step < kCut; step++) run(step);
    Barrier(ctx);
    if (rank == leader) {
      // Begins only once the deputy's first answer is lost (a hang guard caps the wait).
      std::unique_lock<std::mutex> lock(go_mu);
      go_cv.wait_for(lock, std::chrono::seconds(60), [&] { return go; });
    }
    cut_stats[rank] = run(kCut);
    cut_out[rank] = buffer;
    Barrier(ctx);
  });
  EXPECT_TRUE(leader_sent) << "the leader did not begin while the answer was lost";
  for (int r = 0; r < kRanks; r++) {
    const OpStats& s = cut_stats[r];
    EXPECT_TRUE(s.deputy_decided) << "rank " << r << s.ToJson();
    EXPECT_EQ(s.leader, deputy) << "rank " << r << s.ToJson();
    // The leader's data reached the deputy before it decided: it counts.
    EXPECT_TRUE(s.deferred_ranks.empty()) << "rank " << r << s.ToJson();
    ASSERT_EQ(0, std::memcmp(cut_out[r].data(), cut_out[0].data(), kCount * 4)) << "rank " << r;
  }
  EXPECT_LT(Compare(cut_out[0], ExactSum(kCut)).rel_l2, 1e-5);
}

// The flag `carried_in` is the same on every rank, also when only the straggler holds a
// carry: with 3 values over 4 ranks rank 3 owns no shard, so when it is left out nobody
// else has anything of it to carry, yet every rank's next result holds its part.
TEST(BoundedTranspose, CarriedInIsFlaggedOnEveryRankWhenOnlyTheStragglerCarries) {
  constexpr size_t kFew = 3;
  constexpr int kStraggler = 3;
  ASSERT_EQ(TransposePlan(kFew, kRanks).ShardCount(kStraggler), 0u);
  // A step after calibration (TestPolicy: 2 operations) that the straggler does not lead
  // (AStragglingLeaderIsLeftOutByItsDeputy covers a straggling leader).
  uint64_t cut = 2;
  while (LeaderOfStep(cut) == kStraggler) cut++;
  InMemoryBoundedHub hub(kRanks, 0.0, 7);
  std::vector<OpStats> cut_stats(kRanks), flush_stats(kRanks);
  std::vector<std::vector<float>> flushed(kRanks);
  RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = TestPolicy();
    const int rank = ctx->rank;
    std::vector<float> buffer(kFew);
    auto run = [&](float value) {
      std::fill(buffer.begin(), buffer.end(), value);
      return BoundedSum(ctx, hub, policy, buffer, /*hadamard_off=*/true);
    };
    for (uint64_t step = 0; step < cut; step++) run(1.0f);
    Barrier(ctx);
    const double bound_s = policy->BoundFor(kFew * 4).bound.count() / 1e6;
    if (rank == kStraggler) std::this_thread::sleep_for(std::chrono::duration<double>(5 * bound_s));
    cut_stats[rank] = run(static_cast<float>(rank + 1));
    Barrier(ctx);
    flush_stats[rank] = run(0.0f);
    flushed[rank] = buffer;
    Barrier(ctx);
  });
  for (int r = 0; r < kRanks; r++) {
    ASSERT_EQ(cut_stats[r].deferred_ranks, std::vector<int>{kStraggler}) << cut_stats[r].ToJson();
    EXPECT_TRUE(flush_stats[r].carried_in) << "rank " << r << flush_stats[r].ToJson();
    EXPECT_TRUE(flush_stats[r].deferred_ranks.empty()) << flush_stats[r].ToJson();
    // The straggler's own part (4 in every element) came back on every rank.
    EXPECT_EQ(flushed[r], std::vector<float>(kFew, 4.0f)) << "rank " << r;
  }
}

// The incast control hears of the network's loss only: a straggler's data, missing when
// phase 1 ends, is no loss (halving the concurrent senders for it would slow every later
// operation); packets dropped on the way are.
TEST(BoundedTranspose, AStragglerIsNoLossToTheIncastControlButDroppedPacketsAre) {
  constexpr int kStraggler = 3;
  uint64_t cut = 2;  // after calibration (TestPolicy: 2 operations), not led by the straggler
  while (LeaderOfStep(cut) == kStraggler) cut++;
  for (const double drop : {0.0, 0.05}) {
    InMemoryBoundedHub hub(kRanks, drop, 23);
    std::vector<OpStats> cut_stats(kRanks);
    RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
      auto policy = TestPolicy();
      const int rank = ctx->rank;
      std::vector<float> buffer;
      for (uint64_t step = 0; step <= cut; step++) {
        buffer = Gradient(rank, step);
        if (step == cut) {
          Barrier(ctx);
          const double bound_s = policy->BoundFor(kCount * 4).bound.count() / 1e6;
          if (drop == 0.0 && rank == kStraggler) {
            std::this_thread::sleep_for(std::chrono::duration<double>(5 * bound_s));
          }
        }
        const OpStats stats = BoundedSum(ctx, hub, policy, buffer);
        if (step == cut) cut_stats[rank] = stats;
      }
      Barrier(ctx);
    });
    for (int r = 0; r < kRanks; r++) {
      const std::vector<double> reports = hub.loss_reports(r);
      ASSERT_GE(reports.size(), 1u) << "rank " << r;
      const double last = reports.back();
      if (drop == 0.0) {
        ASSERT_EQ(cut_stats[0].deferred_ranks, std::vector<int>{kStraggler})
            << cut_stats[0].ToJson();
        EXPECT_EQ(last, 0.0) << "rank " << r << cut_stats[r].ToJson();
      } else {
        // 5% of ~1 000 packets into each rank: some inside what arrived, P(none) < 1e-20.
        EXPECT_GT(last, 0.0) << "rank " << r << cut_stats[r].ToJson();
        EXPECT_LT(last, 0.2) << "rank " << r << cut_stats[r].ToJson();
      }
    }
  }
}

// A rank returns from a bounded allreduce only once its phase-2 data has left it: rank 1
// holds its last phase-2 packet as a paced transport may, and its process exits as soon as
// its allreduce returns (its part is done). Rank 0 must still get the exact sum, as a Gloo
// collective's peer gets everything sent before the sender returned. (Returning first, rank
// 1 took that packet with it: rank 0 waited for its deadline and compensated.)
TEST(BoundedTranspose, AReturnedRanksPhase2DataHasLeftIt) {
  constexpr int kTwo = 2;
  InMemoryBoundedHub hub(kTwo, 0.0, 17);
  hub.HoldLastPhase2Packets(1);
  std::vector<double> exact(kCount, 0);
  constexpr uint64_t kBoundedStep = 2;  // after the policy's two calibration operations
  for (int r = 0; r < kTwo; r++) {
    for (size_t i = 0; i < kCount; i++) exact[i] += Gradient(r, kBoundedStep)[i];
  }
  RunThreads(kTwo, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = TestPolicy();
    for (uint64_t step = 0; step <= kBoundedStep; step++) {
      Call c = Allreduce(ctx, hub.channel(ctx->rank), policy, step, /*hadamard=*/false, 0.05);
      if (step < kBoundedStep) continue;
      ASSERT_EQ(c.stats.mode, OpMode::kBounded) << c.stats.ToJson();
      if (ctx->rank == 1) {
        hub.Exit(1);
        return;
      }
      EXPECT_EQ(c.stats.loss_pct, 0.0) << c.stats.ToJson();
      EXPECT_FALSE(c.stats.damaged) << c.stats.ToJson();
      EXPECT_LT(Compare(c.data, exact).rel_l2, 1e-6) << c.stats.ToJson();
    }
  });
}

TEST(BoundedTranspose, AboveLossLimitRepairsToExact) {
  // 10% drop, 1% limit: every bounded operation repairs. A repair that completes gives the
  // exact sum; one that runs out of its budget (a sanitizer build is 5-15x slower) may leave
  // a residue under the limit: then not damaged, and its error follows that residue.
  InMemoryBoundedHub hub(kRanks, 0.10, 7);
  std::atomic<int> exact{0};
  RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = TestPolicy();
    for (uint64_t step = 0; step < 4; step++) {
      Call c = Allreduce(ctx, hub.channel(ctx->rank), policy, step, true, /*max_loss=*/0.01);
      if (c.stats.mode != OpMode::kBounded) continue;
      EXPECT_TRUE(c.stats.phase[0].repaired || c.stats.phase[1].repaired);
      const double err = Compare(c.data, ExactSum(step)).rel_l2;
      if (c.stats.damaged) {
        // Only a repair that ran out (a sanitizer build) may leave damage, and it is
        // declared with its cause: this rank's loss, its phase-1 inputs, or an estimate.
        EXPECT_TRUE(c.stats.loss_pct > 1.0 || !c.stats.phase[1].estimated_peers.empty() ||
                    c.stats.phase[0].bytes_received < c.stats.phase[0].bytes_expected)
            << c.stats.ToJson();
        EXPECT_LT(err, 0.2) << c.stats.ToJson();
        continue;
      }
      if (c.stats.loss_pct == 0 && c.stats.phase[1].estimated_peers.empty()) {
        EXPECT_LT(err, 1e-5) << c.stats.ToJson();
        exact++;
      } else {
        EXPECT_LT(err, 2 * kNoise * std::sqrt(0.01) * std::sqrt(kRanks + 1.0)) << c.stats.ToJson();
      }
    }
  });
  EXPECT_GT(exact, 0) << "no repair completed";
}


// Minor page faults of the calling thread so far (Linux: per-thread rusage).
long ThreadMinorFaults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// The first bounded operation of a size must not pay for fresh scratch memory: on a VM,
// faulting in tens of MiB took longer than a phase's deadline, and the first bounded
// operation after calibration lost up to 83% of its data on every rank without any fault.
// The calibration operations size and touch the scratch, so the first bounded operation
// faults in about as few pages as the next one.
TEST(BoundedTranspose, FirstBoundedOperationFindsItsScratchFaultedIn) {
  constexpr size_t kBig = size_t{1} << 21;  // 8 MiB: 12 MiB of scratch per rank
  constexpr long kScratchPages = (kBig * 3 / 4) * 2 * sizeof(float) / 4096;
  InMemoryBoundedHub hub(kRanks, 0.0, 5);
  RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = TestPolicy(/*long_quiet=*/true);
    std::vector<float> data(kBig);
    long faults[4] = {};
    for (int step = 0; step < 4; step++) {
      std::fill(data.begin(), data.end(), static_cast<float>(ctx->rank + 1));
      OpStats stats;
      AllreduceOptions opts(ctx);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(RawFunc(&gloo::sum<float>));
      opts.setMode(AllreduceOptions::Mode::kBounded);
      opts.setHadamard(AllreduceOptions::Hadamard::kOff);
      opts.setBoundedChannel(hub.channel(ctx->rank));
      opts.setTimeoutPolicy(policy);
      opts.setStatsOutput(&stats);
      const long before = ThreadMinorFaults();
      allreduce(opts);
      faults[step] = ThreadMinorFaults() - before;
      EXPECT_EQ(stats.mode, step < 2 ? OpMode::kCalibration : OpMode::kBounded) << step;
      for (size_t i = 0; i < kBig; i += 4099) ASSERT_EQ(data[i], 10.0f) << step << " " << i;
    }
    // Without the warm-up the first bounded call faults in all kScratchPages pages. With
    // it, ranks skewed by a loaded host stage (allocate) what a fast peer sends first:
    // up to ~1560 more pages were seen then (1 run in 12 under two busy loops).
    EXPECT_LT(faults[2] - faults[3], kScratchPages * 3 / 4)
        << "rank " << ctx->rank << ": first bounded op " << faults[2] << " faults, second "
        << faults[3] << ", scratch " << kScratchPages << " pages";
  });
}

// AllreduceOptions' default Hadamard setting: in OptiReduce mode on where a TAR shard is
// smaller than a transform block (2^16 elements here, under 2^17) and off where it is not
// (2^17: the transform could not spread a deferred shard there, HadamardSpreadsShards);
// off in reliable TAR (exact sums). The transform's 1/sqrt(2^k) scaling rounds, so with it
// some of these small integer sums come out inexact; without it every one is exact.
TEST(BoundedTranspose, DefaultHadamardTransformsOptiReduceModesShardsUnderABlockOnly) {
  ASSERT_TRUE(HadamardSpreadsShards(kCount, kRanks, AllreduceOptions::kBoundedHadamardLog2Block));
  constexpr size_t kShardOfABlock = kRanks * (size_t{1} << AllreduceOptions::kBoundedHadamardLog2Block);
  ASSERT_FALSE(HadamardSpreadsShards(kShardOfABlock, kRanks,
                                     AllreduceOptions::kBoundedHadamardLog2Block));
  ASSERT_TRUE(HadamardSpreadsShards(kShardOfABlock - kRanks, kRanks,
                                    AllreduceOptions::kBoundedHadamardLog2Block));
  InMemoryBoundedHub hub(kRanks, 0.0, 3);
  RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = TestPolicy();
    for (const size_t count : {kCount, kShardOfABlock}) {
      for (bool bounded : {false, true}) {
        const bool transformed = bounded && count == kCount;
        for (int step = 0; step < 3; step++) {  // 2 calibration operations, then bounded
          std::vector<float> data(count);
          for (size_t i = 0; i < count; i++) data[i] = float((i * 7 + ctx->rank) % 13);
          AllreduceOptions opts(ctx);
          opts.setOutput(data.data(), data.size());
          opts.setReduceFunction(RawFunc(&gloo::sum<float>));
          OpStats stats;
          opts.setStatsOutput(&stats);
          if (bounded) {
            opts.setMode(AllreduceOptions::Mode::kBounded);
            opts.setBoundedChannel(hub.channel(ctx->rank));
            opts.setTimeoutPolicy(policy);
          }
          allreduce(opts);
          size_t inexact = 0;
          double max_err = 0;
          for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < kRanks; r++) want += float((i * 7 + r) % 13);
            inexact += data[i] != want;
            max_err = std::max(max_err, std::fabs(double(data[i]) - want));
          }
          const std::string where = "count " + std::to_string(count) + " step " +
                                    std::to_string(step) + (bounded ? " bounded" : " reliable");
          EXPECT_EQ(stats.hadamard_seed != 0, transformed) << where;
          if (transformed) {
            EXPECT_GT(inexact, 0u) << where << ": no rounding, so no transform";
            // Rounding only — unless a deadline cut data (a sanitizer build's slowdown).
            if (stats.loss_pct == 0 && !stats.damaged) {
              EXPECT_LT(max_err, 1e-3) << where;
            }
          } else if (!stats.damaged) {
            EXPECT_EQ(inexact, 0u) << where << ": transformed";
          }
        }
      }
    }
  });
}

// Incast control's lateness input: phase 1's transfer from the latest peer's first packet,
// against 3/4 of the phase's half of the bound; never when a peer was late or given up.
TEST(OpStats, RanLateCountsPhaseOnesTransferNotTheRanksSkew) {
  OpStats s;
  s.bound_ms = 200;  // phase 1's share 100 ms, late beyond 75 ms of transfer
  s.start_lag_ms = 10;
  s.phase[0].ms = 80;
  EXPECT_FALSE(s.RanLate());  // 70 ms of transfer
  s.phase[0].ms = 90;
  EXPECT_TRUE(s.RanLate());   // 80 ms
  s.start_lag_ms = 60;
  EXPECT_FALSE(s.RanLate());  // the same phase, but most of it waited for a late start
  s.start_lag_ms = 5;
  s.phase[0].late_peers = {3};
  EXPECT_FALSE(s.RanLate());  // a late peer: a straggler's doing
  s.phase[0].late_peers.clear();
  s.start_lag_gave_up = true;
  EXPECT_FALSE(s.RanLate());
  s.start_lag_gave_up = false;
  s.start_lag_ms = -1;  // not measured
  EXPECT_FALSE(s.RanLate());
}

TEST(BoundedTranspose, WithoutBoundedServiceRunsExactTar) {
  RunThreads(3, [&](const std::shared_ptr<gloo::Context>& ctx) {
    std::vector<int64_t> v(1000, ctx->rank + 1);
    OpStats stats;
    AllreduceOptions opts(ctx);
    opts.setOutput(v.data(), v.size());
    opts.setReduceFunction(RawFunc(&gloo::sum<int64_t>));
    opts.setMode(AllreduceOptions::Mode::kBounded);  // int64: never bounded
    allreduce(opts);
    for (int64_t x : v) ASSERT_EQ(x, 6);
    std::vector<float> f(1000, 1.0f);
    AllreduceOptions fopts(ctx);
    fopts.setOutput(f.data(), f.size());
    fopts.setReduceFunction(RawFunc(&gloo::sum<float>));
    fopts.setMode(AllreduceOptions::Mode::kBounded);  // Gloo TCP: no bounded service
    fopts.setStatsOutput(&stats);
    allreduce(fopts);
    for (float x : f) ASSERT_EQ(x, 3.0f);
    EXPECT_EQ(stats.mode, OpMode::kReliable);
  });
}

TEST(BoundedTranspose, LateRankIsCutByThePeerTimeoutThenRepairedToExact) {
  // Rank 3 calls late by a third of the bound. Once the two other peers of a rank are done
  // its phase 1 waits at most max(2x their transfer time, a quarter of the phase's bound)
  // for rank 3 (an eighth of the bound), so the peer timeout ends it; a third of the phase
  // is then missing, above the loss limit: a repair fetches it and the result is exact.
  InMemoryBoundedHub hub(kRanks, 0.0, 5);
  int cut = 0;
  std::mutex mu;
  RunThreads(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    TimeoutOptions o;
    o.calibration_ops = 2;
    o.min_bound = std::chrono::milliseconds(600);
    o.hard_cap = std::chrono::seconds(5);
    auto policy = std::make_shared<TimeoutPolicy>(o);
    for (uint64_t step = 0; step < 3; step++) {
      Allreduce(ctx, hub.channel(ctx->rank), policy, step, true, 0.05);
    }
    Barrier(ctx);
    const double bound_s = policy->BoundFor(kCount * 4).bound.count() / 1e6;
    if (ctx->rank == kRanks - 1) std::this_thread::sleep_for(std::chrono::duration<double>(0.3 * bound_s));
    Call c = Allreduce(ctx, hub.channel(ctx->rank), policy, 3, true, 0.05);
    EXPECT_LT(Compare(c.data, ExactSum(3)).rel_l2, 1e-5) << c.stats.ToJson();
    if (c.stats.phase[0].end == PhaseEnd::kPeerTimeout) {
      EXPECT_TRUE(c.stats.phase[0].repaired) << c.stats.ToJson();
      std::lock_guard<std::mutex> lock(mu);
      cut++;
    }
    Barrier(ctx);
  });
  EXPECT_GT(cut, 0) << "no rank's phase 1 ended by the peer timeout";
}

}  // namespace
}  // namespace optireduce
