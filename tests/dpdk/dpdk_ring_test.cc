// DPDK backend over net_ring: ranks are threads of this process sharing one
// EAL; every pair of ranks is linked by a pair of ring ports (a mesh).
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>

#include <gloo/rendezvous/context.h>

#include <time.h>

#include <atomic>
#include <thread>

#include "tests/dpdk/dpdk_test_util.h"
#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/device.h"
#include "transport_dpdk/dpdk_device.h"

namespace optireduce {
namespace testing {
namespace {

namespace dpdk = transport::dpdk;

std::vector<std::string> RunRingRanks(int n, const GlooCaseList& list,
                                      const std::string& faults = "") {
  static std::atomic<int> run{0};
  const std::string prefix = "t" + std::to_string(run++);
  auto mesh = dpdk::CreateRingMesh(prefix, n);
  if (!mesh.ok()) return {mesh.status().ToString()};
  gloo::rendezvous::HashStore store;
  std::vector<std::string> errors(n);
  // Devices outlive every rank's work: a rank done early may still owe
  // acknowledgements to a peer.
  std::vector<std::shared_ptr<gloo::transport::Device>> devices(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        dpdk::attr a;
        a.ports = (*mesh)[r];
        a.engine.faults = faults;
        if (!faults.empty()) a.engine.min_rto = std::chrono::microseconds(2000);
        devices[r] = dpdk::CreateDevice(a);
        auto ctx = ConnectContext(store, devices[r], r, n, std::chrono::seconds(60));
        for (const auto& c : list.cases) {
          for (size_t e : list.elements) {
            std::string err = RunCase(c, ctx, e);
            if (!err.empty()) {
              errors[r] = err;
              return;
            }
          }
        }
      } catch (const std::exception& e) {
        errors[r] = "rank " + std::to_string(r) + ": " + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  devices.clear();
  std::vector<std::string> bad;
  for (auto& e : errors)
    if (!e.empty()) bad.push_back(e);
  return bad;
}

class DpdkRing : public ::testing::TestWithParam<int> {};

TEST_P(DpdkRing, CollectivesExactRanksAsThreads) {
  for (auto& e : RunRingRanks(GetParam(), StandardCases())) ADD_FAILURE() << e;
}

INSTANTIATE_TEST_SUITE_P(Ranks, DpdkRing, ::testing::Values(2, 3, 4));

TEST(DpdkRingFaults, ExactUnderDropReorderDup) {
  GlooCaseList list{{"allreduce", "AllreduceRing", "broadcast", "allgather", "sendrecv"},
                    {0, 1, 1000, 100000}};
  for (auto& e : RunRingRanks(3, list, "drop=0.01,reorder=0.01,dup=0.01,seed=3")) {
    ADD_FAILURE() << e;
  }
}

TEST(DpdkRing, SecondDeviceOnABusyPortIsAnError) {
  auto mesh = dpdk::CreateRingMesh("busy", 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  dpdk::attr a;
  a.ports = (*mesh)[0];
  auto d1 = dpdk::CreateDeviceOrError(a);
  ASSERT_TRUE(d1.ok()) << d1.status();
  auto d2 = dpdk::CreateDeviceOrError(a);
  ASSERT_FALSE(d2.ok());
  EXPECT_NE(d2.status().message().find("already used"), std::string::npos) << d2.status();
  auto d2b = dpdk::CreateDeviceOrError(a);  // the failed attempt freed nothing
  ASSERT_FALSE(d2b.ok());
  d1->reset();
  auto d3 = dpdk::CreateDeviceOrError(a);  // released ports can be reopened
  EXPECT_TRUE(d3.ok()) << d3.status();
}

// Ports have no input wake-up, yet a thread blocked in waitRecv polls the device itself
// (waiter-driven receive): the datagrams that complete its receives are taken in by that
// thread, not by the progress thread and handed over. 200 round trips of one int, every
// receive posted before its message arrives (as collectives post theirs).
TEST(DpdkRing, WaitingThreadReceivesItself) {
  auto mesh = dpdk::CreateRingMesh("waiter", 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  std::vector<std::shared_ptr<transport::Device>> devices(2);
  for (int r = 0; r < 2; ++r) {
    dpdk::attr a;
    a.ports = (*mesh)[r];
    auto dev = dpdk::CreateDeviceOrError(a);
    ASSERT_TRUE(dev.ok()) << dev.status();
    devices[r] = *dev;
  }
  gloo::rendezvous::HashStore store;
  constexpr int kMessages = 200;
  std::vector<transport::Stats> before(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto ctx = std::make_shared<gloo::rendezvous::Context>(i, 2);
      ctx->setTimeout(std::chrono::seconds(30));
      std::shared_ptr<gloo::transport::Device> dev = devices[i];
      ctx->connectFullMesh(store, dev);
      before[i] = devices[i]->stats();
      int out = 0, in = -1;
      auto send_buf = ctx->createUnboundBuffer(&out, sizeof(out));
      auto recv_buf = ctx->createUnboundBuffer(&in, sizeof(in));
      const int other = 1 - i;
      // Rank 0 sends even values on slot 2m, rank 1 answers value + 1 on slot 2m + 1.
      recv_buf->recv(other, i == 0 ? 1 : 0);
      for (int m = 0; m < kMessages; ++m) {
        if (i == 0) {
          out = 2 * m;
          send_buf->send(1, 2 * m);
          recv_buf->waitRecv();
          EXPECT_EQ(in, 2 * m + 1);
          if (m + 1 < kMessages) recv_buf->recv(1, 2 * m + 3);
          send_buf->waitSend();
        } else {
          recv_buf->waitRecv();
          EXPECT_EQ(in, 2 * m);
          out = in + 1;
          if (m + 1 < kMessages) recv_buf->recv(0, 2 * m + 2);
          send_buf->send(0, 2 * m + 1);
          send_buf->waitSend();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    const transport::Stats after = devices[r]->stats();
    EXPECT_GT(after.waiter_polls - before[r].waiter_polls, 0u) << after.ToString();
    EXPECT_GT(after.rx_by_waiter - before[r].rx_by_waiter, 0u) << after.ToString();
  }
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// A thread blocked in waitRecv for a message that comes a second later polls the ports
// itself (the test above) but backs off like an idle progress thread: the whole process,
// two connected devices and the waiting thread, stays under 5% of a core per device.
TEST(DpdkRing, ThreadWaitingLongForAMessageStaysUnderFivePercentOfACorePerDevice) {
  auto mesh = dpdk::CreateRingMesh("idlewait", 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  std::vector<std::shared_ptr<transport::Device>> devices(2);
  for (int r = 0; r < 2; ++r) {
    dpdk::attr a;
    a.ports = (*mesh)[r];
    auto dev = dpdk::CreateDeviceOrError(a);
    ASSERT_TRUE(dev.ok()) << dev.status();
    devices[r] = *dev;
  }
  gloo::rendezvous::HashStore store;
  std::vector<std::shared_ptr<gloo::rendezvous::Context>> ctx(2);
  {
    std::vector<std::thread> connect;
    for (int i = 0; i < 2; ++i) {
      connect.emplace_back([&, i] {
        ctx[i] = std::make_shared<gloo::rendezvous::Context>(i, 2);
        ctx[i]->setTimeout(std::chrono::seconds(30));
        std::shared_ptr<gloo::transport::Device> dev = devices[i];
        ctx[i]->connectFullMesh(store, dev);
      });
    }
    for (auto& t : connect) t.join();
  }
  int in = -1, out = 42;
  auto recv_buf = ctx[0]->createUnboundBuffer(&in, sizeof(in));
  auto send_buf = ctx[1]->createUnboundBuffer(&out, sizeof(out));
  const auto polls_before = devices[0]->stats().waiter_polls;
  recv_buf->recv(1, 5);
  std::thread waiter([&] { recv_buf->waitRecv(); });
  const double cpu0 = ProcessCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the wait measured
  const double used = ProcessCpuSeconds() - cpu0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  send_buf->send(0, 5);
  send_buf->waitSend();
  waiter.join();
  EXPECT_EQ(in, 42);
  EXPECT_GT(devices[0]->stats().waiter_polls - polls_before, 0u);  // the waiter polled
  EXPECT_LT(used / wall, 2 * 0.05) << "two devices and a waiting thread used "
                                   << 100 * used / wall << "% of a core";
  RecordProperty("waiting_cpu_percent", std::to_string(100 * used / wall));
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
