// dpdk_io_bench — raw packet I/O throughput of the datagram backends, two
// processes (sender -> receiver), ~1 KB datagrams, no protocol engine:
//   memif             DPDK net_memif between two processes
//   af_packet (veth)  DPDK net_af_packet on a veth pair across two network
//                     namespaces (root only)
//   af_xdp (veth)     DPDK net_af_xdp on the same veth pair (root; the PMD
//                     loads its own XDP program; generic/skb mode on veth)
//   udp (veth)        kernel UDP sockets (sendmmsg/recvmmsg) on the same veth
//                     pair, 10.231.0.1 -> 10.231.0.2
//   tcp (veth)        one kernel TCP stream on the same veth pair, 256 KiB
//                     writes; "datagrams" = bytes / payload_bytes (Mpps is
//                     that equivalent, TCP has no datagrams)
//   udp (loopback)    kernel UDP sockets on 127.0.0.1
// Prints a table. Usage: dpdk_io_bench [datagrams] [payload_bytes]
//
//   dpdk_io_bench --flow-probe
// asks each virtual PMD usable here (memif, af_packet, af_xdp, ring) whether it
// accepts the rte_flow rule of the queue-per-rank design (ETH / IPV4 dst /
// UDP dst port -> QUEUE n) with rte_flow_validate, and prints the answer.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <gloo/rendezvous/file_store.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <rte_ethdev.h>
#include <rte_flow.h>

#include "gloo_ext/devices.h"
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"
#include "transport_dpdk/io/dpdk/packet_io_dpdk.h"
#include "transport_dpdk/io/udp/packet_io_udp.h"

using namespace optireduce::transport;
using Clock = std::chrono::steady_clock;

namespace {

struct Result {
  uint64_t received = 0;
  double seconds = 0;
};

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// Runs one side. role 0 sends `count` datagrams of `len` bytes, role 1
// receives until `count` arrived or the link has been quiet for 2 s.
// The receiver writes its Result to the pipe.
void Side(int role, std::unique_ptr<PacketIo> io, gloo::rendezvous::Store& store,
          uint64_t count, uint32_t len, int out_fd) {
  const IoAddress mine = io->LocalAddress();
  store.set("addr" + std::to_string(role), std::vector<char>(mine.begin(), mine.end()));
  if (role == 1) {
    store.set("ready", {'1'});
    std::vector<RxDatagram> rx(64);
    Result r;
    Clock::time_point first{}, last = Clock::now();
    for (;;) {
      const size_t n = io->RxBurst(rx.data(), rx.size());
      const auto now = Clock::now();
      if (n) {
        if (r.received == 0) first = now;
        r.received += n;
        last = now;
        if (r.received >= count) break;
      } else if (r.received && now - last > std::chrono::seconds(2)) {
        break;
      } else if (!r.received && now - last > std::chrono::seconds(20)) {
        break;
      }
    }
    r.seconds = std::chrono::duration<double>(last - first).count();
    ssize_t w = write(out_fd, &r, sizeof(r));
    (void)w;
    store.set("done", {'1'});
    return;
  }
  store.wait({"addr1", "ready"}, std::chrono::seconds(30));
  auto v = store.get("addr1");
  IoAddress peer_addr{};
  std::memcpy(peer_addr.data(), v.data(), std::min(v.size(), peer_addr.size()));
  auto peer = io->ResolvePeer(peer_addr);
  if (!peer.ok()) {
    std::fprintf(stderr, "resolve: %s\n", peer.status().ToString().c_str());
    return;
  }
  std::vector<uint8_t> payload(len, 0x5A);
  std::vector<TxDatagram> d(32);
  for (auto& t : d) {
    t.peer = *peer;
    t.head = payload.data();
    t.head_len = 64;
    t.body = payload.data() + 64;
    t.body_len = len - 64;
  }
  uint64_t sent = 0;
  std::vector<RxDatagram> rx(64);
  while (sent < count) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(32, count - sent));
    const size_t took = io->TxBurst(d.data(), n);
    sent += took;
    if (took < n) {
      io->RxBurst(rx.data(), rx.size());  // lets the memif watchdog run
      std::this_thread::yield();
    }
  }
  // Keep polling until the receiver is done: the DPDK backend sends frames
  // its TX ring could not take yet from a backlog on every Tx/RxBurst.
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    io->RxBurst(rx.data(), rx.size());
    try {
      store.wait({"done"}, std::chrono::milliseconds(1));
      break;
    } catch (const std::exception&) {
      if (Clock::now() > give_up) break;  // not done yet: poll again
    }
  }
}

Result RunPair(const std::string& dir,
               const std::function<std::unique_ptr<PacketIo>(int)>& make,
               uint64_t count, uint32_t len) {
  int p[2];
  if (pipe(p) != 0) return {};
  pid_t pids[2];
  for (int role = 0; role < 2; ++role) {
    pids[role] = fork();
    if (pids[role] == 0) {
      close(p[0]);
      auto io = make(role);
      if (io) {
        gloo::rendezvous::FileStore store(dir);
        Side(role, std::move(io), store, count, len, p[1]);
      }
      _exit(0);
    }
  }
  close(p[1]);
  Result r;
  if (read(p[0], &r, sizeof(r)) != sizeof(r)) r = {};
  close(p[0]);
  for (pid_t pid : pids) {
    // Don't wait forever on a stuck side.
    for (int i = 0; i < 300; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) break;
      if (i == 299) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return r;
}

bool EnterNs(const std::string& ns) {
  if (ns.empty()) return true;
  int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY);
  if (fd < 0) return false;
  const bool ok = setns(fd, CLONE_NEWNET) == 0;
  close(fd);
  return ok;
}

// One TCP stream, sender in ns0 -> receiver in ns1 (address ip1), `bytes`
// bytes in 256 KiB writes. Timed at the receiver from its first to its last
// byte, like the datagram rows.
Result RunTcp(const std::string& ns0, const std::string& ns1, const std::string& ip1,
              uint64_t bytes) {
  int p[2], ready[2];
  if (pipe(p) != 0 || pipe(ready) != 0) return {};
  const uint16_t port = 17999;
  pid_t rx = fork();
  if (rx == 0) {
    close(p[0]);
    close(ready[0]);
    Result r;
    int ls = -1, c = -1;
    if (EnterNs(ns1) && (ls = socket(AF_INET, SOCK_STREAM, 0)) >= 0) {
      int one = 1;
      setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      inet_pton(AF_INET, ip1.c_str(), &a.sin_addr);
      if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(ls, 1) == 0) {
        ssize_t w = write(ready[1], "1", 1);
        (void)w;
        c = accept(ls, nullptr, nullptr);
      }
    }
    if (c >= 0) {
      std::vector<char> buf(1 << 20);
      uint64_t got = 0;
      Clock::time_point first{}, last{};
      while (got < bytes) {
        const ssize_t n = read(c, buf.data(), buf.size());
        if (n <= 0) break;
        last = Clock::now();
        if (got == 0) first = last;
        got += static_cast<uint64_t>(n);
      }
      r.received = got;  // bytes here; the caller converts
      r.seconds = std::chrono::duration<double>(last - first).count();
      close(c);
    }
    ssize_t w = write(p[1], &r, sizeof(r));
    (void)w;
    _exit(0);
  }
  close(ready[1]);
  char one;
  const bool listening = read(ready[0], &one, 1) == 1;
  close(ready[0]);
  pid_t tx = fork();
  if (tx == 0) {
    int s = -1;
    if (listening && EnterNs(ns0) && (s = socket(AF_INET, SOCK_STREAM, 0)) >= 0) {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      inet_pton(AF_INET, ip1.c_str(), &a.sin_addr);
      if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
        std::vector<char> buf(256 << 10, 0x5A);
        uint64_t sent = 0;
        while (sent < bytes) {
          const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), bytes - sent));
          const ssize_t n = write(s, buf.data(), want);
          if (n <= 0) break;
          sent += static_cast<uint64_t>(n);
        }
      }
      close(s);
    }
    _exit(0);
  }
  close(p[1]);
  Result r;
  if (read(p[0], &r, sizeof(r)) != sizeof(r)) r = {};
  close(p[0]);
  kill(tx, SIGKILL);
  kill(rx, SIGKILL);
  waitpid(tx, nullptr, 0);
  waitpid(rx, nullptr, 0);
  return r;
}

std::unique_ptr<PacketIo> Dpdk(const std::string& eal, const std::string& ns,
                               bool udp_checksum = true) {
  if (!EnterNs(ns)) return nullptr;
  // af_xdp's UMEM and BPF maps are locked memory: lift the (8 MiB) limit.
  rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
  setrlimit(RLIMIT_MEMLOCK, &unlimited);
  // The library's OPTIREDUCE_DPDK_* variables apply (the A/B switches
  // OPTIREDUCE_DPDK_TX_COPY / _TX_BACKLOG, ports); the EAL arguments are ours.
  auto from_env = optireduce::gloo_ext::DpdkAttrFromEnvironment();
  if (!from_env.ok()) {
    std::fprintf(stderr, "dpdk: %s\n", from_env.status().ToString().c_str());
    return nullptr;
  }
  dpdk::attr a = *from_env;
  a.eal_args = eal + " " + dpdk::DefaultEalArgs();
  a.udp_checksum = udp_checksum;
  auto io = DpdkPacketIo::Create(a, EngineOptions().window_bytes);
  if (!io.ok()) {
    std::fprintf(stderr, "dpdk: %s\n", io.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*io);
}

// In a child process: EAL with `vdev` (in namespace `ns`), then
// rte_flow_validate of "UDP dst port 17001 to queue 0" on every port.
void FlowProbeOne(const std::string& label, const std::string& vdev, const std::string& ns) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    std::string answer;
    if (!EnterNs(ns)) {
      answer = "cannot enter namespace " + ns;
    } else if (auto st = dpdk::EnsureEal(vdev + " " + dpdk::DefaultEalArgs()); !st.ok()) {
      answer = "EAL: " + st.ToString();
    } else {
      uint16_t port;
      RTE_ETH_FOREACH_DEV(port) {
        rte_eth_dev_info info{};
        rte_eth_dev_info_get(port, &info);
        rte_eth_conf conf{};
        rte_eth_dev_configure(port, 1, 1, &conf);
        rte_flow_attr attr{};
        attr.ingress = 1;
        rte_flow_item_ipv4 ip{};
        ip.hdr.dst_addr = htonl(0x0a4d0001);
        rte_flow_item_ipv4 ip_mask{};
        ip_mask.hdr.dst_addr = 0xffffffff;
        rte_flow_item_udp udp{};
        udp.hdr.dst_port = htons(17001);
        rte_flow_item_udp udp_mask{};
        udp_mask.hdr.dst_port = 0xffff;
        rte_flow_item pattern[] = {
            {RTE_FLOW_ITEM_TYPE_ETH, nullptr, nullptr, nullptr},
            {RTE_FLOW_ITEM_TYPE_IPV4, &ip, nullptr, &ip_mask},
            {RTE_FLOW_ITEM_TYPE_UDP, &udp, nullptr, &udp_mask},
            {RTE_FLOW_ITEM_TYPE_END, nullptr, nullptr, nullptr}};
        rte_flow_action_queue queue{};
        queue.index = 0;
        rte_flow_action actions[] = {{RTE_FLOW_ACTION_TYPE_QUEUE, &queue},
                                     {RTE_FLOW_ACTION_TYPE_END, nullptr}};
        rte_flow_error err{};
        const int rc = rte_flow_validate(port, &attr, pattern, actions, &err);
        char line[512];
        std::snprintf(line, sizeof(line), "%s%s (driver %s, max rx queues %u): %s%s%s",
                      answer.empty() ? "" : "; ", label.c_str(), info.driver_name,
                      info.max_rx_queues, rc == 0 ? "ACCEPTED" : "refused: ",
                      rc == 0 ? "" : std::strerror(-rc),
                      rc != 0 && err.message ? (std::string(" (") + err.message + ")").c_str()
                                             : "");
        answer += line;
      }
      if (answer.empty()) answer = label + ": no port probed";
    }
    std::printf("%s\n", answer.c_str());
    std::fflush(stdout);
    _exit(0);
  }
  waitpid(pid, nullptr, 0);
}

int FlowProbe(const std::string& dir) {
  std::printf("rte_flow_validate(ETH / IPV4 dst / UDP dst -> QUEUE 0) per virtual PMD:\n");
  FlowProbeOne("net_memif", "--vdev=net_memif0,role=server,id=0,socket=" + dir +
                                "/flow.sock,socket-abstract=no", "");
  FlowProbeOne("net_ring", "--vdev=net_ring0", "");
  if (geteuid() != 0) {
    std::printf("af_packet / af_xdp: need root (veth in a namespace), not probed\n");
    return 0;
  }
  const std::string tag = std::to_string(getpid() % 100000);
  const std::string ns = "oribfl" + tag, v0 = "oribfl" + tag + "a", v1 = "oribfl" + tag + "b";
  if (Sh("ip netns add " + ns) == 0 &&
      Sh("ip -n " + ns + " link add " + v0 + " type veth peer name " + v1) == 0 &&
      Sh("ip -n " + ns + " link set " + v0 + " up") == 0 &&
      Sh("ip -n " + ns + " link set " + v1 + " up") == 0) {
    FlowProbeOne("net_af_packet", "--vdev=net_af_packet0,iface=" + v0, ns);
    FlowProbeOne("net_af_xdp", "--vdev=net_af_xdp0,iface=" + v0 + ",start_queue=0,queue_count=1",
                 ns);
  } else {
    std::printf("could not create a veth pair: af_packet / af_xdp not probed\n");
  }
  Sh("ip netns del " + ns);
  return 0;
}

void Row(const char* name, uint64_t count, uint32_t len, const Result& r) {
  if (r.received == 0 || r.seconds <= 0) {
    std::printf("| %-18s | %10s | %8s | %8s | %8s |\n", name, "failed", "-", "-", "-");
    return;
  }
  const double mpps = r.received / r.seconds / 1e6;
  const double gbps = r.received * static_cast<double>(len) * 8 / r.seconds / 1e9;
  const double loss = 100.0 * (1.0 - static_cast<double>(r.received) / count);
  std::printf("| %-18s | %10llu | %8.3f | %8.2f | %7.2f%% |\n", name,
              static_cast<unsigned long long>(r.received), mpps, gbps, loss);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--flow-probe") {
    char t[] = "/tmp/optireduce_flowprobe_XXXXXX";
    if (!mkdtemp(t)) return 1;
    const int rc = FlowProbe(t);
    std::error_code ec;
    std::filesystem::remove_all(t, ec);
    return rc;
  }
  const uint64_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000;
  const uint32_t len = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 1024;
  char tmpl[] = "/tmp/optireduce_iobench_XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  const std::string dir = tmpl;
  std::printf("%llu datagrams of %u bytes, sender -> receiver (2 processes)\n\n",
              static_cast<unsigned long long>(count), len);
  std::printf("| %-18s | %10s | %8s | %8s | %8s |\n", "backend", "received", "Mpps",
              "Gb/s", "loss");
  std::printf("|--------------------|------------|----------|----------|----------|\n");
  std::fflush(stdout);

  for (bool csum : {true, false}) {
    const std::string sub = dir + (csum ? "/memif" : "/memif_nocsum");
    std::filesystem::create_directory(sub);
    const std::string sock = sub + ".sock";
    auto r = RunPair(sub, [&](int role) {
      return Dpdk("--vdev=net_memif0,role=" + std::string(role ? "client" : "server") +
                      ",id=0,socket=" + sock + ",socket-abstract=no", "", csum);
    }, count, len);
    Row(csum ? "memif" : "memif (no UDP csum)", count, len, r);
    std::fflush(stdout);
  }
  if (geteuid() == 0) {
    const std::string tag = std::to_string(getpid() % 100000);
    const std::string ns0 = "oribns" + tag + "a", ns1 = "oribns" + tag + "b";
    const std::string v0 = "oribv" + tag + "a", v1 = "oribv" + tag + "b";
    const bool ok = Sh("ip netns add " + ns0) == 0 && Sh("ip netns add " + ns1) == 0 &&
                    Sh("ip link add " + v0 + " netns " + ns0 + " type veth peer name " +
                       v1 + " netns " + ns1) == 0 &&
                    Sh("ip -n " + ns0 + " addr add 10.231.0.1/24 dev " + v0) == 0 &&
                    Sh("ip -n " + ns1 + " addr add 10.231.0.2/24 dev " + v1) == 0 &&
                    Sh("ip -n " + ns0 + " link set " + v0 + " up") == 0 &&
                    Sh("ip -n " + ns1 + " link set " + v1 + " up") == 0;
    if (ok) {
      std::filesystem::create_directory(dir + "/afp");
      auto r = RunPair(dir + "/afp", [&](int role) {
        return Dpdk("--vdev=net_af_packet0,iface=" + (role ? v1 : v0) +
                        ",framecnt=16384,blocksz=4096,framesz=2048",
                    role ? ns1 : ns0);
      }, count, len);
      Row("af_packet (veth)", count, len, r);
      std::fflush(stdout);
      std::filesystem::create_directory(dir + "/udpveth");
      r = RunPair(dir + "/udpveth", [&](int role) -> std::unique_ptr<PacketIo> {
        if (!EnterNs(role ? ns1 : ns0)) return nullptr;
        udp::attr a;
        a.hostname = role ? "10.231.0.2" : "10.231.0.1";
        a.max_datagram = 1472;
        auto io = UdpPacketIo::Create(a);
        if (!io.ok()) return nullptr;
        return std::move(*io);
      }, count, len);
      Row("udp (veth)", count, len, r);
      std::fflush(stdout);
      r = RunTcp(ns0, ns1, "10.231.0.2", count * len);
      r.received /= len;
      Row("tcp (veth)", count, len, r);
      std::fflush(stdout);
      // Last on this pair: the PMD attaches an XDP program to the veths.
      std::filesystem::create_directory(dir + "/afxdp");
      r = RunPair(dir + "/afxdp", [&](int role) {
        return Dpdk("--vdev=net_af_xdp0,iface=" + (role ? v1 : v0) +
                        ",start_queue=0,queue_count=1",
                    role ? ns1 : ns0);
      }, count, len);
      Row("af_xdp (veth)", count, len, r);
    } else {
      Row("af_packet (veth)", count, len, Result{});
    }
    Sh("ip netns del " + ns0);
    Sh("ip netns del " + ns1);
    std::fflush(stdout);
  }
  {
    std::filesystem::create_directory(dir + "/udp");
    auto r = RunPair(dir + "/udp", [&](int) -> std::unique_ptr<PacketIo> {
      udp::attr a;
      a.max_datagram = 1472;
      auto io = UdpPacketIo::Create(a);
      if (!io.ok()) return nullptr;
      return std::move(*io);
    }, count, len);
    Row("udp (loopback)", count, len, r);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
