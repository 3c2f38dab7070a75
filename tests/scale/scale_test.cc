// Many ranks as threads of this process over the loop device (ctest label `scale`): at 32,
// 64 and 128 ranks, flat TAR, two-level TAR, recursive doubling, OptiReduce mode and every
// Gloo collective of the conformance cases are exact, within a per-rank memory budget and
// a thread budget. Prints connect and teardown times (not asserted).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gloo/math.h>
#include <gtest/gtest.h>

#include "algorithms/allreduce.h"
#include "algorithms/two_level_plan.h"
#include "tests/common/ranks.h"
#include "tests/common/resident.h"
#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/device.h"

namespace optireduce {
namespace {

using RawFunc = void (*)(void*, const void*, const void*, size_t);
using Clock = std::chrono::steady_clock;
using Layout = AllreduceOptions::Layout;

// The memory budget per rank (tests/README.md, algorithms/README.md): a fixed part and a
// part per peer; nothing in it grows with N x the segment size. Resident memory growth of
// the process divided by the ranks, measured once every rank is connected and again after
// every collective ran.
constexpr double kConnectedFixedKiB = 512;
constexpr double kConnectedPerPeerKiB = 12;
constexpr double kAfterOpsFixedKiB = 1024;
constexpr double kAfterOpsPerPeerKiB = 24;
// Threads per rank over the loop device: the rank's own and its device's progress thread.
constexpr int kThreadsPerRank = 2;

int ThreadsOfThisProcess() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Where the main thread measures while every rank waits: each rank arrives, the main
// thread waits for all of them, measures, and releases them.
class Checkpoint {
 public:
  explicit Checkpoint(int ranks) : ranks_(ranks) {}
  void ArriveAndWait() {
    std::unique_lock<std::mutex> lock(mu_);
    arrived_++;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
  }
  void WaitForAll() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return arrived_ == ranks_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  const int ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  bool released_ = false;
};

// Integer-valued floats: exact in any summation order.
float Value(int rank, size_t i) { return static_cast<float>((i * 7 + rank * 3) % 13); }

// One allreduce of `count` floats with these options; checks the exact sum and returns
// the statistics.
OpStats Allreduce(const std::shared_ptr<gloo::Context>& ctx, size_t count, uint32_t tag,
                  const std::function<void(AllreduceOptions&)>& set) {
  std::vector<float> data(count);
  for (size_t i = 0; i < count; i++) data[i] = Value(ctx->rank, i);
  AllreduceOptions opts(ctx);
  opts.setOutput(data.data(), count);
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setTag(tag);
  OpStats stats;
  opts.setStatsOutput(&stats);
  set(opts);
  allreduce(opts);
  if (stats.damaged || stats.carried_in) return stats;  // OptiReduce mode: flagged, not held
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < ctx->size; r++) want += Value(r, i);
    if (data[i] != want) {
      ADD_FAILURE() << "rank " << ctx->rank << " of " << ctx->size << ": element " << i
                    << " is " << data[i] << ", want " << want << "; " << stats.ToJson();
      break;
    }
  }
  return stats;
}

// What runs at a rank count. From kSmallFrom ranks on, every algorithm and collective runs
// once with fewer elements: on 2 cores each message of N² costs a wake-up of one of 2N
// threads, and Gloo's ring algorithms take 2(N - 1) such steps one after another.
struct Workload {
  bool small;
  size_t elements;  // per rank, for the Gloo collectives
};
constexpr int kSmallFrom = 128;
Workload WorkloadOf(int ranks) {
  return ranks >= kSmallFrom ? Workload{true, 4} : Workload{false, 16};
}

// Every algorithm of optireduce::allreduce on small buffers.
void OptireduceAlgorithms(const std::shared_ptr<gloo::Context>& ctx, const Workload& w) {
  const int n = ctx->size;
  const size_t tar_count = 4 * n + 3;  // a few elements per rank, not a multiple of N
  // Flat TAR.
  OpStats s = Allreduce(ctx, tar_count, 1, [](AllreduceOptions& o) {
    o.setSmallMessageBytes(0);
    o.setLayout(Layout::kFlat);
  });
  EXPECT_EQ(s.group_size, 0);
  // Two-level TAR: the layout kAuto picks from kTwoLevelMinRanks on, forced below it.
  const int group = TwoLevelGroupSize(n);
  s = Allreduce(ctx, tar_count, 2, [&](AllreduceOptions& o) {
    o.setSmallMessageBytes(0);
    if (n < AllreduceOptions::kTwoLevelMinRanks) o.setLayout(Layout::kTwoLevel);
  });
  EXPECT_EQ(s.group_size, group);
  if (!w.small) {
    s = Allreduce(ctx, tar_count, 3, [n](AllreduceOptions& o) {
      o.setSmallMessageBytes(0);
      o.setLayout(n >= AllreduceOptions::kTwoLevelMinRanks ? Layout::kFlat : Layout::kAuto);
    });
    EXPECT_EQ(s.group_size, 0);
  }
  // Recursive doubling (the default for small exact operations).
  s = Allreduce(ctx, 100, 4, [](AllreduceOptions&) {});
  EXPECT_EQ(s.group_size, 0);
  // OptiReduce mode in kAuto's layout: a calibrating operation (exact TAR), then bounded
  // ones, two-level from kTwoLevelMinRanks on; the small workload runs one bounded
  // operation without calibration.
  TimeoutOptions t;
  t.calibration_ops = w.small ? 0 : 1;
  t.min_bound = std::chrono::milliseconds(2000);
  t.hard_cap = std::chrono::seconds(20);
  auto policy = std::make_shared<TimeoutPolicy>(t);
  for (int step = 0; step < (w.small ? 1 : 3); step++) {
    s = Allreduce(ctx, tar_count, 5, [&](AllreduceOptions& o) {
      o.setMode(AllreduceOptions::Mode::kBounded);
      o.setHadamard(AllreduceOptions::Hadamard::kOff);
      o.setTimeoutPolicy(policy);
    });
    EXPECT_EQ(s.mode, step < t.calibration_ops ? OpMode::kCalibration : OpMode::kBounded)
        << s.ToJson();
    EXPECT_EQ(s.group_size, n >= AllreduceOptions::kTwoLevelMinRanks ? group : 0) << s.ToJson();
  }
}

// The Gloo collectives of the conformance cases (tests/transport/conformance_cases.h):
// every one, or for the small workload every one but the ring algorithms and the v-variants
// (AllgatherRing, AllreduceRing, AllreduceRingChunked, allgatherv, alltoallv), which
// the smaller rank counts run.
void GlooCollectives(const std::shared_ptr<gloo::Context>& ctx, const Workload& w) {
  static const std::set<std::string> kNotSmall = {"AllgatherRing", "AllreduceRing",
                                                  "AllreduceRingChunked", "allgatherv",
                                                  "alltoallv"};
  for (const std::string& name : testing::AllCaseNames()) {
    if (w.small && kNotSmall.count(name) > 0) continue;
    const std::string error = testing::RunCase(name, ctx, w.elements);
    EXPECT_EQ(error, "") << name;
  }
}

class Scale : public ::testing::TestWithParam<int> {};

TEST_P(Scale, EveryCollectiveExactWithinTheMemoryAndThreadBudget) {
  const int n = GetParam();
  const Workload workload = WorkloadOf(n);
  Checkpoint connected(n), algorithms(n), done(n);
  const size_t rss_before = testing::ResidentBytes();
  const int threads_before = ThreadsOfThisProcess();
  size_t rss_connected = 0, rss_done = 0;
  int threads_connected = 0, threads_done = 0;
  const auto start = Clock::now();
  Clock::time_point teardown_start, end;
  testing::RankOptions options;
  options.device = [](int) {
    transport::loop::attr a;
    return transport::loop::CreateDevice(a);
  };
  options.context_timeout = std::chrono::seconds(120);
  std::thread runner([&] {
    testing::RunThreads(n, [&](const std::shared_ptr<gloo::Context>& ctx) {
      connected.ArriveAndWait();
      OptireduceAlgorithms(ctx, workload);
      algorithms.ArriveAndWait();
      GlooCollectives(ctx, workload);
      done.ArriveAndWait();
    }, options);
    end = Clock::now();
  });
  connected.WaitForAll();
  const auto connect_time = Clock::now() - start;
  rss_connected = testing::ResidentBytes();
  threads_connected = ThreadsOfThisProcess();
  connected.Release();
  algorithms.WaitForAll();
  const auto algorithms_end = Clock::now();
  algorithms.Release();
  done.WaitForAll();
  const auto ops_end = Clock::now();
  rss_done = testing::ResidentBytes();
  threads_done = ThreadsOfThisProcess();
  teardown_start = Clock::now();
  done.Release();
  runner.join();

  auto ms = [](Clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  const double kib_connected = (double(rss_connected) - double(rss_before)) / 1024 / n;
  const double kib_done = (double(rss_done) - double(rss_before)) / 1024 / n;
  std::printf("scale %d ranks: connect %.0f ms, optireduce::allreduce %.0f ms, Gloo "
              "collectives %.0f ms, teardown %.0f ms; resident memory per rank %.0f KiB "
              "connected, %.0f KiB after the operations; threads per rank %.2f connected, "
              "%.2f after\n",
              n, ms(connect_time), ms(algorithms_end - start - connect_time),
              ms(ops_end - algorithms_end), ms(end - teardown_start),
              kib_connected, kib_done, double(threads_connected - threads_before) / n,
              double(threads_done - threads_before) / n);
  EXPECT_LE(kib_connected, kConnectedFixedKiB + kConnectedPerPeerKiB * (n - 1));
  EXPECT_LE(kib_done, kAfterOpsFixedKiB + kAfterOpsPerPeerKiB * (n - 1));
  // Plus the runner thread.
  EXPECT_LE(threads_connected - threads_before, kThreadsPerRank * n + 1);
  EXPECT_LE(threads_done - threads_before, kThreadsPerRank * n + 1);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Scale, ::testing::Values(32, 64, 128));

}  // namespace
}  // namespace optireduce
