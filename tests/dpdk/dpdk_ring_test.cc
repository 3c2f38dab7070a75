// DPDK backend over net_ring: ranks are threads of this process sharing one
// EAL; every pair of ranks is linked by a pair of ring ports (a mesh).
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>

#include <time.h>

#include <atomic>
#include <thread>

#include "tests/dpdk/dpdk_test_util.h"
#include "tests/transport/conformance_cases.h"
#include "tests/transport/two_ranks.h"
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
        transport::EngineOptions engine;
        engine.faults = faults;
        if (!faults.empty()) engine.min_rto = std::chrono::microseconds(2000);
        devices[r] = dpdk::CreateDevice(a, engine);
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

// Two ranks (threads) over a two-port ring mesh named `prefix`, connected; empty (and a
// test failure) if the mesh or a device fails.
std::vector<testing_ranks::Rank> RingRanks(const std::string& prefix) {
  auto mesh = dpdk::CreateRingMesh(prefix, 2);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  if (!mesh.ok()) return {};
  std::vector<std::shared_ptr<transport::Device>> devices;
  for (int r = 0; r < 2; ++r) {
    dpdk::attr a;
    a.ports = (*mesh)[r];
    auto dev = dpdk::CreateDeviceOrError(a);
    EXPECT_TRUE(dev.ok()) << dev.status();
    if (!dev.ok()) return {};
    devices.push_back(*dev);
  }
  return testing_ranks::ConnectDevices(devices);
}

// Ports have no input wake-up, yet a thread blocked in waitRecv polls the device itself
// (waiter-driven receive): the datagrams that complete its receives are taken in by that
// thread, not by the progress thread and handed over.
TEST(DpdkRing, WaitingThreadReceivesItself) {
  auto ranks = RingRanks("waiter");
  ASSERT_EQ(ranks.size(), 2u);
  const transport::Stats d = testing_ranks::PrepostedPingPong(ranks, 200);
  EXPECT_GT(d.waiter_polls, 0u) << d.ToString();
  EXPECT_GT(d.rx_by_waiter, 0u) << d.ToString();
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
  auto ranks = RingRanks("idlewait");
  ASSERT_EQ(ranks.size(), 2u);
  int in = -1, out = 42;
  auto recv_buf = ranks[0].context->createUnboundBuffer(&in, sizeof(in));
  auto send_buf = ranks[1].context->createUnboundBuffer(&out, sizeof(out));
  const auto polls_before = ranks[0].device->stats().waiter_polls;
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
  EXPECT_GT(ranks[0].device->stats().waiter_polls - polls_before, 0u);  // the waiter polled
  EXPECT_LT(used / wall, 2 * 0.05) << "two devices and a waiting thread used "
                                   << 100 * used / wall << "% of a core";
  RecordProperty("waiting_cpu_percent", std::to_string(100 * used / wall));
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
