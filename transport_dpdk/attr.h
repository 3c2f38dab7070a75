// attr.h — configuration of the udp and loop packet I/O backends' devices. The engine's
// settings are separate (transport_dpdk/engine/engine_options.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace optireduce {
namespace transport {

namespace udp {
struct attr {
  // IPv4 address or host name to bind to.
  std::string hostname = "127.0.0.1";
  // UDP port; 0 picks an ephemeral port.
  uint16_t port = 0;
  // Largest datagram (header + payload) we send. 0: 65000 on loopback,
  // interface MTU - 28 otherwise.
  size_t max_datagram = 0;
  // SO_RCVBUF / SO_SNDBUF request (failures tolerated; above net.core.rmem_max
  // it needs CAP_NET_ADMIN). 32 MiB holds a whole 16 MiB shard of a 64 MiB
  // bucket on 4 ranks: a receiver whose progress thread waits for a core then
  // loses nothing (with 8 MiB, bounded phases of 64 MiB buckets lost data and
  // ran repairs: 1.26 s vs 0.31 s per allreduce, 4 ranks on 2 cores).
  size_t socket_buffer_bytes = 32 << 20;
  // Kernel segmentation offload (Linux >= 4.18/5.0, used when the kernel accepts it): runs of
  // same-size datagrams to one peer leave as one buffer the kernel cuts into datagrams
  // (UDP_SEGMENT), and arrive coalesced (UDP_GRO) — one trip through the stack per run
  // instead of per datagram. The wire carries ordinary datagrams either way.
  bool segmentation_offload = true;
};
}  // namespace udp

namespace loop {
struct attr {
  size_t max_datagram = 9000;
  // Datagrams a loop endpoint queues before dropping (like a NIC ring).
  size_t queue_capacity = 16384;
};
}  // namespace loop

}  // namespace transport
}  // namespace optireduce
