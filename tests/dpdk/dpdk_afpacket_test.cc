// DPDK backend over net_af_packet: each rank is a process in its own network
// namespace with one end of a veth pair; the other ends hang off one Linux
// bridge, which switches our Ethernet frames by MAC. Needs root; the fixture
// removes namespaces, veths and the bridge even when a test fails.
#include <fcntl.h>
#include <gloo/rendezvous/file_store.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>

#include "tests/dpdk/dpdk_test_util.h"
#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/dpdk_eal.h"

namespace optireduce {
namespace testing {
namespace {

namespace dpdk = transport::dpdk;

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// A bridge and `n` namespaces, each with a veth whose peer is on the bridge.
class BridgedNamespaces {
 public:
  explicit BridgedNamespaces(int n) : n_(n) {
    static int counter = 0;
    tag_ = std::to_string(getpid() % 100000) + std::to_string(counter++);
    ok_ = Sh("ip link add " + Bridge() + " type bridge") == 0 &&
          Sh("ip link set " + Bridge() + " up") == 0;
    for (int r = 0; r < n && ok_; ++r) {
      ok_ = Sh("ip netns add " + Ns(r)) == 0 &&
            Sh("ip link add " + Inner(r) + " type veth peer name " + Outer(r)) == 0 &&
            Sh("ip link set " + Inner(r) + " netns " + Ns(r)) == 0 &&
            Sh("ip link set " + Outer(r) + " master " + Bridge() + " up") == 0 &&
            Sh("ip -n " + Ns(r) + " link set " + Inner(r) + " up") == 0;
    }
  }
  ~BridgedNamespaces() {
    for (int r = 0; r < n_; ++r) {
      Sh("ip netns del " + Ns(r));     // takes the inner veth (and its peer)
      Sh("ip link del " + Outer(r));   // in case the move never happened
    }
    Sh("ip link del " + Bridge());
  }
  bool ok() const { return ok_; }
  std::string Bridge() const { return "orb" + tag_; }
  std::string Ns(int r) const { return "orns" + tag_ + "_" + std::to_string(r); }
  std::string Inner(int r) const { return "orv" + tag_ + "_" + std::to_string(r); }
  std::string Outer(int r) const { return "orh" + tag_ + "_" + std::to_string(r); }

 private:
  int n_;
  std::string tag_;
  bool ok_ = false;
};

std::string EnterNamespace(const std::string& ns) {
  const std::string path = "/var/run/netns/" + ns;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open " + path;
  const int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  return rc == 0 ? "" : "setns " + ns + " failed";
}

std::string RunRank(const BridgedNamespaces& net, const std::string& dir, int rank,
                    int size, const GlooCaseList& list) {
  std::string e = EnterNamespace(net.Ns(rank));
  if (!e.empty()) return e;
  dpdk::attr a;
  // The kernel's default af_packet ring loses frames under bursts.
  a.eal_args = "--vdev=net_af_packet0,iface=" + net.Inner(rank) +
               ",framecnt=16384,blocksz=4096,framesz=2048 " + dpdk::DefaultEalArgs();
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
