// DPDK backend over net_af_packet under REAL kernel packet loss: 4 ranks in
// network namespaces on bridged veths (as dpdk_afpacket_test), and a tc eBPF
// program (bench/lab/drop.c, compiled here with clang -target bpf) on the
// ingress of every bridge-side veth that drops each IPv4 frame a rank sends
// with probability kDropPpm / 1e6 (TC_ACT_SHOT). The reliable service must
// still give exact results for Gloo's allreduce (new-style ring), Gloo's
// AllreduceRing and TAR (optireduce::allreduce), and the test checks that
// frames were really dropped (the clsact qdisc's drop counter) and really
// repaired (the engines' retransmit counters).
//
// Needs root, iproute2 (ip, tc) and clang with the BPF target; without them
// the test is SKIPPED with the reason. Namespaces, veths, the bridge and the
// qdiscs (they live on the veths) are removed even when the test fails.
#include <gloo/math.h>
#include <gloo/rendezvous/file_store.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "algorithms/allreduce.h"
#include "tests/dpdk/dpdk_test_util.h"
#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"

#ifndef OPTIREDUCE_DROP_BPF_SOURCE
#error "OPTIREDUCE_DROP_BPF_SOURCE (path of bench/lab/drop.c) must be defined"
#endif

namespace optireduce {
namespace testing {
namespace {

namespace dpdk = transport::dpdk;

constexpr int kRanks = 4;
constexpr int kDropPpm = 15000;  // 1.5 % of the IPv4 frames each rank sends
const std::vector<size_t> kElements = {1, 1000, 65536, 1 << 20};  // int32: up to 4 MiB

// Runs `cmd`, returns its exit status and (in *out) stdout + stderr.
int Capture(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  return pclose(p);
}

// Compiles drop.c for the BPF target into `obj`; "" or why it could not.
std::string BuildDropProgram(const std::string& obj) {
  std::string out;
  if (Capture("clang --version", &out) != 0) return "clang is not installed";
  std::string includes;
  for (const char* d : {"/usr/include/x86_64-linux-gnu", "/usr/include/aarch64-linux-gnu"}) {
    if (Sh(std::string("test -d ") + d + "/asm") == 0) includes += std::string(" -I") + d;
  }
  const std::string cmd = "clang -O2 -target bpf" + includes + " -DDROP_PPM=" +
                          std::to_string(kDropPpm) + " -c " + OPTIREDUCE_DROP_BPF_SOURCE +
                          " -o " + obj;
  if (Capture(cmd, &out) != 0) return "'" + cmd + "' failed: " + out;
  return "";
}

// Frames the clsact qdisc on `dev` passed ("Sent ... pkt") and dropped.
struct QdiscCounts {
  uint64_t sent = 0, dropped = 0;
};
bool ReadClsactCounts(const std::string& dev, QdiscCounts* c) {
  std::string out;
  if (Capture("tc -s qdisc show dev " + dev, &out) != 0) return false;
  const size_t at = out.find("qdisc clsact");
  if (at == std::string::npos) return false;
  static const std::regex re(R"(Sent \d+ bytes (\d+) pkt \(dropped (\d+))");
  std::smatch m;
  const std::string tail = out.substr(at);
  if (!std::regex_search(tail, m, re)) return false;
  c->sent = std::stoull(m[1]);
  c->dropped = std::stoull(m[2]);
  return true;
}

int32_t Value(int rank, size_t i) {
  return static_cast<int32_t>((i * 31 + static_cast<size_t>(rank) * 1009) % 2001) - 1000;
}

// TAR over the context's reliable service, int32 sum, checked exactly.
std::string RunTranspose(const std::shared_ptr<gloo::Context>& ctx, size_t n, uint32_t tag) {
  std::vector<int32_t> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = Value(ctx->rank, i);
  optireduce::AllreduceOptions opts(ctx);
  opts.setOutput(data.data(), n);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<int32_t>));
  opts.setTag(tag);
  opts.setTimeout(std::chrono::seconds(60));
  optireduce::allreduce(opts);
  for (size_t i = 0; i < n; ++i) {
    int32_t want = 0;
    for (int r = 0; r < ctx->size; ++r) want += Value(r, i);
    if (data[i] != want) {
      return "transpose: element " + std::to_string(i) + " of " + std::to_string(n) + " is " +
             std::to_string(data[i]) + ", expected " + std::to_string(want);
    }
  }
  return "";
}

std::string RunRank(const BridgedNamespaces& net, const std::string& dir, int rank) {
  std::string e = EnterNamespace(net.Ns(rank));
  if (!e.empty()) return e;
  dpdk::attr a;
  a.eal_args = AfPacketEalArgs(net, rank);
  auto dev = dpdk::CreateDeviceOrError(a);
  if (!dev.ok()) return dev.status().ToString();
  gloo::rendezvous::FileStore store(dir + "/store");
  auto ctx = ConnectContext(store, *dev, rank, kRanks, std::chrono::seconds(60));
  uint32_t tag = 100;
  for (size_t n : kElements) {
    for (const char* c : {"allreduce", "AllreduceRing"}) {
      e = RunCase(c, ctx, n);
      if (!e.empty()) return e;
    }
    e = RunTranspose(ctx, n, tag++);
    if (!e.empty()) return e;
  }
  // Counters after the work, before the barrier below adds its own traffic.
  const transport::Stats s = (*dev)->stats();
  std::ofstream(dir + "/stats" + std::to_string(rank))
      << s.retransmits << " " << s.tx_packets << " " << s.rx_packets << "\n";
  store.set("done" + std::to_string(rank), {'1'});
  for (int r = 0; r < kRanks; ++r) {
    store.wait({"done" + std::to_string(r)}, std::chrono::seconds(60));
  }
  return "";
}

TEST(DpdkAfPacketLoss, FourRanksExactUnderRealKernelDrops) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, veth, bridge, tc)";
  if (Sh("ip -V") != 0) GTEST_SKIP() << "needs the ip tool (iproute2)";
  if (Sh("tc -V") != 0) GTEST_SKIP() << "needs the tc tool (iproute2)";
  TempDir dir("afpacket_loss");
  const std::string obj = dir.path() + "/drop.o";
  const std::string why = BuildDropProgram(obj);
  if (!why.empty()) GTEST_SKIP() << "cannot build the eBPF drop program: " << why;

  BridgedNamespaces net(kRanks);
  ASSERT_TRUE(net.ok()) << "could not create bridge/namespaces/veths";
  for (int r = 0; r < kRanks; ++r) {
    // Ingress of the bridge-side veth = every frame rank r sends, before the
    // bridge forwards it (and before any af_packet tap on the receiver).
    std::string out;
    if (Capture("tc qdisc add dev " + net.Outer(r) + " clsact", &out) != 0) {
      GTEST_SKIP() << "cannot add a clsact qdisc: " << out;
    }
    if (Capture("tc filter add dev " + net.Outer(r) + " ingress prio 1 handle 1 bpf da obj " +
                    obj + " sec drop", &out) != 0) {
      GTEST_SKIP() << "cannot attach the eBPF drop program with tc: " << out;
    }
  }

  auto errors = RunForked(kRanks, [&](int r) { return RunRank(net, dir.path(), r); },
                          std::chrono::seconds(120));
  for (auto& e : errors) ADD_FAILURE() << e;

  QdiscCounts total;
  for (int r = 0; r < kRanks; ++r) {
    QdiscCounts c;
    ASSERT_TRUE(ReadClsactCounts(net.Outer(r), &c)) << "no clsact counters on " << net.Outer(r);
    total.sent += c.sent;
    total.dropped += c.dropped;
  }
  uint64_t retransmits = 0, tx = 0;
  for (int r = 0; r < kRanks; ++r) {
    std::ifstream in(dir.path() + "/stats" + std::to_string(r));
    uint64_t re = 0, t = 0, rx = 0;
    if (!(in >> re >> t >> rx)) {
      ADD_FAILURE() << "rank " << r << " wrote no engine counters";
      continue;
    }
    retransmits += re;
    tx += t;
  }
  std::printf("kernel (tc eBPF): %llu of %llu frames dropped (%.2f%%, asked %.2f%%); "
              "engines: %llu packets sent, %llu retransmitted\n",
              static_cast<unsigned long long>(total.dropped),
              static_cast<unsigned long long>(total.sent),
              total.sent ? 100.0 * total.dropped / total.sent : 0.0, kDropPpm / 1e4,
              static_cast<unsigned long long>(tx), static_cast<unsigned long long>(retransmits));
  EXPECT_GT(total.dropped, 0u) << "the eBPF program dropped nothing: the test proved nothing";
  EXPECT_GT(retransmits, 0u) << "frames were dropped but no engine retransmitted";
  // The program is what drops: the rate is near the one asked for (statistical
  // bounds, x4 either way, over thousands of frames).
  if (total.sent > 10000) {
    const double rate = static_cast<double>(total.dropped) / total.sent;
    EXPECT_GT(rate, kDropPpm / 1e6 / 4);
    EXPECT_LT(rate, kDropPpm / 1e6 * 4);
  }
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
