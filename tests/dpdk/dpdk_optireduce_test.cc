// OptiReduce mode (bounded TAR, AllreduceOptions::Mode::kBounded) over the DPDK backend:
// 4 ranks as processes, each with its own EAL and a net_memif link per peer. The mode
// works on the udp, loop and dpdk backends; the udp and loop runs are in
// tests/algorithms/optireduce_mode_test.cc, this is the dpdk one: exact without faults,
// bounded and measured under 1% seeded loss.
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gtest/gtest.h>

#include "algorithms/allreduce.h"
#include "algorithms/op_stats.h"
#include "tests/common/ranks.h"
#include "transport_dpdk/device.h"
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/engine/engine.h"
#include "transport_dpdk/io/fault_injector.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"

namespace optireduce {
namespace {

using RawFunc = void (*)(void*, const void*, const void*, size_t);
using Clock = std::chrono::steady_clock;
namespace dpdk = transport::dpdk;

constexpr int kRanks = 4;
constexpr size_t kCount = 1 << 18;  // 1 MiB of float32
constexpr double kNoise = 0.1;
constexpr uint64_t kCalibration = 3;
constexpr uint64_t kSteps = 7;

// A common signal plus a small per-rank deviation (data-parallel gradients); every process
// recomputes the others' inputs from their seeds for the exact sum.
std::vector<float> Gradient(int rank, uint64_t step) {
  std::mt19937_64 common(1000 + step), own(7 * rank + 31 * step + 1);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> x(kCount);
  for (float& v : x) v = g(common);
  for (float& v : x) v += static_cast<float>(kNoise) * g(own);
  return x;
}

double RelL2ToExactSum(const std::vector<float>& got, int ranks, uint64_t step) {
  std::vector<double> want(kCount, 0);
  for (int r = 0; r < ranks; r++) {
    const std::vector<float> x = Gradient(r, step);
    for (size_t i = 0; i < kCount; i++) want[i] += x[i];
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < kCount; i++) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// Payload bytes of bounded packets the device's fault injector dropped on receive so far.
uint64_t InjectedBoundedBytes(const std::shared_ptr<gloo::Context>& ctx) {
  auto* device = dynamic_cast<transport::Device*>(ctx->getDevice().get());
  if (device == nullptr) return 0;
  auto* injector = dynamic_cast<transport::FaultInjector*>(device->engine()->io());
  return injector == nullptr ? 0 : injector->counters().bounded_bytes_dropped.load();
}

// Runs kSteps OptiReduce-mode operations per rank over DPDK memif links with `faults`
// injected in the engine; `want_loss` is the injected datagram loss.
std::string RunFourRanks(const std::string& faults, double want_loss) {
  testing::TempDir sockets;
  testing::RankOptions options;
  const std::string dir = sockets.path();
  options.device = [dir, faults](int rank) {
    dpdk::attr a;
    a.eal_args = dpdk::MemifMeshEalArgs(dir, rank, kRanks) + " " + dpdk::DefaultEalArgs();
    transport::EngineOptions engine;
    engine.faults = faults;
    return dpdk::CreateDevice(a, engine);
  };
  options.process_limit = std::chrono::seconds(100);
  return testing::RunProcesses(kRanks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    TimeoutOptions t;
    t.calibration_ops = kCalibration;
    // Processes on 2 shared cores: bounds far above scheduling noise, and phases that end
    // by early timeout (every peer's last packets in, then quiet), so the measured loss is
    // the injected one; no peer timeout (a descheduled rank would add its own loss).
    t.min_bound = std::chrono::seconds(1);
    t.hard_cap = std::chrono::seconds(4);
    t.max_quiet = std::chrono::milliseconds(200);
    t.peer_timeout_factor = 0;
    auto policy = std::make_shared<TimeoutPolicy>(t);
    int repaired = 0;
    bool deferred = false;
    uint64_t injected_before = 0;
    (void)want_loss;
    for (uint64_t step = 0; step < kSteps; step++) {
      if (step == kCalibration) injected_before = InjectedBoundedBytes(ctx);
      std::vector<float> data = Gradient(ctx->rank, step);
      AllreduceOptions opts(ctx);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(static_cast<RawFunc>(&gloo::sum<float>));
      opts.setMode(AllreduceOptions::Mode::kBounded);
      opts.setHadamard(AllreduceOptions::Hadamard::kAuto);
      opts.setTimeoutPolicy(policy);
      OpStats stats;
      opts.setStatsOutput(&stats);
      const auto start = Clock::now();
      allreduce(opts);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      const double err = RelL2ToExactSum(data, ctx->size, step);
      if (step < kCalibration) {
        ASSERT_EQ(stats.mode, OpMode::kCalibration);
        ASSERT_LT(err, 1e-5) << "calibration (reliable TAR) is exact";
        continue;
      }
      ASSERT_EQ(stats.mode, OpMode::kBounded) << stats.ToJson();
      for (float v : data) ASSERT_TRUE(std::isfinite(v));
      // Lost packets are repaired until whole: exact up to rounding, unless a rank of a
      // loaded host started past the grace (deferred, flagged, carried).
      if (stats.deferred_ranks.empty() && !stats.carried_in) {
        EXPECT_LT(err, 1e-5) << stats.ToJson();
      }
      repaired += stats.phase[0].repaired || stats.phase[1].repaired;
      deferred = deferred || !stats.deferred_ranks.empty();
      (void)seconds;
    }
    // Counted, not against the drop rate (a few hundred packets per rank leave no useful
    // bound): a bounded byte the injector dropped on this rank's receive path is a hole
    // in a phase, which is repaired.
    if (InjectedBoundedBytes(ctx) > injected_before && !deferred) {
      EXPECT_GT(repaired, 0) << "rank " << ctx->rank;
    }
    // Nobody leaves while a peer may still ask it for repairs (a process takes its repair
    // copies with it).
    gloo::BarrierOptions b(ctx);
    b.setTag(6);
    gloo::barrier(b);
  }, options);
}

TEST(DpdkOptiReduceMode, NoFaultsIsExact) { EXPECT_EQ(RunFourRanks("", 0.0), ""); }

TEST(DpdkOptiReduceMode, OnePercentDropIsRepairedToExact) {
  EXPECT_EQ(RunFourRanks("drop=0.01,seed=17", 0.01), "");
}

}  // namespace
}  // namespace optireduce
