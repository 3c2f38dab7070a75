// dpdk_attr.h — configuration of the DPDK packet I/O backend's device. The backend reads
// nothing else (no environment variable): gloo_ext/devices.h fills an attr from the
// environment (DpdkAttrOf, DpdkAttrFromEnvironment).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace optireduce {
namespace transport {
namespace dpdk {

struct attr {
  // EAL arguments, whitespace separated (no program name). Empty:
  // DefaultEalArgs() (see dpdk_eal.h). EAL is initialised once per process;
  // later devices must ask for the same args (or leave them empty).
  std::string eal_args;
  // Ethdev ports this device owns, by name ("net_memif0") or index ("0").
  // Empty: every port the EAL probed. Several ports form a point-to-point mesh (one port per peer
  // link, e.g. memif): frames are routed by the peer's MAC, learned from
  // received frames and link hellos, flooded while unknown.
  std::vector<std::string> ports;
  // Source MAC of our frames ("02:00:00:00:00:01"). Empty: the first port's
  // MAC, or a random locally administered one for memif / net_ring ports
  // (their MACs are not unique across processes).
  std::string mac;
  // IPv4 address in our frames. Empty: 10.77.<mac[4]>.<mac[5]> from the
  // device MAC (unique as long as MACs differ in their last two bytes).
  std::string ipv4;
  // UDP port in our frames. 0: 17000 + (device number in this process).
  uint16_t udp_port = 0;
  // IP MTU (IPv4 + UDP + datagram), at most 65000. 0: the port's MTU (1500
  // if unknown) capped at 9000, or for memif ports with a "bsize=" devarg the
  // buffer size - 14. The engine's datagram is at most mtu - 28 bytes.
  uint32_t mtu = 0;
  // Ring sizes per port. 0: derived from the window and the datagram size.
  uint32_t rx_descriptors = 0;
  uint32_t tx_descriptors = 0;
  // Fill the UDP checksum (hardware offload where the port has it, software
  // otherwise); false sends checksum 0 (allowed by IPv4). Received UDP
  // checksums are verified whenever they are non-zero.
  bool udp_checksum = true;
  // A/B switches of the TX path. tx_copy_bodies: copy every frame body into
  // the frame's mbuf, also on memif ports, where bodies are otherwise attached
  // zero-copy. tx_backlog: frames of each port's software TX backlog, 32..2048
  // (what a full NIC ring leaves over waits there).
  bool tx_copy_bodies = false;
  uint32_t tx_backlog = 2048;
};

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
