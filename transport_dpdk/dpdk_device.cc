#include "transport_dpdk/dpdk_device.h"

#include <mutex>

#include <rte_errno.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_ring.h>

#include "absl/strings/str_cat.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"
#include "transport_dpdk/io/dpdk/packet_io_dpdk.h"

namespace optireduce {
namespace transport {
namespace dpdk {

absl::StatusOr<std::shared_ptr<Device>> CreateDeviceOrError(const attr& a,
                                                            const EngineOptions& engine) {
  auto io = DpdkPacketIo::Create(a, engine.window_bytes);
  if (!io.ok()) return io.status();
  const size_t rx = (*io)->RxBufferBytes();
  return CreateDeviceOverIo(std::move(*io), engine, rx);
}

std::shared_ptr<::gloo::transport::Device> CreateDevice(const attr& a,
                                                        const EngineOptions& engine) {
  return DeviceOrThrow(CreateDeviceOrError(a, engine), "dpdk::CreateDevice");
}

std::string MemifMeshEalArgs(const std::string& dir, int rank, int size,
                             unsigned buffer_size) {
  std::string s;
  int port = 0;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const int lo = std::min(rank, peer), hi = std::max(rank, peer);
    absl::StrAppend(&s, s.empty() ? "" : " ", "--vdev=net_memif", port++,
                    ",role=", rank == lo ? "server" : "client",
                    ",id=0,socket=", dir, "/", lo, "-", hi,
                    ".sock,socket-abstract=no");
    if (buffer_size > 0) absl::StrAppend(&s, ",bsize=", buffer_size);
  }
  return s;
}

absl::StatusOr<std::vector<std::vector<std::string>>> CreateRingMesh(
    const std::string& prefix, int size, const std::string& eal_args,
    unsigned ring_size) {
  if (size < 2) return absl::InvalidArgumentError("ring mesh needs 2+ endpoints");
  absl::Status st = EnsureEal(ResolveEalArgs(eal_args));
  if (!st.ok()) return st;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  // ring[i][j] carries frames from i to j (one producer, one consumer).
  std::vector<std::vector<rte_ring*>> ring(size, std::vector<rte_ring*>(size));
  for (int i = 0; i < size; ++i) {
    for (int j = 0; j < size; ++j) {
      if (i == j) continue;
      const std::string name = absl::StrCat(prefix, "r", i, "_", j);
      ring[i][j] = rte_ring_create(name.c_str(), ring_size, SOCKET_ID_ANY,
                                   RING_F_SP_ENQ | RING_F_SC_DEQ);
      if (!ring[i][j]) {
        return absl::InternalError(absl::StrCat(
            "rte_ring_create(", name, "): ", rte_strerror(rte_errno)));
      }
    }
  }
  std::vector<std::vector<std::string>> ports(size);
  for (int i = 0; i < size; ++i) {
    for (int j = 0; j < size; ++j) {
      if (i == j) continue;
      const std::string name = absl::StrCat(prefix, "_", i, "_", j);
      rte_ring* rx[1] = {ring[j][i]};
      rte_ring* tx[1] = {ring[i][j]};
      const int id = rte_eth_from_rings(name.c_str(), rx, 1, tx, 1, SOCKET_ID_ANY);
      if (id < 0) {
        return absl::InternalError(absl::StrCat(
            "rte_eth_from_rings(", name, "): ", rte_strerror(rte_errno)));
      }
      char real[RTE_ETH_NAME_MAX_LEN] = {};
      rte_eth_dev_get_name_by_port(static_cast<uint16_t>(id), real);
      ports[i].push_back(real);
    }
  }
  return ports;
}

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
