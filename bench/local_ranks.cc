#include "bench/local_ranks.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gloo_ext/config.h"
#include "gloo_ext/devices.h"

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "transport_dpdk/device.h"
// The DPDK device is in the library only when it was built with libdpdk.
#ifdef OPTIREDUCE_HAVE_DPDK
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"
#include "transport_dpdk/io/dpdk/packet_io_dpdk.h"
#endif

namespace optireduce {
namespace bench {
namespace {

// The first IPv4 address of `iface`; throws naming the interface if it has none.
std::string Ipv4OfInterface(const std::string& iface) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw std::runtime_error("getifaddrs failed");
  std::string found;
  for (auto* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (iface != it->ifa_name) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf, sizeof(buf));
    found = buf;
    break;
  }
  freeifaddrs(list);
  if (found.empty()) throw std::invalid_argument("interface '" + iface + "' has no IPv4 address");
  return found;
}

// The library's configuration from the environment as it is now (gloo_ext/config.h);
// throws std::invalid_argument with its message (naming the variable) when one is bad.
optireduce::gloo_ext::Config LibraryConfig() {
  absl::StatusOr<optireduce::gloo_ext::Config> config =
      optireduce::gloo_ext::ConfigFromEnvironment();
  if (!config.ok()) throw std::invalid_argument(std::string(config.status().message()));
  return *std::move(config);
}

}  // namespace

std::string AvailableTransports() {
  std::string s = "tcp";
  s += ", udp";
#ifdef OPTIREDUCE_HAVE_DPDK
  s += ", dpdk";
#endif
  return s;
}

std::shared_ptr<gloo::transport::Device> MakeDevice(const DeviceSpec& spec) {
  if (spec.transport == "tcp") {
    gloo::transport::tcp::attr attr;
    if (!spec.iface.empty()) attr.iface = spec.iface;
    else if (!spec.hostname.empty()) attr.hostname = spec.hostname;
    return gloo::transport::tcp::CreateDevice(attr);
  }
  if (spec.transport == "udp") {
    // The library's variables (OPTIREDUCE_UDP_OFFLOAD, OPTIREDUCE_FAULTS, ...) apply as in a
    // PyTorch job, parsed by the library's own reader (its spellings and error messages),
    // so that A/B runs need no rebuild; the address and port are the bench's.
    optireduce::transport::udp::attr attr = optireduce::gloo_ext::UdpAttrOf(LibraryConfig());
    attr.hostname = !spec.iface.empty() ? Ipv4OfInterface(spec.iface)
                    : !spec.hostname.empty() ? spec.hostname : "127.0.0.1";
    attr.port = 0;
    optireduce::transport::EngineOptions engine =
        optireduce::gloo_ext::EngineOptionsOf(LibraryConfig());
    engine.busy_poll = spec.busy_poll;
    if (spec.spin.count() >= 0) engine.spin = spec.spin;
    return optireduce::transport::udp::CreateDevice(attr, engine);
  }
#ifdef OPTIREDUCE_HAVE_DPDK
  if (spec.transport == "dpdk") {
    // As for udp: the library's OPTIREDUCE_EAL_ARGS, _DPDK_PORTS, _DPDK_TX_COPY, ... apply;
    // RunLocalRanks's memif mesh (spec.eal_args) replaces the EAL arguments.
    optireduce::transport::dpdk::attr attr = optireduce::gloo_ext::DpdkAttrOf(LibraryConfig());
    if (!spec.eal_args.empty()) attr.eal_args = spec.eal_args;
    attr.udp_checksum = spec.udp_checksum;
    optireduce::transport::EngineOptions engine =
        optireduce::gloo_ext::EngineOptionsOf(LibraryConfig());
    engine.busy_poll = spec.busy_poll;
    if (spec.spin.count() >= 0) engine.spin = spec.spin;
    return optireduce::transport::dpdk::CreateDevice(attr, engine);
  }
#endif
  throw std::invalid_argument("transport '" + spec.transport +
                              "' is not available in this build (allowed: " +
                              AvailableTransports() + ")");
}

std::shared_ptr<gloo::transport::Device> MakeDevice(const std::string& transport) {
  DeviceSpec spec;
  spec.transport = transport;
  spec.hostname = "127.0.0.1";
  return MakeDevice(spec);
}

void UseLocalMemifMesh(DeviceSpec* spec, const std::string& dir, int rank, int size) {
#ifdef OPTIREDUCE_HAVE_DPDK
  // One memif link per rank pair, sockets in `dir` (next to the FileStore's files). memif
  // is lossless (back-pressure) and needs neither root nor hugepages.
  if (spec->transport != "dpdk" || !LibraryConfig().eal_args.empty()) return;
  // Big frames mean fewer packets (headers, acks, ring and pool operations per byte):
  // 32 KiB buffers up to 4 ranks (faster than 16 KiB ones at 1-16 MiB; 65000-byte
  // frames were not faster again), 16 KiB up to 6, then 9216-byte ones, so that every
  // link's mempool (~64-68 MiB; packet_io_dpdk.cc bounds memif pools of big frames)
  // fits the EAL's 512 MiB. OPTIREDUCE_BENCH_MEMIF_BSIZE=N sets it (0: memif's
  // 2048-byte buffers).
  unsigned bsize = size <= 4 ? 32768 : size <= 6 ? 16384 : 9216;
  if (const std::optional<std::string> env =
          optireduce::gloo_ext::ReadEnvironment("OPTIREDUCE_BENCH_MEMIF_BSIZE")) {
    if (!absl::SimpleAtoi(*env, &bsize) || (bsize != 0 && (bsize < 1024 || bsize > 65535))) {
      throw std::invalid_argument(absl::StrCat(
          "OPTIREDUCE_BENCH_MEMIF_BSIZE='", *env,
          "' is not valid; allowed values: 0 (memif's 2048-byte buffers) or 1024..65535"));
    }
  }
  spec->eal_args = optireduce::transport::dpdk::MemifMeshEalArgs(dir, rank, size, bsize) +
                   " " + optireduce::transport::dpdk::DefaultEalArgs();
  spec->udp_checksum = false;
#else
  (void)spec, (void)dir, (void)rank, (void)size;
#endif
}

int ForkLocalRanks(int size, int limit_seconds,
                   const std::function<int(int rank, const std::string& dir)>& body) {
  char tmpl[] = "/tmp/optireduce-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < size; rank++) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      break;
    }
    if (pid == 0) {
      int status = 1;
      try {
        status = body(rank, dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      _exit(status);
    }
    pids.push_back(pid);
  }
  int result = pids.size() == static_cast<size_t>(size) ? 0 : 1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_seconds);
  for (size_t i = 0; i < pids.size(); i++) {
    int status = 0;
    while (waitpid(pids[i], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "rank %zu still running after %d s: killing all ranks\n", i,
                     limit_seconds);
        for (pid_t p : pids) kill(p, SIGKILL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      // A rank that failed makes the others fail by timeout; end them now.
      if (result == 0) {
        result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        for (size_t j = i + 1; j < pids.size(); j++) kill(pids[j], SIGTERM);
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return result;
}

int RunLocalRanks(int size, const std::string& transport, int limit_seconds,
                  const std::function<int(const RankEnv&)>& body) {
  return ForkLocalRanks(size, limit_seconds, [&](int rank, const std::string& dir) {
    gloo::rendezvous::FileStore store(dir);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(std::chrono::seconds(limit_seconds));
    DeviceSpec spec;
    spec.transport = transport;
    spec.hostname = "127.0.0.1";
    UseLocalMemifMesh(&spec, dir, rank, size);
    auto device = MakeDevice(spec);
    context->connectFullMesh(store, device);
    const int status = body(RankEnv{rank, size, context});
    // OPTIREDUCE_BENCH_STATS=1: each rank prints its engine's counters (datagram
    // transports) to stderr, for finding where a slow run loses its time.
    if (optireduce::gloo_ext::ReadEnvironment("OPTIREDUCE_BENCH_STATS").has_value()) {
      if (auto* d = dynamic_cast<optireduce::transport::Device*>(device.get())) {
        std::fprintf(stderr, "rank %d %s: %s\n", rank, d->str().c_str(),
                     d->stats().ToString().c_str());
#ifdef OPTIREDUCE_HAVE_DPDK
        if (auto* io = dynamic_cast<optireduce::transport::DpdkPacketIo*>(d->engine()->io())) {
          std::fprintf(stderr, "rank %d dpdk ports: %s\n", rank, io->CountersString().c_str());
        }
#endif
      }
    }
    return status;
  });
}

}  // namespace bench
}  // namespace optireduce
