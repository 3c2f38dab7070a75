// Ranks whose devices take datagrams of different sizes (MTU, or
// OPTIREDUCE_UDP_MAX_DATAGRAM set differently) complete every collective
// exactly: each pair uses the smaller of its two limits (they travel in the
// Address). Ranks are threads of this process.
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/device.h"

namespace optireduce {
namespace testing {
namespace {

// One device per rank, rank r taking datagrams of at most limits[r] bytes.
std::shared_ptr<gloo::transport::Device> Device(const std::string& kind, size_t limit) {
  if (kind == "udp") {
    transport::udp::attr a;
    a.hostname = "127.0.0.1";
    a.max_datagram = limit;
    return transport::udp::CreateDevice(a);
  }
  transport::loop::attr a;
  a.max_datagram = limit;
  return transport::loop::CreateDevice(a);
}

std::vector<std::string> RunWithLimits(const std::string& kind, const std::vector<size_t>& limits) {
  const int size = static_cast<int>(limits.size());
  gloo::rendezvous::HashStore store;
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto ctx = ConnectContext(store, Device(kind, limits[r]), r, size,
                                  std::chrono::seconds(20));
        for (const std::string& name : AllCaseNames()) {
          for (size_t n : {size_t(1), size_t(4096), size_t(100000)}) {
            std::string e = RunCase(name, ctx, n);
            if (!e.empty()) {
              errors[r] = e;
              return;
            }
          }
        }
      } catch (const std::exception& e) {
        errors[r] = std::string("rank ") + std::to_string(r) + ": " + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::string> bad;
  for (auto& e : errors)
    if (!e.empty()) bad.push_back(e.substr(0, 400));
  return bad;
}

TEST(DatagramSize, UdpRanksWithDifferentLimitsAreExact) {
  // 0: the loopback default (65000 bytes), 1: an Ethernet MTU, 2: a jumbo frame.
  EXPECT_EQ(RunWithLimits("udp", {0, 1472, 8972}), std::vector<std::string>{});
}

TEST(DatagramSize, LoopRanksWithDifferentLimitsAreExact) {
  EXPECT_EQ(RunWithLimits("loop", {9000, 1500, 4096}), std::vector<std::string>{});
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
