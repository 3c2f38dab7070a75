// DPDK backend over net_af_packet: each rank is a process in its own network
// namespace with one end of a veth pair; the other ends hang off one Linux
// bridge, which switches our Ethernet frames by MAC. Needs root; the fixture
// removes namespaces, veths and the bridge even when a test fails.
#include <gloo/rendezvous/file_store.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "tests/dpdk/dpdk_test_util.h"
#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"

namespace optireduce {
namespace testing {
namespace {

namespace dpdk = transport::dpdk;

std::string RunRank(const BridgedNamespaces& net, const std::string& dir, int rank,
                    int size, const GlooCaseList& list) {
  std::string e = EnterNamespace(net.Ns(rank));
  if (!e.empty()) return e;
  dpdk::attr a;
  a.eal_args = AfPacketEalArgs(net, rank);
  auto dev = dpdk::CreateDeviceOrError(a);
  if (!dev.ok()) return dev.status().ToString();
  gloo::rendezvous::FileStore store(dir + "/store");
  auto ctx = ConnectContext(store, *dev, rank, size, std::chrono::seconds(60));
  for (const auto& c : list.cases) {
    for (size_t n : list.elements) {
      e = RunCase(c, ctx, n);
      if (!e.empty()) return e + " [" + (*dev)->str() + "]";
    }
  }
  store.set("done" + std::to_string(rank), {'1'});
  for (int r = 0; r < size; ++r) store.wait({"done" + std::to_string(r)}, std::chrono::seconds(60));
  return "";
}

class DpdkAfPacket : public ::testing::TestWithParam<int> {};

TEST_P(DpdkAfPacket, CollectivesExactOverBridgedVeths) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, veth, bridge)";
  if (Sh("ip -V") != 0) GTEST_SKIP() << "needs the ip tool (iproute2)";
  const int n = GetParam();
  BridgedNamespaces net(n);
  ASSERT_TRUE(net.ok()) << "could not create bridge/namespaces/veths";
  TempDir dir("afpacket");
  const GlooCaseList list = StandardCases();
  auto errors = RunForked(n, [&](int r) { return RunRank(net, dir.path(), r, n, list); },
                          std::chrono::seconds(120));
  for (auto& e : errors) ADD_FAILURE() << e;
}

INSTANTIATE_TEST_SUITE_P(Ranks, DpdkAfPacket, ::testing::Values(2, 4));

}  // namespace
}  // namespace testing
}  // namespace optireduce
