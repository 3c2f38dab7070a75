// Launches N ranks of a benchmark as local processes (fork) that rendezvous through a
// FileStore in a temporary directory — no Redis needed on one host — and makes the
// transport devices every bench program uses (the one place a transport is plugged in).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <gloo/context.h>
#include <gloo/transport/device.h>

namespace optireduce {
namespace bench {

struct RankEnv {
  int rank;
  int size;
  std::shared_ptr<gloo::Context> context;
};

// Returns 0 if every rank's body returned 0, else the first non-zero status. Ranks still
// running `limit_seconds` after the start are killed. Rank 0's stdout is the report.
int RunLocalRanks(int size, const std::string& transport, int limit_seconds,
                  const std::function<int(const RankEnv&)>& body);

// The process part of RunLocalRanks: forks `size` children that each run body(rank, dir)
// with `dir` a fresh temporary directory (removed afterwards) for a FileStore, and waits
// for them as RunLocalRanks does. SIGINT/SIGTERM to the parent reach the children through
// the process group; children are killed if the parent's wait ends early.
int ForkLocalRanks(int size, int limit_seconds,
                   const std::function<int(int rank, const std::string& dir)>& body);

// Which device to make. `iface` (tcp: the interface Gloo binds to; udp/dpdk: the
// interface whose IPv4 address is used) wins over `hostname` when both are set; neither
// set means Gloo's default for tcp (the address of the machine's host name) and
// 127.0.0.1 for udp.
struct DeviceSpec {
  std::string transport = "tcp";  // tcp, udp (when built in), dpdk (when built in)
  std::string hostname;
  std::string iface;
  bool busy_poll = false;
  // udp/dpdk: the progress thread's spin after work (negative: the library's default).
  std::chrono::microseconds spin{-1};
  // dpdk: EAL arguments (empty: OPTIREDUCE_EAL_ARGS, else DPDK's defaults). RunLocalRanks
  // fills in a memif mesh between its ranks (sockets in its temporary directory).
  std::string eal_args;
  // dpdk: fill UDP checksums (dpdk::attr::udp_checksum). RunLocalRanks's memif mesh turns
  // them off: shared memory does not corrupt, and the engine's CRC32C covers every datagram.
  bool udp_checksum = true;
};

// For dpdk (when built in) and OPTIREDUCE_EAL_ARGS unset: sets spec's EAL arguments to
// rank `rank`'s side of a memif mesh between `size` local processes whose sockets live in
// `dir` (every rank must pass the same dir), and turns UDP checksums off. Other transports,
// or OPTIREDUCE_EAL_ARGS set (the caller's own ports): spec is left as it is.
void UseLocalMemifMesh(DeviceSpec* spec, const std::string& dir, int rank, int size);

// Throws std::invalid_argument naming the transport and the allowed ones when it is not
// available in this build, and whatever the transport throws when it cannot be created.
std::shared_ptr<gloo::transport::Device> MakeDevice(const DeviceSpec& spec);
// The local-ranks device: the transport on 127.0.0.1 (dpdk: as configured by the
// environment; RunLocalRanks gives its dpdk ranks a memif mesh instead).
std::shared_ptr<gloo::transport::Device> MakeDevice(const std::string& transport);
// Transports this build can make ("tcp", plus "udp"/"dpdk" when their code is in).
std::string AvailableTransports();

}  // namespace bench
}  // namespace optireduce
