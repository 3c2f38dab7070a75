// Conformance of Gloo collectives on the loop backend: ranks are threads of
// this process, rendezvous through a HashStore.
#include <gloo/common/error.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/device.h"
#include <gloo/transport/tcp/device.h>
#include <cstdlib>

namespace optireduce {
namespace testing {
namespace {

using transport::EngineOptions;
using transport::loop::attr;

// Runs fn(rank, context) on `size` threads, each with its own loop device made with
// `engine` options.
std::vector<std::string> RunRanks(
    int size, const transport::EngineOptions& engine,
    const std::function<std::string(int, std::shared_ptr<gloo::Context>)>& fn) {
  static std::atomic<int> run{0};
  gloo::rendezvous::HashStore base;
  gloo::rendezvous::PrefixStore store("run" + std::to_string(run++), base);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        // OPTIREDUCE_TEST_TCP_BASELINE=1 runs the same cases on Gloo's TCP
        // device, to tell Gloo's own limits from transport bugs.
        std::shared_ptr<gloo::transport::Device> dev;
        if (std::getenv("OPTIREDUCE_TEST_TCP_BASELINE")) {
          gloo::transport::tcp::attr t;
          t.hostname = "127.0.0.1";
          dev = gloo::transport::tcp::CreateDevice(t);
        } else {
          dev = transport::loop::CreateDevice(attr{}, engine);
        }
        auto ctx = ConnectContext(store, dev, r, size, std::chrono::seconds(30));
        errors[r] = fn(r, ctx);
      } catch (const std::exception& e) {
        errors[r] = std::string("rank ") + std::to_string(r) + ": " + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::string> bad;
  for (auto& e : errors)
    if (!e.empty()) bad.push_back(e);
  return bad;
}

std::string RunAll(std::shared_ptr<gloo::Context> ctx,
                   const std::vector<std::string>& cases,
                   const std::vector<size_t>& sizes) {
  for (const auto& name : cases)
    for (size_t n : sizes) {
      std::string e = RunCase(name, ctx, n);
      if (!e.empty()) return e;
    }
  return "";
}

class LoopConformance : public ::testing::TestWithParam<int> {};

TEST_P(LoopConformance, AllCollectivesExact) {
  const int n = GetParam();
  // OPTIREDUCE_TEST_CASES=a,b restricts the cases (debugging).
  std::vector<std::string> cases = AllCaseNames();
  if (const char* only = std::getenv("OPTIREDUCE_TEST_CASES")) {
    cases.clear();
    std::string s = only;
    for (size_t p = 0; p <= s.size();) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      cases.push_back(s.substr(p, q - p));
      p = q + 1;
    }
  }
  auto bad = RunRanks(n, {}, [&](int, std::shared_ptr<gloo::Context> ctx) {
    return RunAll(ctx, cases, {0, 1, 1024, 262144});
  });
  for (auto& e : bad) ADD_FAILURE() << e;
}

INSTANTIATE_TEST_SUITE_P(Ranks, LoopConformance, ::testing::Values(2, 3, 4, 5));

class LoopFaults : public ::testing::TestWithParam<const char*> {};

TEST_P(LoopFaults, ExactUnderFaults) {
  transport::EngineOptions engine;
  engine.faults = GetParam();
  engine.min_rto = std::chrono::microseconds(2000);
  auto bad = RunRanks(4, engine, [&](int, std::shared_ptr<gloo::Context> ctx) {
    return RunAll(ctx,
                  {"AllreduceRing", "AllreduceRingChunked", "allreduce", "broadcast",
                   "allgather", "sendrecv", "recv_any", "send_before_recv",
                   "alltoall"},
                  {0, 1, 1024, 100000});
  });
  for (auto& e : bad) ADD_FAILURE() << e;
}

INSTANTIATE_TEST_SUITE_P(
    Specs, LoopFaults,
    ::testing::Values("drop=0.01,dup=0.01,reorder=0.02,seed=3",
                      "drop=0.1,dup=0.02,reorder=0.05,corrupt=0.01,delay_us=50,seed=11"));

// Exactness of every collective under the loss patterns a cloud produces
// (fault_injector.h), without a hang.
class LoopLossPatterns : public ::testing::TestWithParam<const char*> {};

TEST_P(LoopLossPatterns, AllCollectivesExact) {
  transport::EngineOptions engine;
  engine.faults = GetParam();
  engine.min_rto = std::chrono::microseconds(2000);
  auto bad = RunRanks(4, engine, [&](int, std::shared_ptr<gloo::Context> ctx) {
    return RunAll(ctx, AllCaseNames(), {0, 1, 1024, 100000});
  });
  for (auto& e : bad) ADD_FAILURE() << GetParam() << ": " << e;
}

INSTANTIATE_TEST_SUITE_P(
    Specs, LoopLossPatterns,
    ::testing::Values("burst_loss=0.01,burst_len=8,seed=5", "ack_drop=0.05,seed=6",
                      "tail=1", "tail=8", "tail=64", "tx_partial=0.3,seed=7"));

// A lost tail is recovered by a probe in about a round trip, not one RTO per
// packet: the last 8 packets of a 1 MiB message, dropped once, cost no RTO.
// The RTO floor is raised to 200 ms so that "less than 3 floors" is far
// outside scheduling noise (recovering by RTOs takes one floor per packet).
TEST(LoopLossRecovery, TailOfALargeMessageIsRecoveredWithoutAnRto) {
  transport::EngineOptions engine;
  engine.faults = "tail=8";
  engine.min_rto = std::chrono::milliseconds(200);
  engine.initial_rto = std::chrono::milliseconds(200);
  engine.max_rto = std::chrono::milliseconds(2000);
  gloo::rendezvous::HashStore store;
  std::vector<std::shared_ptr<gloo::transport::Device>> devs(2);
  std::vector<std::shared_ptr<gloo::Context>> ctxs(2);
  {
    std::vector<std::thread> t;
    for (int r = 0; r < 2; ++r) {
      t.emplace_back([&, r] {
        devs[r] = transport::loop::CreateDevice(attr{}, engine);
        ctxs[r] = ConnectContext(store, devs[r], r, 2, std::chrono::seconds(30));
      });
    }
    for (auto& th : t) th.join();
  }
  auto* sender = dynamic_cast<transport::Device*>(devs[1].get());
  ASSERT_NE(sender, nullptr);
  const size_t n = 1 << 20;
  std::vector<uint8_t> src(n), dst(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  auto send = ctxs[1]->createUnboundBuffer(src.data(), n);
  auto recv = ctxs[0]->createUnboundBuffer(dst.data(), n);
  const auto before = sender->stats();
  const auto start = std::chrono::steady_clock::now();
  recv->recv(1, 5);
  send->send(0, 5);
  send->waitSend(std::chrono::seconds(30));
  recv->waitRecv(nullptr, std::chrono::seconds(30));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const auto after = sender->stats();
  EXPECT_EQ(src, dst);
  EXPECT_EQ(after.rto_events - before.rto_events, 0u) << after.ToString();
  EXPECT_GE(after.retransmits - before.retransmits, 8u);
  EXPECT_LT(elapsed, 3 * engine.min_rto) << after.ToString();
}

TEST(LoopDevice, TimeoutNamesPeerAndSlot) {
  auto bad = RunRanks(2, {}, [&](int r, std::shared_ptr<gloo::Context> ctx) -> std::string {
    if (r != 0) return "";
    std::vector<int> buf(4);
    auto ub = ctx->createUnboundBuffer(buf.data(), sizeof(int) * 4);
    ub->recv(1, 77);
    try {
      ub->waitRecv(nullptr, std::chrono::milliseconds(200));
    } catch (const gloo::IoException& e) {
      std::string m = e.what();
      if (m.find("rank(s) [1]") == std::string::npos ||
          m.find("slot 77") == std::string::npos) {
        return "timeout message lacks peer/slot: " + m;
      }
      return "";
    }
    return "waitRecv did not time out";
  });
  for (auto& e : bad) ADD_FAILURE() << e;
}

TEST(LoopDevice, AbortWaitRecvReturnsFalse) {
  auto bad = RunRanks(2, {}, [&](int r, std::shared_ptr<gloo::Context> ctx) -> std::string {
    if (r != 0) return "";
    int v = 0;
    auto ub = ctx->createUnboundBuffer(&v, sizeof(v));
    ub->recv(1, 5);
    std::thread t([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ub->abortWaitRecv();
    });
    bool ok = ub->waitRecv(nullptr, std::chrono::seconds(10));
    t.join();
    return ok ? "waitRecv returned true after abort" : "";
  });
  for (auto& e : bad) ADD_FAILURE() << e;
}

TEST(LoopDevice, RecvTooSmallIsAnError) {
  auto bad = RunRanks(2, {}, [&](int r, std::shared_ptr<gloo::Context> ctx) -> std::string {
    std::vector<int> buf(100, r);
    if (r == 1) {
      auto ub = ctx->createUnboundBuffer(buf.data(), 400);
      ub->send(0, 9);
      ub->waitSend(std::chrono::seconds(10));
      return "";
    }
    auto ub = ctx->createUnboundBuffer(buf.data(), 40);
    ub->recv(1, 9);
    try {
      ub->waitRecv(nullptr, std::chrono::seconds(10));
    } catch (const gloo::IoException& e) {
      return std::string(e.what()).find("room for 40") != std::string::npos
                 ? "" : std::string("unexpected message: ") + e.what();
    }
    return "oversized message was accepted";
  });
  for (auto& e : bad) ADD_FAILURE() << e;
}

TEST(LoopDevice, TwoContextsOnOneDeviceConcurrently) {
  // One device per rank, two groups on it, each driven by its own thread:
  // packets are demultiplexed by context id.
  const int n = 3;
  gloo::rendezvous::HashStore base;
  gloo::rendezvous::PrefixStore sa("a", base), sb("b", base);
  std::vector<std::string> errors(2 * n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      auto dev = transport::loop::CreateDevice(attr{});
      std::shared_ptr<gloo::Context> ca, cb;
      std::thread ta([&] { ca = ConnectContext(sa, dev, r, n, std::chrono::seconds(30)); });
      std::thread tb([&] { cb = ConnectContext(sb, dev, r, n, std::chrono::seconds(30)); });
      ta.join();
      tb.join();
      std::thread ra([&] {
        for (int k = 0; k < 5 && errors[2 * r].empty(); ++k)
          errors[2 * r] = RunAll(ca, {"allreduce", "AllreduceRing", "recv_any"}, {1, 4096, 100000});
      });
      std::thread rb([&] {
        for (int k = 0; k < 5 && errors[2 * r + 1].empty(); ++k)
          errors[2 * r + 1] = RunAll(cb, {"broadcast", "alltoall", "sendrecv"}, {1, 4096, 100000});
      });
      ra.join();
      rb.join();
    });
  }
  for (auto& t : ranks) t.join();
  for (auto& e : errors) EXPECT_EQ(e, "");
}

TEST(LoopDevice, BadFaultSpecNamesKey) {
  transport::EngineOptions engine;
  engine.faults = "drop=0.1,bogus=3";
  try {
    transport::loop::CreateDevice(attr{}, engine);
    FAIL() << "bad spec accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("bogus"), std::string::npos) << e.what();
  }
  engine.faults = "drop=1.5";
  try {
    transport::loop::CreateDevice(attr{}, engine);
    FAIL() << "bad spec accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("drop=1.5"), std::string::npos) << e.what();
  }
}

TEST(LoopDevice, DestroyWithOperationsInFlight) {
  // Posted recvs and sends whose peers never answer; everything is torn down
  // with them pending. Must not crash or hang (ASan/TSan builds check more).
  for (int iter = 0; iter < 5; ++iter) {
    auto bad = RunRanks(3, {}, [&](int r, std::shared_ptr<gloo::Context> ctx) -> std::string {
      std::vector<int> big(1 << 18, r);
      auto ub = ctx->createUnboundBuffer(big.data(), big.size() * sizeof(int));
      if (r == 0) ub->recv(std::vector<int>{1, 2}, 1234);
      if (r == 1) ub->send(2, 999);  // never received
      return "";
    });
    for (auto& e : bad) ADD_FAILURE() << e;
  }
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
