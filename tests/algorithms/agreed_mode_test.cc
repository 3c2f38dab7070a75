// OptiReduce mode decides from state every rank of a context shares: which operations
// calibrate (exact TAR) and which run bounded, and the Hadamard seed of each. Ranks are
// threads on the loop device; each rank has its own TimeoutPolicy, as separate processes
// would (the process-wide default would be shared by all the threads of a test).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>

#include "algorithms/allreduce.h"
#include "algorithms/bounded_agreement.h"
#include "algorithms/operation_ledger.h"
#include "tests/common/in_memory_bounded_hub.h"
#include "tests/common/ranks.h"
#include "transport_dpdk/bounded/bounded_endpoint.h"
#include "transport_dpdk/device.h"

namespace optireduce {
namespace {

using RawFunc = void (*)(void*, const void*, const void*, size_t);

constexpr int kCalibration = 3;

std::shared_ptr<TimeoutPolicy> RankPolicy() {
  TimeoutOptions o;
  o.calibration_ops = kCalibration;
  // Threads on 2 shared cores: bounds far above scheduling noise, no peer timeout.
  o.min_bound = std::chrono::milliseconds(400);
  o.hard_cap = std::chrono::seconds(5);
  o.max_quiet = std::chrono::milliseconds(200);
  o.peer_timeout_factor = 0;
  return std::make_shared<TimeoutPolicy>(o);
}

// Rank r's input: a common signal plus a small deviation; the exact sum is recomputed.
std::vector<float> Input(int rank, uint64_t step, size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i++) {
    x[i] = std::sin(0.001f * i + step) + 0.01f * static_cast<float>((rank + 1) * ((i % 7) + 1));
  }
  return x;
}

double RelErr(const std::vector<float>& got, const std::vector<int>& ranks, uint64_t step) {
  double num = 0, den = 0;
  std::vector<double> want(got.size(), 0);
  for (int r : ranks) {
    const auto x = Input(r, step, got.size());
    for (size_t i = 0; i < got.size(); i++) want[i] += x[i];
  }
  for (size_t i = 0; i < got.size(); i++) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

struct Call {
  std::vector<float> data;
  OpStats stats;
};

// Exact unless the operation deferred a part of the sum or carried one in: a rank
// descheduled on a loaded host past the start grace is a straggler by design; what it
// defers is flagged (the same on every rank) and comes back in a later operation.
double Limit(const Call& c) {
  return c.stats.damaged || c.stats.carried_in ? std::numeric_limits<double>::infinity() : 1e-4;
}

// `input_rank`: whose input this rank contributes (its rank in the world, in a sub-group).
Call Reduce(const std::shared_ptr<gloo::Context>& ctx, const std::shared_ptr<TimeoutPolicy>& policy,
            int input_rank, uint64_t step, size_t n, uint32_t tag,
            BoundedChannel* channel = nullptr) {
  Call c;
  c.data = Input(input_rank, step, n);
  AllreduceOptions opts(ctx);
  opts.setOutput(c.data.data(), c.data.size());
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setMode(AllreduceOptions::Mode::kBounded);
  opts.setTimeoutPolicy(policy);
  opts.setTag(tag);
  opts.setStatsOutput(&c.stats);
  if (channel != nullptr) opts.setBoundedChannel(channel);
  allreduce(opts);
  return c;
}

void Barrier(const std::shared_ptr<gloo::Context>& ctx, uint32_t tag = 77) {
  gloo::BarrierOptions b(ctx);
  b.setTag(tag);
  gloo::barrier(b);
}

testing::RankOptions Loop(const std::string& faults = "") {
  testing::RankOptions options;
  options.device = [faults](int) {
    transport::EngineOptions engine;
    engine.faults = faults;
    return transport::loop::CreateDevice(transport::loop::attr(), engine);
  };
  // A rank that disagreed would wait for a peer until this timeout: keep failures short.
  options.context_timeout = std::chrono::milliseconds(8000);
  return options;
}

// The modes one rank ran, in order, "c" calibration and "b" bounded.
std::string Modes(const std::vector<OpStats>& stats) {
  std::string s;
  for (const OpStats& st : stats) s += st.mode == OpMode::kCalibration ? 'c' : st.mode == OpMode::kBounded ? 'b' : '?';
  return s;
}

// Rank 1 is in two process groups (A = {0, 1}, B = {1, 2}) and runs both groups' operations
// of two sizes interleaved. Each group calibrates its own first operations of each size:
// with one count per process and size, rank 1 ran B's second operation of a size bounded
// (it had seen A's too) while rank 2 still calibrated, and both waited until the timeout.
TEST(AgreedMode, TwoProcessGroupsSharingARankWithInterleavedSizes) {
  gloo::rendezvous::HashStore store;
  constexpr size_t kSmall = 1 << 14, kLarge = 3 << 14;
  constexpr int kSteps = 6;
  testing::RunThreads(3, [&](const std::shared_ptr<gloo::Context>& world) {
    auto policy = RankPolicy();
    auto join = [&](const char* name, int first) {
      gloo::rendezvous::PrefixStore prefixed(name, store);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(world->rank - first, 2);
      ctx->setTimeout(std::chrono::milliseconds(8000));
      ctx->connectFullMesh(prefixed, world->getDevice());
      return ctx;
    };
    std::shared_ptr<gloo::Context> a, b;
    if (world->rank <= 1) a = join("A", 0);
    if (world->rank >= 1) b = join("B", 1);
    std::vector<OpStats> in_a, in_b;
    for (uint64_t step = 0; step < kSteps; step++) {
      for (size_t n : {kSmall, kLarge}) {
        if (a) {
          Call c = Reduce(a, policy, world->rank, step, n, 1);
          EXPECT_LT(RelErr(c.data, {0, 1}, step), Limit(c)) << c.stats.ToJson();
          in_a.push_back(c.stats);
        }
        if (b) {
          Call c = Reduce(b, policy, world->rank, step, n, 1);
          EXPECT_LT(RelErr(c.data, {1, 2}, step), Limit(c)) << c.stats.ToJson();
          in_b.push_back(c.stats);
        }
      }
    }
    // Per group and size: the first kCalibration calibrate, the rest run bounded.
    const std::string want = "ccccccbbbbbb";
    if (a) {
      EXPECT_EQ(Modes(in_a), want) << "rank " << world->rank << " in group A";
    }
    if (b) {
      EXPECT_EQ(Modes(in_b), want) << "rank " << world->rank << " in group B";
    }
    Barrier(world);
  }, Loop());
}

// A job loses rank 1 in the middle of calibration; rank 1 restarts (a fresh process: a new
// policy) and both join a new job (new contexts). Rank 0's process keeps its policy, which
// had counted two calibration operations of the size; the new context calibrates from the
// start on both ranks all the same, so nobody waits for a peer in another mode.
TEST(AgreedMode, ARankRestartedIntoANewJobMidCalibration) {
  constexpr size_t kCount = 1 << 14;
  auto survivor = RankPolicy();
  testing::RunThreads(2, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = ctx->rank == 0 ? survivor : RankPolicy();
    for (uint64_t step = 0; step < kCalibration - 1; step++) {
      EXPECT_EQ(Reduce(ctx, policy, ctx->rank, step, kCount, 0).stats.mode, OpMode::kCalibration);
    }
    Barrier(ctx);
  }, Loop());
  testing::RunThreads(2, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = ctx->rank == 0 ? survivor : RankPolicy();  // rank 1: restarted
    std::vector<OpStats> stats;
    for (uint64_t step = 0; step < 6; step++) {
      Call c = Reduce(ctx, policy, ctx->rank, step, kCount, 0);
      EXPECT_LT(RelErr(c.data, {0, 1}, step), Limit(c)) << c.stats.ToJson();
      stats.push_back(c.stats);
    }
    EXPECT_EQ(Modes(stats), "cccbbb") << "rank " << ctx->rank;
    Barrier(ctx);
  }, Loop());
}

// Two operations of one size started at once from two threads as that size's calibration
// ends can be counted in opposite orders on two ranks (operation_ledger.h): one rank then
// calibrates an operation its peer runs bounded. Forced here by giving the ranks different
// calibration counts: the calibrating rank finds its peer's bounded data for the operation
// and joins it, instead of waiting for a reliable exchange until the timeout.
TEST(AgreedMode, ACalibratingRankWhosePeerRunsBoundedJoinsIt) {
  constexpr size_t kCount = 1 << 14;
  testing::RunThreads(2, [&](const std::shared_ptr<gloo::Context>& ctx) {
    TimeoutOptions o;
    o.calibration_ops = ctx->rank == 0 ? 0 : 2;  // rank 0 runs bounded at once
    o.min_bound = std::chrono::seconds(1);
    o.peer_timeout_factor = 0;
    auto policy = std::make_shared<TimeoutPolicy>(o);
    for (uint64_t step = 0; step < 4; step++) {
      Call c = Reduce(ctx, policy, ctx->rank, step, kCount, 0);
      EXPECT_EQ(c.stats.mode, OpMode::kBounded) << c.stats.ToJson();
      EXPECT_EQ(c.stats.joined_bounded, ctx->rank == 1 && step < 2) << c.stats.ToJson();
      EXPECT_LT(RelErr(c.data, {0, 1}, step), Limit(c)) << c.stats.ToJson();
    }
    Barrier(ctx);
  }, Loop());
}

// The bound of a bounded operation is the same on every rank although each rank's own
// history and configuration would give another: rank 1's history is inflated (as a rank
// whose calibrations ran on a busier core) and its cap is higher; rank 0's cap is lower.
// The ranks settle on the largest proposal within the smallest cap at calibration.
TEST(AgreedMode, RanksWithDifferentHistoriesAndCapsUseOneBoundPerOperation) {
  constexpr size_t kCount = 1 << 14;
  constexpr int kBounded = 4;
  std::mutex mu;
  std::vector<std::vector<double>> bounds(2);
  testing::RunThreads(2, [&](const std::shared_ptr<gloo::Context>& ctx) {
    TimeoutOptions o;
    o.calibration_ops = kCalibration;
    o.min_bound = std::chrono::milliseconds(400);
    o.max_quiet = std::chrono::milliseconds(200);
    o.peer_timeout_factor = 0;
    o.hard_cap = ctx->rank == 0 ? std::chrono::milliseconds(1500) : std::chrono::seconds(5);
    auto policy = std::make_shared<TimeoutPolicy>(o);
    if (ctx->rank == 1) policy->Record(kCount * sizeof(float), std::chrono::seconds(2));
    const auto own = policy->BoundFor(kCount * sizeof(float)).bound;
    std::vector<double> mine;
    for (uint64_t step = 0; step < kCalibration + kBounded; step++) {
      Call c = Reduce(ctx, policy, ctx->rank, step, kCount, 0);
      EXPECT_LT(RelErr(c.data, {0, 1}, step), Limit(c)) << c.stats.ToJson();
      if (step < kCalibration) {
        EXPECT_EQ(c.stats.mode, OpMode::kCalibration) << c.stats.ToJson();
        continue;
      }
      EXPECT_EQ(c.stats.mode, OpMode::kBounded) << c.stats.ToJson();
      EXPECT_LE(c.stats.bound_ms, 1500) << "beyond rank 0's cap: " << c.stats.ToJson();
      mine.push_back(c.stats.bound_capped ? -c.stats.bound_ms : c.stats.bound_ms);
    }
    if (ctx->rank == 1) {
      EXPECT_GT(own, std::chrono::milliseconds(1500)) << "rank 1's own bound is not inflated";
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      bounds[ctx->rank] = mine;
    }
    Barrier(ctx);
  }, Loop());
  ASSERT_EQ(bounds[0].size(), static_cast<size_t>(kBounded));
  EXPECT_EQ(bounds[0], bounds[1]);
}

// After a join the joining rank's fingerprint was left at its bounded peer, unmatched on
// the exchange slot of the tag: the next exchange with that tag (here a new size, C++'s
// default tag 0 reused) matched the stale fingerprint and failed ("rank 1 has 16384
// elements"). Each exchange now has a slot of its own operation.
TEST(AgreedMode, AJoinLeavesNothingForTheNextExchangeOfItsTag) {
  testing::RunThreads(2, [&](const std::shared_ptr<gloo::Context>& ctx) {
    TimeoutOptions o;
    o.calibration_ops = ctx->rank == 0 ? 1 : 2;  // rank 1 calibrates step 1, rank 0 not
    o.min_bound = std::chrono::seconds(1);
    o.peer_timeout_factor = 0;
    auto policy = std::make_shared<TimeoutPolicy>(o);
    for (uint64_t step = 0; step < 2; step++) {
      Call c = Reduce(ctx, policy, ctx->rank, step, 1 << 14, 0);
      EXPECT_EQ(c.stats.joined_bounded, ctx->rank == 1 && step == 1) << c.stats.ToJson();
    }
    for (uint64_t step = 2; step < 4; step++) {
      Call c = Reduce(ctx, policy, ctx->rank, step, 1 << 12, 0);  // a new size calibrates
      EXPECT_LT(RelErr(c.data, {0, 1}, step), Limit(c)) << c.stats.ToJson();
    }
    Barrier(ctx);
  }, Loop());
}

// The joining rank's fingerprint is no message any peer will receive: it is withdrawn,
// so nothing of it stays behind — no send of the joiner waiting for its peer (which made
// the peer count as pending for liveness for ever), no eager credit lent, nothing stashed
// at the peer. Checked on both ranks' engines once they are idle.
TEST(AgreedMode, AJoinWithdrawsItsFingerprintAndNothingStaysPending) {
  std::vector<std::shared_ptr<transport::Device>> devices(2);
  testing::RankOptions options = Loop();
  options.device = [&devices](int rank) {
    auto device = transport::loop::CreateDevice();
    devices[rank] = std::dynamic_pointer_cast<transport::Device>(device);
    return device;
  };
  // The ranks are threads: after their check they meet here, not in a Gloo barrier, whose
  // message could reach a peer still checking and sit in its stash.
  std::mutex mu;
  std::condition_variable cv;
  int checked = 0;
  testing::RunThreads(2, [&](const std::shared_ptr<gloo::Context>& ctx) {
    TimeoutOptions o;
    o.calibration_ops = ctx->rank == 0 ? 1 : 2;  // rank 1 calibrates step 1, rank 0 not
    o.min_bound = std::chrono::seconds(1);
    o.peer_timeout_factor = 0;
    auto policy = std::make_shared<TimeoutPolicy>(o);
    for (uint64_t step = 0; step < 3; step++) {
      Call c = Reduce(ctx, policy, ctx->rank, step, 1 << 14, 0);
      EXPECT_EQ(c.stats.joined_bounded, ctx->rank == 1 && step == 1) << c.stats.ToJson();
      EXPECT_LT(RelErr(c.data, {0, 1}, step), Limit(c)) << c.stats.ToJson();
    }
    Barrier(ctx);
    ASSERT_NE(devices[ctx->rank], nullptr);
    transport::Engine& engine = *devices[ctx->rank]->engine();
    // The last credits of the barrier may still be on their way: polled, with backoff.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    auto wait = std::chrono::microseconds(100);
    transport::Engine::Backlog b = engine.GetBacklog();
    while ((b.sends != 0 || b.credit_lent != 0 || b.stashed != 0) &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(wait);
      wait = std::min(wait * 2, std::chrono::microseconds(20000));
      b = engine.GetBacklog();
    }
    EXPECT_EQ(b.sends, 0u) << "rank " << ctx->rank << ": sends never finished";
    EXPECT_EQ(b.credit_lent, 0) << "rank " << ctx->rank << ": eager credit never returned";
    EXPECT_EQ(b.stashed, 0u) << "rank " << ctx->rank << ": a peer's message stashed for ever";
    if (ctx->rank == 0) {
      EXPECT_GE(devices[0]->stats().withdrawn_messages, 1u);
    }
    std::unique_lock<std::mutex> lock(mu);
    checked++;
    cv.notify_all();
    cv.wait(lock, [&] { return checked == 2; });
  }, options);
}

std::string Counters(const std::shared_ptr<gloo::Context>& ctx) {
  auto* endpoint = dynamic_cast<transport::BoundedEndpoint*>(BoundedChannelOf(*ctx));
  if (endpoint == nullptr) return "";
  const auto c = endpoint->counters();
  return "staged " + std::to_string(c.staged_packets) + " overflow " +
         std::to_string(c.staging_overflow_packets) + " stale " + std::to_string(c.stale_packets) +
         " applied " + std::to_string(c.applied_packets);
}

size_t RssBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// PyTorch's ProcessGroupGloo gives every collective a new tag. Real allreduces with unique
// tags: every operation's Hadamard seed differs from the one before and is the same on both
// ranks; no per-tag state accumulates (the ledger at 100 000 tags: operation_ledger_test).
// OPTIREDUCE_TEST_UNIQUE_TAG_OPS sets the count (default 2000; the benchmark runs 100 000).
// The RSS growth after the first tenth is printed; from 20 000 operations on (past the few
// thousand, over which RSS still settles) it must stay below 1 MiB.
TEST(AgreedMode, UniqueTagsGetFreshSeedsEqualOnAllRanks) {
  const char* env = std::getenv("OPTIREDUCE_TEST_UNIQUE_TAG_OPS");
  const int ops = env ? std::atoi(env) : 2000;
  constexpr size_t kCount = 1024;
  std::vector<uint64_t> seeds[2];
  for (auto& s : seeds) s.assign(ops, 0);  // faulted in now: not part of the growth measured
  size_t rss_warm = 0, rss_end = 0;
  testing::RunThreads(2, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = RankPolicy();
    std::vector<uint64_t>& mine = seeds[ctx->rank];
    for (int i = 0; i < ops; i++) {
      if (i == ops / 10 && ctx->rank == 0) rss_warm = RssBytes();
      Call c = Reduce(ctx, policy, ctx->rank, i % 8, kCount, 1000 + static_cast<uint32_t>(i));
      ASSERT_LT(RelErr(c.data, {0, 1}, i % 8), Limit(c)) << c.stats.ToJson() << " " << Counters(ctx);
      ASSERT_NE(c.stats.hadamard_seed, 0u);
      mine[i] = c.stats.hadamard_seed;
    }
    Barrier(ctx);
    if (ctx->rank == 0) rss_end = RssBytes();
  }, Loop());
  ASSERT_EQ(seeds[0].size(), static_cast<size_t>(ops));
  EXPECT_EQ(seeds[0], seeds[1]) << "ranks used different signs";
  for (int i = 1; i < ops; i++) ASSERT_NE(seeds[0][i], seeds[0][i - 1]) << "op " << i;
  std::printf("unique-tag allreduces: %d, RSS after %d: %zu KiB, at the end: %zu KiB (%+ld KiB)\n",
              ops, ops / 10, rss_warm >> 10, rss_end >> 10,
              (static_cast<long>(rss_end) - static_cast<long>(rss_warm)) / 1024);
  if (ops >= 20000) {
    EXPECT_LT(rss_end, rss_warm + (size_t{1} << 20)) << rss_warm << " -> " << rss_end;
  }
}

// ProcessGroupGloo's two worker threads run two allreduces at once on one context (tags
// differ, sizes are the same: the ranks may count the two in opposite orders when the
// calibration ends, and a calibrating rank then joins its bounded peer), under 1% loss.
// Meant for TSan.
TEST(AgreedMode, TwoConcurrentBoundedAllreducesOnOneContextUnderLoss) {
  constexpr int kIterations = 200;
  std::mutex bounds_mu;
  std::map<uint64_t, double> bound_of_op[2];
  testing::RunThreads(2, [&](const std::shared_ptr<gloo::Context>& ctx) {
    auto policy = RankPolicy();
    std::atomic<int> bounded{0}, joined{0};
    auto worker = [&](uint32_t tag, size_t n) {
      for (int i = 0; i < kIterations; i++) {
        Call c = Reduce(ctx, policy, ctx->rank, i % 8, n, tag);
        for (float v : c.data) ASSERT_TRUE(std::isfinite(v));
        if (c.stats.mode == OpMode::kBounded) {
          bounded++;
          std::lock_guard<std::mutex> lock(bounds_mu);
          bound_of_op[ctx->rank][c.stats.op] = c.stats.bound_ms;
        }
        if (c.stats.joined_bounded) joined++;
        // Lost packets are repaired: exact unless a rank descheduled past the start grace
        // was deferred (flagged; carried into the next operation on its buffer).
        if (c.stats.deferred_ranks.empty() && !c.stats.carried_in) {
          EXPECT_LT(RelErr(c.data, {0, 1}, i % 8), 1e-4) << c.stats.ToJson();
        }
      }
    };
    std::thread t1(worker, 1, 1 << 13);
    std::thread t2(worker, 2, 1 << 13);
    t1.join();
    t2.join();
    // Each size calibrates kCalibration operations, but for those joined bounded.
    EXPECT_EQ(bounded.load(), 2 * kIterations - kCalibration + joined.load());
    Barrier(ctx, 78);
  }, Loop("drop=0.01,seed=5"));
  // Every bounded operation ran with one bound on both ranks, the joined ones too.
  EXPECT_EQ(bound_of_op[0], bound_of_op[1]);
}

// The transport's liveness reports a peer gone: the allreduce raises gloo::IoException
// naming it instead of "completing" without it.
TEST(AgreedMode, ADeadPeerReportedByTheTransportIsAnErrorNamingIt) {
  testing::RunThreads(3, [&](const std::shared_ptr<gloo::Context>& ctx) {
    TimeoutOptions o;
    o.calibration_ops = 0;  // bounded from the first operation
    o.min_bound = std::chrono::seconds(2);
    auto policy = std::make_shared<TimeoutPolicy>(o);
    if (ctx->rank != 2) {
      auto* endpoint = dynamic_cast<transport::BoundedEndpoint*>(BoundedChannelOf(*ctx));
      ASSERT_NE(endpoint, nullptr);
      endpoint->OnPeerFailed(2, absl::UnavailableError("no sign of life for 3 s"));
      try {
        Reduce(ctx, policy, ctx->rank, 0, 1 << 12, 3);
        ADD_FAILURE() << "rank " << ctx->rank << " completed without rank 2";
      } catch (const gloo::IoException& e) {
        EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("no sign of life"), std::string::npos) << e.what();
      }
    }
    Barrier(ctx, 79);
  }, Loop());
}

// The operation's own deadline passes while a calibrating rank waits for its peers'
// fingerprints (polled in slices, which never fail the context by themselves): the
// allreduce raises, and the context is failed as a Gloo wait timeout fails it, so the next
// operation on it raises too instead of running on a context with a receive still posted.
TEST(AgreedMode, TheAllreduceDeadlineFailsTheContextLikeAGlooWaitTimeout) {
  testing::RunThreads(2, [&](const std::shared_ptr<gloo::Context>& ctx) {
    if (ctx->rank == 0) {
      std::vector<float> data(1 << 10, 1.0f);
      AllreduceOptions opts(ctx);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(RawFunc(&gloo::sum<float>));
      opts.setMode(AllreduceOptions::Mode::kBounded);
      opts.setTimeoutPolicy(RankPolicy());
      opts.setTimeout(std::chrono::milliseconds(200));
      try {
        allreduce(opts);  // rank 1 never joins it
        ADD_FAILURE() << "allreduce without its peer returned";
      } catch (const gloo::IoException& e) {
        EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
      }
    }
    // Rank 1 joins this barrier at once, rank 0 after its allreduce gave up: without the
    // context failure both complete it.
    try {
      Barrier(ctx, 80);
      EXPECT_NE(ctx->rank, 0) << "rank 0's context still works after its allreduce timed out";
    } catch (const gloo::IoException& e) {
      if (ctx->rank == 0) {
        EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
      }
    }
  }, Loop());
}

// A channel whose Send to one peer throws, recording what is released.
class ThrowingChannel : public BoundedChannel {
 public:
  ThrowingChannel(BoundedChannel* inner, int bad_peer) : inner_(inner), bad_peer_(bad_peer) {}
  std::unique_ptr<BoundedReceive> PostReceive(uint64_t op, std::vector<BoundedRegion> r) override {
    return inner_->PostReceive(op, std::move(r));
  }
  void Send(int peer, uint64_t op, const void* src, size_t n, bool estimated) override {
    if (peer == bad_peer_) throw gloo::IoException("test: the device is gone");
    inner_->Send(peer, op, src, n, estimated);
    sent_ops.push_back(op);
  }
  void Detach(uint64_t op) override { inner_->Detach(op); }
  void Release(uint64_t op) override {
    released.push_back(op);
    inner_->Release(op);
  }
  size_t PacketPayload() const override { return inner_->PacketPayload(); }
  std::vector<uint64_t> sent_ops, released;

 private:
  BoundedChannel* inner_;
  int bad_peer_;
};

// A send that throws: the sources registered so far (the caller's buffer) are released
// before the exception leaves, so no later repair reads memory the caller freed.
TEST(AgreedMode, ASendThatThrowsReleasesTheOperationsSources) {
  testing::InMemoryBoundedHub hub(3, 0.0, 1);
  // A tag whose first operation rank 0 does not lead: the others get their decision (a
  // leader that fails before deciding fails its peers' operation at their timeout, as a
  // Gloo collective does).
  uint32_t tag = 4;
  while (LeaderOf(OperationLedger::Key(tag, 0), 3) == 0) tag++;
  testing::RunThreads(3, [&](const std::shared_ptr<gloo::Context>& ctx) {
    TimeoutOptions o;
    o.calibration_ops = 0;
    o.min_bound = std::chrono::milliseconds(300);
    auto policy = std::make_shared<TimeoutPolicy>(o);
    if (ctx->rank == 0) {
      ThrowingChannel channel(hub.channel(0), /*bad_peer=*/1);
      EXPECT_THROW(Reduce(ctx, policy, 0, 0, 1 << 12, tag, &channel), gloo::IoException);
      ASSERT_FALSE(channel.sent_ops.empty()) << "rank 0 sent to rank 2 first";
      const uint64_t op1 = channel.sent_ops.front();
      EXPECT_NE(std::find(channel.released.begin(), channel.released.end(), op1),
                channel.released.end());
      EXPECT_NE(std::find(channel.released.begin(), channel.released.end(), op1 + 1),
                channel.released.end());
    } else {
      // Rank 0's data reached the leader or not: then it is counted, and its peers raise
      // at once (its sources, or a peer's that raised first, are released), or it is left
      // out (deferred).
      try {
        Call c = Reduce(ctx, policy, ctx->rank, 0, 1 << 12, tag, hub.channel(ctx->rank));
        EXPECT_EQ(c.stats.deferred_ranks, std::vector<int>{0}) << c.stats.ToJson();
      } catch (const gloo::IoException& e) {
        EXPECT_NE(std::string(e.what()).find("its data is counted"), std::string::npos)
            << e.what();
      }
    }
    Barrier(ctx, 80);
  }, Loop());  // the decision travels on the loop device; the data on the hub
}

}  // namespace
}  // namespace optireduce
