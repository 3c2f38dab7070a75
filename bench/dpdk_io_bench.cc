// dpdk_io_bench — raw packet I/O throughput of the datagram backends, two
// processes (sender -> receiver), ~1 KB datagrams, no protocol engine:
//   memif             DPDK net_memif between two processes
//   af_packet (veth)  DPDK net_af_packet on a veth pair across two network
//                     namespaces (root only)
//   udp (loopback)    kernel UDP sockets (sendmmsg/recvmmsg) on 127.0.0.1
// Prints a table. Usage: dpdk_io_bench [datagrams] [payload_bytes]
#include <fcntl.h>
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

#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/dpdk_eal.h"
#include "transport_dpdk/packet_io_dpdk.h"
#include "transport_dpdk/packet_io_udp.h"

using namespace optireduce::transport;
using Clock = std::chrono::steady_clock;

namespace {

struct Result {
  uint64_t received = 0;
  double seconds = 0;
};

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// Runs one side. role 0 sends `count` datagrams of `len` bytes, role 1
// receives until `count` arrived or the link has been quiet for 300 ms.
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
      } else if (r.received && now - last > std::chrono::milliseconds(300)) {
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
  store.wait({"done"}, std::chrono::seconds(60));
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

std::unique_ptr<PacketIo> Dpdk(const std::string& eal, const std::string& ns,
                               bool udp_checksum = true) {
  if (!ns.empty()) {
    int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) return nullptr;
    close(fd);
  }
  dpdk::attr a;
  a.eal_args = eal + " " + dpdk::DefaultEalArgs();
  a.udp_checksum = udp_checksum;
  auto io = DpdkPacketIo::Create(a);
  if (!io.ok()) {
    std::fprintf(stderr, "dpdk: %s\n", io.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*io);
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
