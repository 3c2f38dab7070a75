// The engine's payload copies (transport_dpdk/payload_pool.h): the pool's reuse and caps,
// and through the Gloo API that a send copied at send() reuses storage instead of
// faulting in fresh pages every time (minor page faults counted, not timed).
#include <gloo/allreduce_ring_chunked.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tests/transport/two_ranks.h"
#include "transport_dpdk/payload_pool.h"

namespace optireduce {
namespace {

using transport::PayloadPool;

TEST(PayloadPool, GivenBackStorageIsTakenAgainForTheSameClass) {
  auto pool = PayloadPool::Create(64 << 20);
  const uint8_t* first = nullptr;
  {
    PayloadPool::Bytes b = pool->Take(300 << 10);
    ASSERT_EQ(b.size(), 300u << 10);
    first = b.data();
  }
  EXPECT_EQ(pool->counters().cached_bytes, 512u << 10);  // rounded to its class
  PayloadPool::Bytes again = pool->Take(400 << 10);       // same class (512 KiB)
  EXPECT_EQ(again.data(), first);
  PayloadPool::Bytes other = pool->Take(600 << 10);  // next class: fresh storage
  EXPECT_NE(other.data(), first);
  const auto c = pool->counters();
  EXPECT_EQ(c.taken, 3u);
  EXPECT_EQ(c.reused, 1u);
  EXPECT_EQ(c.cached_bytes, 0u);
}

TEST(PayloadPool, CopyHoldsTheBytesAndZeroIsEmpty) {
  auto pool = PayloadPool::Create(1 << 20);
  std::vector<uint8_t> src(5000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  PayloadPool::Bytes b = pool->Copy(src.data(), src.size());
  ASSERT_EQ(b.size(), src.size());
  EXPECT_EQ(std::memcmp(b.data(), src.data(), src.size()), 0);
  PayloadPool::Bytes none = pool->Take(0);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.data(), nullptr);
  PayloadPool::Bytes moved = std::move(b);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(moved.size(), src.size());
}

TEST(PayloadPool, KeepsAtMostItsCapsAndFreesTheRest) {
  auto pool = PayloadPool::Create(1 << 20);  // 1 MiB of free storage at most
  {
    std::vector<PayloadPool::Bytes> held;
    for (int i = 0; i < 3; ++i) held.push_back(pool->Take(512 << 10));
  }
  auto c = pool->counters();
  EXPECT_EQ(c.cached_bytes, 1u << 20);
  EXPECT_EQ(c.freed, 1u);
  auto roomy = PayloadPool::Create(64 << 20);  // the class cap, not the byte cap
  {
    std::vector<PayloadPool::Bytes> held;
    for (size_t i = 0; i < PayloadPool::kMaxPerClass + 4; ++i) held.push_back(roomy->Take(100));
  }
  c = roomy->counters();
  EXPECT_EQ(c.cached_bytes, PayloadPool::kMaxPerClass * PayloadPool::kMinCapacity);
  EXPECT_EQ(c.freed, 4u);
}

TEST(PayloadPool, StorageOutlivesThePoolsOwner) {
  PayloadPool::Bytes b;
  {
    auto pool = PayloadPool::Create(1 << 20);
    b = pool->Take(10000);
  }
  std::memset(b.data(), 1, b.size());  // still valid (ASan checks)
  b.Release();
  EXPECT_TRUE(b.empty());
}

long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Gloo's algorithm classes send through old-style Buffers, which the device copies at
// send() (as Gloo's TCP pair writes into its socket). AllreduceRingChunked of 1 MiB on two
// ranks sends 256 KiB chunks, two in flight. glibc gives freed pages back to the kernel
// when the heap's top grows past its trim threshold (whether it does depends on the
// heap's layout: in the sweep's processes it did after every allreduce); malloc_trim
// between the runs does it here every time. Copies into malloc'd storage then fault in
// 64 fresh pages each; the engine's reused storage is not malloc's to give back.
TEST(PayloadCopy, RingChunkedAllreduceReusesTheCopiesPages) {
  auto ranks = testing_ranks::Connect(transport::EngineOptions());
  ASSERT_EQ(ranks.size(), 2u);
  constexpr int kCount = 256 << 10;  // floats: 1 MiB
  constexpr int kWarmup = 5, kRuns = 50;
  std::vector<std::vector<float>> data(2, std::vector<float>(kCount));
  std::vector<std::unique_ptr<gloo::AllreduceRingChunked<float>>> algos;
  for (int r = 0; r < 2; ++r) {
    algos.push_back(std::make_unique<gloo::AllreduceRingChunked<float>>(
        ranks[r].context, std::vector<float*>{data[r].data()}, kCount));
  }
  long faults_before = 0;
  auto run = [&](int r) {
    for (int i = 0; i < kWarmup + kRuns; ++i) {
      std::fill(data[r].begin(), data[r].end(), static_cast<float>(r + 1));
      if (r == 0 && i == kWarmup) faults_before = MinorFaults();
      malloc_trim(0);
      algos[r]->run();
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  const long faults = MinorFaults() - faults_before;
  EXPECT_EQ(data[0][kCount - 1], 3.0f);
  EXPECT_EQ(data[1][0], 3.0f);
  // Fresh pages for every copy: 4 chunk sends of 64 pages per run and rank.
  EXPECT_LT(faults, kRuns * 8 * 64 / 10)
      << faults << " minor page faults over " << kRuns << " allreduces of 1 MiB";
  RecordProperty("minor_faults", std::to_string(faults));
}

}  // namespace
}  // namespace optireduce
