// OptiReduce mode end to end over optireduce's own transport: the bounded service of the
// udp device (real processes) and the loop device (ranks as threads), with the transport's
// seeded fault injection. Complements bounded_transpose_test (algorithm over an in-memory
// channel).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gtest/gtest.h>

#include "algorithms/allreduce.h"
#include "algorithms/bounded_agreement.h"
#include "algorithms/operation_ledger.h"
#include "tests/common/gradients.h"
#include "tests/common/ranks.h"
#include "transport_dpdk/bounded/bounded_endpoint.h"
#include "transport_dpdk/bounded/incast_control.h"
#include "transport_dpdk/device.h"
#include "transport_dpdk/engine/engine.h"
#include "transport_dpdk/io/fault_injector.h"

namespace optireduce {
namespace {

using RawFunc = void (*)(void*, const void*, const void*, size_t);
using Clock = std::chrono::steady_clock;

constexpr size_t kCount = 1 << 20;  // 4 MiB of float32
constexpr double kNoise = 0.1;

// Rank r's gradient: a common signal plus a small deviation; sum over ranks is exact to
// compute anywhere (each process recomputes the others' inputs from their seeds).
void Gradient(int rank, uint64_t step, std::vector<float>* x) {
  std::mt19937_64 common(1000 + step), own(7 * rank + 31 * step + 1);
  std::normal_distribution<float> g(0, 1);
  x->resize(kCount);
  for (size_t i = 0; i < kCount; i++) (*x)[i] = g(common);
  for (size_t i = 0; i < kCount; i++) (*x)[i] += static_cast<float>(kNoise) * g(own);
}

std::vector<double> ExactSum(int ranks, uint64_t step) {
  std::vector<double> sum(kCount, 0);
  std::vector<float> x;
  for (int r = 0; r < ranks; r++) {
    Gradient(r, step, &x);
    for (size_t i = 0; i < kCount; i++) sum[i] += x[i];
  }
  return sum;
}

using testing::RelL2;

// `peer_timeout`: off where a test measures the injected loss exactly — a rank of a loaded
// test host descheduled for a while would be cut by it and add its own loss.
std::shared_ptr<TimeoutPolicy> Policy(std::chrono::milliseconds min_bound,
                                      bool peer_timeout = false) {
  TimeoutOptions o;
  if (!peer_timeout) o.peer_timeout_factor = 0;
  o.calibration_ops = 3;
  o.min_bound = min_bound;
  o.hard_cap = std::chrono::seconds(5);
  // A loaded test host may deschedule a receiver for tens of ms after the last packets.
  o.max_quiet = std::chrono::milliseconds(200);
  return std::make_shared<TimeoutPolicy>(o);
}

std::string DeviceStats(const std::shared_ptr<gloo::Context>& ctx) {
  auto* device = dynamic_cast<transport::Device*>(ctx->getDevice().get());
  return device ? device->stats().ToString() : "not our device";
}

struct Result {
  std::vector<float> data;
  OpStats stats;
  double seconds = 0;
};

// Each rank (process or thread) reduces in one buffer, as a DDP bucket: a contribution an
// operation defers comes back in the next one on that buffer (bounded_agreement.h).
Result Reduce(const std::shared_ptr<gloo::Context>& ctx, const std::shared_ptr<TimeoutPolicy>& p,
           uint64_t step, double max_loss) {
  thread_local std::vector<float> bucket;
  Result r;
  Gradient(ctx->rank, step, &bucket);
  AllreduceOptions opts(ctx);
  opts.setOutput(bucket.data(), bucket.size());
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setMode(AllreduceOptions::Mode::kBounded);
  opts.setHadamard(AllreduceOptions::Hadamard::kAuto);
  opts.setTimeoutPolicy(p);
  opts.setMaxLoss(max_loss);
  opts.setStatsOutput(&r.stats);
  const auto start = Clock::now();
  allreduce(opts);
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.data = bucket;
  return r;
}

// A checksum of the result's bytes; equal on every rank exactly when the bytes are.
double Checksum(const std::vector<float>& data) {
  uint64_t h = 1469598103934665603ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  for (size_t i = 0; i < data.size() * sizeof(float); i++) h = (h ^ bytes[i]) * 1099511628211ULL;
  return static_cast<double>(h >> 12);  // 52 bits: exact in a double
}

// True when every rank of `ctx` holds a result with this checksum (max and min agree).
bool SameOnEveryRank(const std::shared_ptr<gloo::Context>& ctx, double sum) {
  double hi = sum, lo = sum;
  for (auto [v, fn] : {std::pair<double*, RawFunc>{&hi, RawFunc(&gloo::max<double>)},
                       std::pair<double*, RawFunc>{&lo, RawFunc(&gloo::min<double>)}}) {
    gloo::AllreduceOptions opts(ctx);
    opts.setOutput(v, 1);
    opts.setReduceFunction(fn);
    opts.setTag(98);
    gloo::allreduce(opts);
  }
  return hi == lo && hi == sum;
}

testing::DeviceFactory Udp(const std::string& faults) {
  return [faults](int) {
    transport::EngineOptions engine;
    engine.faults = faults;
    return transport::udp::CreateDevice(transport::udp::attr(), engine);
  };
}

// Payload bytes of bounded packets the device's fault injector dropped on receive so far.
uint64_t InjectedBoundedBytes(const std::shared_ptr<gloo::Context>& ctx) {
  auto* device = dynamic_cast<transport::Device*>(ctx->getDevice().get());
  if (device == nullptr) return 0;
  auto* injector = dynamic_cast<transport::FaultInjector*>(device->engine()->io());
  return injector == nullptr ? 0 : injector->counters().bounded_bytes_dropped.load();
}

// Runs 7 operations per rank in real processes (3 calibrating, then bounded) under the
// injected faults; returns RunProcesses' verdict. Every result is the same on every rank;
// one with nothing deferred and nothing carried in is the exact sum; a bounded byte the
// fault injector dropped on a rank's receive path is a hole that rank repaired (counted,
// not against the drop rate: ~1000 packets per rank leave no useful bound).
std::string RunUdp(int ranks, const std::string& faults, std::chrono::milliseconds min_bound) {
  testing::RankOptions options;
  options.device = Udp(faults);
  return testing::RunProcesses(ranks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = Policy(min_bound);
    int repaired = 0;
    bool deferred = false;
    uint64_t injected_before = 0;
    for (uint64_t step = 0; step < 7; step++) {
      const auto want = ExactSum(ctx->size, step);
      if (step == 3) injected_before = InjectedBoundedBytes(ctx);
      Result r = Reduce(ctx, policy, step, 0.05);
      for (float v : r.data) ASSERT_TRUE(std::isfinite(v));
      EXPECT_TRUE(SameOnEveryRank(ctx, Checksum(r.data))) << "step " << step << r.stats.ToJson();
      if (step < 3) {
        ASSERT_EQ(r.stats.mode, OpMode::kCalibration);
        ASSERT_LT(RelL2(r.data, want), 1e-5);
        continue;
      }
      ASSERT_EQ(r.stats.mode, OpMode::kBounded) << r.stats.ToJson();
      repaired += r.stats.phase[0].repaired || r.stats.phase[1].repaired;
      deferred = deferred || !r.stats.deferred_ranks.empty();
      // A rank of a loaded host descheduled past the start grace is deferred: flagged,
      // and carried into the next operation.
      if (r.stats.deferred_ranks.empty() && !r.stats.carried_in) {
        EXPECT_LT(RelL2(r.data, want), 1e-5) << r.stats.ToJson() << " device: " << DeviceStats(ctx);
      }
    }
    if (InjectedBoundedBytes(ctx) > injected_before && !deferred) {
      EXPECT_GT(repaired, 0) << "rank " << ctx->rank;
    }
    gloo::BarrierOptions b(ctx);
    b.setTag(6);
    gloo::barrier(b);
  }, options);
}

TEST(OptiReduceModeUdp, NoFaultsIsExactAndTheSameOnEveryRank) {
  EXPECT_EQ(RunUdp(4, "", std::chrono::milliseconds(300)), "");
}

TEST(OptiReduceModeUdp, OnePercentDropIsRepairedToTheSameExactSumOnEveryRank) {
  EXPECT_EQ(RunUdp(4, "drop=0.01,seed=11", std::chrono::milliseconds(300)), "");
}

TEST(OptiReduceModeUdp, LateRankIsCutByThePeerTimeoutThenRepairedToExact) {
  // One rank calls late (a third of the bound): the others' phase 1 ends by the adaptive
  // peer timeout with its contribution missing (a third of the phase: above the loss
  // limit), so they ask it for a repair, which it serves once it runs: exact again.
  testing::RankOptions options;
  options.device = Udp("");
  EXPECT_EQ(testing::RunProcesses(4, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = Policy(std::chrono::milliseconds(600), /*peer_timeout=*/true);
    for (uint64_t step = 0; step < 3; step++) Reduce(ctx, policy, step, 0.05);
    int cut = 0;
    for (uint64_t step = 3; step < 6; step++) {
      gloo::BarrierOptions b(ctx);
      b.setTag(7);
      gloo::barrier(b);
      const auto bound = policy->BoundFor(kCount * 4).bound;
      if (ctx->rank == 3) std::this_thread::sleep_for(bound / 3);
      Result r = Reduce(ctx, policy, step, 0.05);
      ASSERT_EQ(r.stats.mode, OpMode::kBounded);
      if (r.stats.phase[0].end == PhaseEnd::kPeerTimeout) cut++;
      EXPECT_LT(RelL2(r.data, ExactSum(ctx->size, step)), 1e-5)
          << r.stats.ToJson() << " device: " << DeviceStats(ctx);
    }
    if (ctx->rank != 3) {
      EXPECT_GT(cut, 0) << "the peer timeout never ended a phase";
    }
    gloo::BarrierOptions b(ctx);
    b.setTag(8);
    gloo::barrier(b);
  }, options), "");
}

TEST(OptiReduceModeUdp, AboveLossLimitRepairsToExact) {
  testing::RankOptions options;
  options.device = Udp("drop=0.05,seed=5");
  EXPECT_EQ(testing::RunProcesses(3, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = Policy(std::chrono::seconds(2));
    for (uint64_t step = 0; step < 5; step++) {
      const auto want = ExactSum(ctx->size, step);
      Result r = Reduce(ctx, policy, step, /*max_loss=*/0.001);
      if (r.stats.mode != OpMode::kBounded) continue;
      EXPECT_TRUE(r.stats.phase[0].repaired || r.stats.phase[1].repaired) << r.stats.ToJson();
      EXPECT_FALSE(r.stats.damaged) << r.stats.ToJson();
      EXPECT_LT(RelL2(r.data, want), 1e-5) << r.stats.ToJson();
    }
    // Repairs are served by live peers: nobody leaves while another may still ask.
    gloo::BarrierOptions b(ctx);
    b.setTag(6);
    gloo::barrier(b);
  }, options), "");
}

TEST(OptiReduceModeUdp, HeavyLossRepairsToExactEveryTime) {
  // 10% drop in both directions, repair on any loss, ranks running back to back (no
  // barrier between operations): repairs race with later operations and must still be
  // served from the right bytes.
  testing::RankOptions options;
  options.device = Udp("drop=0.10,seed=9");
  EXPECT_EQ(testing::RunProcesses(4, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = Policy(std::chrono::seconds(1));
    for (uint64_t step = 0; step < 12; step++) {
      const auto want = ExactSum(ctx->size, step);
      Result r = Reduce(ctx, policy, step, /*max_loss=*/0.0001);
      if (r.stats.damaged) continue;  // a repair that ran out of time is flagged, not exact
      EXPECT_LT(RelL2(r.data, want), 1e-5) << r.stats.ToJson() << " device: " << DeviceStats(ctx);
    }
    gloo::BarrierOptions b(ctx);
    b.setTag(6);
    gloo::barrier(b);
  }, options), "");
}

TEST(OptiReduceModeLoop, IncastControlFollowsEachOperationsLoss) {
  // The Gloo context hands OptiReduce mode our endpoint itself, so the per-operation loss
  // and lateness feedback reaches the engine's limit of concurrent senders (it starts at 1
  // and grows after a run of loss-free, timely operations; loss halves it, lateness takes
  // one off).
  testing::RankOptions options;
  options.device = [](int) { return transport::loop::CreateDevice(); };
  testing::RunThreads(4, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto* endpoint = dynamic_cast<transport::BoundedEndpoint*>(BoundedChannelOf(*ctx));
    ASSERT_NE(endpoint, nullptr);
    ASSERT_EQ(endpoint->ConcurrentSenders(), 1);
    auto policy = Policy(std::chrono::milliseconds(500));
    transport::IncastControl model(ctx->size - 1, 1);
    for (uint64_t step = 0; step < 3 + transport::IncastControl::kCleanOpsToGrow + 1; step++) {
      Result r = Reduce(ctx, policy, step % 4, 0.05);
      if (r.stats.mode != OpMode::kBounded) continue;
      // What the engine is told: the share of both phases' bytes lost on the way (holes
      // below the furthest byte that arrived, before repairs: bounded_transpose.cc), not
      // what was still in flight, nor loss_pct (what stayed deferred after repairs, 0 here:
      // repairs make a late or lossy phase whole on the loop device).
      const uint64_t expected = r.stats.phase[0].bytes_expected + r.stats.phase[1].bytes_expected;
      const uint64_t holes = r.stats.phase[0].bytes_in_holes + r.stats.phase[1].bytes_in_holes;
      model.OnOperation(expected == 0 ? 0.0 : static_cast<double>(holes) / expected,
                        r.stats.RanLate());
    }
    EXPECT_EQ(endpoint->ConcurrentSenders(), model.senders());
    EXPECT_GE(model.senders(), 1);
    gloo::BarrierOptions b(ctx);
    b.setTag(9);
    gloo::barrier(b);
  }, options);
}

// The leader of the `sequence`-th operation with tag 0 (Reduce's) among `ranks`.
int LeaderOfStep(uint64_t sequence, int ranks) {
  return LeaderOf(OperationLedger::Key(0, sequence), ranks);
}

// Which rank of operation 4 straggles.
enum class LateRole { kOther, kLeader, kDeputy };

// A rank late for operation 4 is left out: the others return without it, and its part
// comes back in the next operation. Not its leader: the leader leaves it out; its leader:
// the leader's transport hands the decision to its deputy, which leaves it out.
void StragglerDoesNotStallOthers(LateRole role) {
  const bool straggler_leads = role == LateRole::kLeader;
  testing::RankOptions options;
  options.device = [](int) { return transport::loop::CreateDevice(); };
  const int ranks = 4;
  std::vector<std::vector<double>> want;
  for (uint64_t step = 0; step < 6; step++) want.push_back(ExactSum(ranks, step));
  const int leader = LeaderOfStep(4, ranks);
  const int deputy = DeputyOf(leader, ranks);
  const int late = role == LateRole::kLeader   ? leader
                   : role == LateRole::kDeputy ? deputy
                                               : (leader + 2) % ranks;
  const int decider = straggler_leads ? deputy : leader;
  std::vector<std::vector<float>> cut(ranks), next(ranks);
  std::mutex others_mu;
  std::condition_variable others_cv;
  int others_done = 0;  // ranks other than the straggler that returned from operation 4
  testing::RunThreads(ranks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = Policy(std::chrono::milliseconds(200));
    OpStats last;
    for (uint64_t step = 0; step < 4; step++) last = Reduce(ctx, policy, step, 0.05).stats;
    ASSERT_EQ(last.mode, OpMode::kBounded) << last.ToJson();
    gloo::BarrierOptions b(ctx);
    b.setTag(5);
    gloo::barrier(b);
    // The straggler calls operation 4 only once the others have returned from it: they
    // cannot have waited for its data, whatever the host's load makes of the bound and the
    // start grace; had they stalled waiting for it, they would never return. (The wait is
    // capped as a hang guard: a rank that raised still lets the straggler go on.)
    const bool straggler = ctx->rank == late;
    if (straggler) {
      std::unique_lock<std::mutex> lock(others_mu);
      others_cv.wait_for(lock, std::chrono::seconds(120), [&] { return others_done == ranks - 1; });
      EXPECT_EQ(others_done, ranks - 1) << "the others did not return without the straggler";
    }
    auto* device = dynamic_cast<transport::Device*>(ctx->getDevice().get());
    ASSERT_NE(device, nullptr);
    const uint64_t sent_before = device->stats().bounded_tx_packets;
    Result r;
    {
      struct Done {
        bool count;
        std::mutex& mu;
        std::condition_variable& cv;
        int& n;
        ~Done() {
          if (!count) return;
          std::lock_guard<std::mutex> lock(mu);
          n++;
          cv.notify_all();
        }
      } done{!straggler, others_mu, others_cv, others_done};
      r = Reduce(ctx, policy, 4, 0.05);
    }
    for (float v : r.data) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(r.stats.deferred_ranks, std::vector<int>{late}) << r.stats.ToJson();
    EXPECT_TRUE(r.stats.damaged) << r.stats.ToJson();
    EXPECT_EQ(r.stats.leader, decider) << r.stats.ToJson();
    EXPECT_EQ(r.stats.deputy_decided, straggler_leads) << r.stats.ToJson();
    if (straggler) {
      // It began after the decision without it had come: it sent nothing (nobody counts
      // its data; its whole contribution is carried).
      EXPECT_EQ(device->stats().bounded_tx_packets, sent_before) << DeviceStats(ctx);
    }
    if (ctx->rank == decider) {
      // The straggler's engine answered the decider's requests "not started" (kFlagAbsent).
      EXPECT_GT(device->stats().repair_absent_received, 0u) << DeviceStats(ctx);
    }
    if (straggler_leads && ctx->rank == leader) {
      // Its engine handed the decision over while this rank had not begun the operation.
      EXPECT_GT(device->stats().cede_granted, 0u) << DeviceStats(ctx);
    }
    cut[ctx->rank] = r.data;
    gloo::barrier(b);
    Result n = Reduce(ctx, policy, 5, 0.05);
    EXPECT_TRUE(n.stats.carried_in) << n.stats.ToJson();
    EXPECT_TRUE(n.stats.deferred_ranks.empty()) << n.stats.ToJson();
    next[ctx->rank] = n.data;
    gloo::barrier(b);  // nobody tears down while a peer may still ask for repairs
  }, options);
  for (int r = 0; r < ranks; r++) {
    ASSERT_EQ(cut[r], cut[0]) << "rank " << r;
    ASSERT_EQ(next[r], next[0]) << "rank " << r;
  }
  // Deferred, not lost: the two results add up to the two exact sums.
  std::vector<float> both(kCount);
  std::vector<double> want_both(kCount);
  for (size_t i = 0; i < kCount; i++) {
    both[i] = cut[0][i] + next[0][i];
    want_both[i] = want[4][i] + want[5][i];
  }
  EXPECT_LT(RelL2(both, want_both), 1e-5);
  EXPECT_GT(RelL2(cut[0], want[4]), 0.1) << "nothing was deferred";
}

TEST(OptiReduceModeLoop, StragglerDoesNotStallOthersAndComesBackInTheNextOperation) {
  StragglerDoesNotStallOthers(LateRole::kOther);
}

TEST(OptiReduceModeLoop, AStragglingLeaderDoesNotStallOthers) {
  StragglerDoesNotStallOthers(LateRole::kLeader);
}

TEST(OptiReduceModeLoop, AStragglingDeputyDoesNotStallOthers) {
  StragglerDoesNotStallOthers(LateRole::kDeputy);
}

// The calibrating operations teach the start grace (their fingerprints' arrival): the
// first bounded operation already uses a learned grace, not the repair budget.
TEST(OptiReduceModeLoop, TheStartGraceIsLearnedByTheEndOfCalibration) {
  testing::RankOptions options;
  options.device = [](int) { return transport::loop::CreateDevice(); };
  testing::RunThreads(4, [&](const std::shared_ptr<gloo::Context>& ctx) {
    TimeoutOptions o;
    o.calibration_ops = 6;
    o.start_history_min = 6;
    o.min_bound = std::chrono::milliseconds(200);
    o.repair_budget_fraction = 3;
    o.learn_start_grace = true;
    auto policy = std::make_shared<TimeoutPolicy>(o);
    OpStats last;
    for (uint64_t step = 0; step < 6; step++) {
      last = Reduce(ctx, policy, step, 0.05).stats;
      ASSERT_EQ(last.mode, OpMode::kCalibration) << last.ToJson();
      EXPECT_GE(last.start_lag_ms, 0) << last.ToJson();
    }
    const TimeBound bound = policy->BoundFor(kCount * 4);
    EXPECT_TRUE(bound.start_grace_learned);
    const Result first = Reduce(ctx, policy, 6, 0.05);
    ASSERT_EQ(first.stats.mode, OpMode::kBounded) << first.stats.ToJson();
    // The budget grace is half the bound + 3 bounds; the learned one is how late peers
    // start here (threads of one process), far less (timeout_policy_test checks the
    // percentile).
    EXPECT_LT(first.stats.start_grace_ms, 3.5 * first.stats.bound_ms) << first.stats.ToJson();
    gloo::BarrierOptions b(ctx);
    b.setTag(5);
    gloo::barrier(b);
  }, options);
}

// A policy with the learned start grace (OPTIREDUCE_START_GRACE=learned) from
// `start_history_min` start lags, 3 calibrating operations and no peer timeout.
std::shared_ptr<TimeoutPolicy> LearnedGracePolicy(double repair_budget_fraction,
                                                  size_t start_history_min) {
  TimeoutOptions o;
  o.peer_timeout_factor = 0;
  o.calibration_ops = 3;
  o.min_bound = std::chrono::milliseconds(200);
  o.max_quiet = std::chrono::milliseconds(20);
  o.repair_budget_fraction = repair_budget_fraction;
  o.learn_start_grace = true;
  o.start_history_min = start_history_min;
  return std::make_shared<TimeoutPolicy>(o);
}

// A straggler that starts an operation once the others have returned from it (ranks are
// threads here): however the host schedules the leader, it has decided without it.
class StragglerGate {
 public:
  explicit StragglerGate(int others) : others_(others) {}
  // The straggler, before its call: waits for the others (capped: a hang guard).
  void AwaitOthers() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(120), [&] { return returned_ == others_; });
    EXPECT_EQ(returned_, others_) << "the others did not return without the straggler";
  }
  // Each other rank, after its call.
  void Returned() {
    std::lock_guard<std::mutex> lock(mu_);
    returned_++;
    cv_.notify_all();
  }

 private:
  const int others_;
  std::mutex mu_;
  std::condition_variable cv_;
  int returned_ = 0;
};

TEST(OptiReduceModeLoop, StragglerIsGivenUpAtTheLearnedStartGrace) {
  // Ranks that start together teach the policy that peers start within milliseconds; a
  // straggler is then given up at that grace, not after the whole repair budget (3 bounds
  // here), and the next operation is exact again.
  testing::RankOptions options;
  options.device = [](int) { return transport::loop::CreateDevice(); };
  const int ranks = 4;
  // The straggler of operation 9 (3 calibrating and 6 bounded before it), not its leader.
  const int late = LeaderOfStep(9, ranks) == 2 ? 3 : 2;
  std::vector<std::vector<float>> cut(ranks), next_of(ranks);
  StragglerGate gate(ranks - 1);
  testing::RunThreads(ranks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = LearnedGracePolicy(/*repair_budget_fraction=*/3, /*start_history_min=*/6);
    gloo::BarrierOptions b(ctx);
    b.setTag(5);
    OpStats last;
    for (uint64_t step = 0; step < 3 + 6; step++) {
      gloo::barrier(b);
      Result r = Reduce(ctx, policy, step, 0.05);
      if (step >= 3) {
        ASSERT_EQ(r.stats.mode, OpMode::kBounded);
        ASSERT_GE(r.stats.start_lag_ms, 0) << r.stats.ToJson();
      }
      last = r.stats;
    }
    // The bound the ranks agreed on (the same for every bounded operation of the size), with
    // this rank's learned start grace.
    const TimeBound bound = policy->BoundWith(
        kCount * 4, std::chrono::microseconds(std::llround(last.bound_ms * 1000)),
        last.bound_capped);
    // Learned (how much shorter than the budget it is depends on how the host schedules
    // the ranks: timeout_policy_test checks the percentile itself); the operation below
    // must use exactly it.
    ASSERT_TRUE(bound.start_grace_learned);
    gloo::barrier(b);
    const bool straggler = ctx->rank == late;
    if (straggler) gate.AwaitOthers();
    Result r = Reduce(ctx, policy, 20, 0.05);
    if (!straggler) gate.Returned();
    for (float v : r.data) ASSERT_TRUE(std::isfinite(v));
    // The straggler is left out, the leader never. A peer the host held back past the
    // grace (it was learned from ranks that met at a barrier) is left out too: the grace
    // is what a rank gets, on a loaded host as well.
    const std::vector<int>& deferred = r.stats.deferred_ranks;
    EXPECT_NE(std::find(deferred.begin(), deferred.end(), late), deferred.end())
        << r.stats.ToJson();
    EXPECT_EQ(std::find(deferred.begin(), deferred.end(), r.stats.leader), deferred.end())
        << r.stats.ToJson();
    if (!straggler) {
      EXPECT_TRUE(r.stats.start_lag_gave_up || ctx->rank != LeaderOfStep(9, ranks))
          << r.stats.ToJson();
      EXPECT_DOUBLE_EQ(r.stats.start_grace_ms, bound.start_grace.count() / 1000.0);
      EXPECT_TRUE(r.stats.damaged) << r.stats.ToJson();
      // Phase 1's deadline, the grace, phase 2 (its deadline): half of the slack that
      // waiting out the repair budget would have taken.
      const auto given_up_by = bound.bound + bound.start_grace + bound.repair_budget / 2;
      EXPECT_LT(r.seconds, std::chrono::duration<double>(given_up_by).count())
          << r.stats.ToJson();
    }
    cut[ctx->rank] = r.data;
    gloo::barrier(b);
    Result next = Reduce(ctx, policy, 21, 0.05);
    for (float v : next.data) ASSERT_TRUE(std::isfinite(v));
    next_of[ctx->rank] = next.data;
    gloo::barrier(b);
  }, options);
  for (int r = 0; r < ranks; r++) {
    ASSERT_EQ(cut[r], cut[0]) << "rank " << r;
    ASSERT_EQ(next_of[r], next_of[0]) << "rank " << r;
  }
}

// The start lag that teaches the grace leaves out a rank still catching up on an operation
// it was left out of: its lateness is a straggle, not the ranks' usual skew. Three
// calibrating operations and the straggler's operation leave 4 start lags, one short of
// the 5 the grace is learned from; in the next operation the straggler (left out of the
// last decision) is late again: that operation still teaches the grace, from the others.
TEST(OptiReduceModeLoop, TheStartLagLeavesOutARankStillCatchingUp) {
  testing::RankOptions options;
  options.device = [](int) { return transport::loop::CreateDevice(); };
  const int ranks = 4;
  int late = 0;  // leads neither operation 3 nor 4
  while (late == LeaderOfStep(3, ranks) || late == LeaderOfStep(4, ranks)) late++;
  StragglerGate gate3(ranks - 1), gate4(ranks - 1);
  testing::RunThreads(ranks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = LearnedGracePolicy(/*repair_budget_fraction=*/1, /*start_history_min=*/5);
    gloo::BarrierOptions b(ctx);
    b.setTag(5);
    for (uint64_t step = 0; step < 3; step++) {
      gloo::barrier(b);
      ASSERT_EQ(Reduce(ctx, policy, step, 0.05).stats.mode, OpMode::kCalibration);
    }
    gloo::barrier(b);
    const bool straggler = ctx->rank == late;
    if (straggler) gate3.AwaitOthers();
    const Result cut = Reduce(ctx, policy, 3, 0.05);
    if (!straggler) gate3.Returned();
    ASSERT_EQ(cut.stats.mode, OpMode::kBounded) << cut.stats.ToJson();
    ASSERT_EQ(cut.stats.deferred_ranks, std::vector<int>{late}) << cut.stats.ToJson();
    EXPECT_FALSE(policy->BoundFor(kCount * 4).start_grace_learned) << "4 lags, 5 needed";
    gloo::barrier(b);
    if (straggler) gate4.AwaitOthers();
    const Result again = Reduce(ctx, policy, 4, 0.05);
    if (!straggler) gate4.Returned();
    ASSERT_TRUE(again.stats.carried_in) << again.stats.ToJson();
    ASSERT_EQ(again.stats.deferred_ranks, std::vector<int>{late}) << again.stats.ToJson();
    if (!straggler) {
      // The others' lag only: all of them had started (the straggler had not).
      EXPECT_FALSE(again.stats.start_lag_gave_up) << again.stats.ToJson();
      EXPECT_LT(again.stats.start_lag_ms, again.stats.start_grace_ms) << again.stats.ToJson();
    }
    EXPECT_TRUE(policy->BoundFor(kCount * 4).start_grace_learned)
        << "the operation after the cut taught no start grace";
    gloo::barrier(b);
  }, options);
}

}  // namespace
}  // namespace optireduce
