// dpdk_frame.h — Ethernet/IPv4/UDP framing of the DPDK backend and the
// backend's IoAddress format. Pure byte manipulation (no DPDK calls), so it
// is unit-tested without an EAL.
//
// IoAddress (32 bytes): [0] 'D', [1] version 1, [2..8) MAC, [8..12) IPv4
// (network order), [12..14) UDP port (network order), [14..16) rx queue
// (little-endian), rest zero.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "transport_dpdk/io/packet_io.h"

namespace optireduce {
namespace transport {
namespace dpdk {

inline constexpr size_t kEthHeader = 14;
inline constexpr size_t kIpv4Header = 20;
inline constexpr size_t kUdpHeader = 8;
inline constexpr size_t kFrameHeader = kEthHeader + kIpv4Header + kUdpHeader;
inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
// Link hellos on mesh ports (IEEE "local experimental" ethertype): they only
// teach the far end which port reaches us and are never delivered upward.
inline constexpr uint16_t kEtherTypeHello = 0x88B5;

using Mac = std::array<uint8_t, 6>;

struct Endpoint {
  Mac mac{};
  uint32_t ipv4_be = 0;   // network order
  uint16_t port_be = 0;   // network order
  uint16_t queue = 0;
};

IoAddress EncodeAddress(const Endpoint& e);
absl::StatusOr<Endpoint> DecodeAddress(const IoAddress& a);
std::string EndpointToString(const Endpoint& e);
std::string MacToString(const Mac& m);
bool IsBroadcast(const uint8_t* mac);

// One's-complement checksums as IPv4/UDP define them.
uint16_t Ipv4HeaderChecksum(const uint8_t* ip_header);
// UDP checksum over pseudo-header + udp header + payload (udp_len bytes at
// udp); returns 0xFFFF for a computed 0 (0 means "no checksum").
uint16_t UdpChecksum(uint32_t src_be, uint32_t dst_be, const uint8_t* udp,
                     size_t udp_len);
// The same over a datagram in two pieces: udp_len bytes at udp (the UDP header
// and the start of the payload; an even count) followed by rest_len at rest.
uint16_t UdpChecksum(uint32_t src_be, uint32_t dst_be, const uint8_t* udp,
                     size_t udp_len, const uint8_t* rest, size_t rest_len);
// Sum of the IPv4 pseudo-header only (folded, not inverted): what a NIC with
// UDP checksum offload expects in the checksum field.
uint16_t UdpPseudoHeaderSum(uint32_t src_be, uint32_t dst_be, size_t udp_len);

// Writes the 42-byte Ethernet/IPv4/UDP header for a payload of payload_len
// bytes. ip_checksum: fill the IPv4 header checksum (else 0 for offload).
// The UDP checksum field is left 0; see UdpChecksum.
void WriteHeaders(uint8_t* frame, const Endpoint& src, const Endpoint& dst,
                  uint16_t ip_id, size_t payload_len, bool ip_checksum);

// Writes a 60-byte hello frame (broadcast, kEtherTypeHello).
inline constexpr size_t kHelloFrame = 60;
void WriteHello(uint8_t* frame, const Mac& src);

enum class Verdict : uint8_t {
  kOk,
  kHello,
  kRunt,            // shorter than the headers
  kNotIpv4,         // other ethertype (ARP, IPv6, VLAN, ...)
  kWrongMac,        // not our MAC and not broadcast
  kBadIpHeader,     // version/IHL/length wrong or fragmented
  kNotUdp,
  kWrongIp,
  kWrongPort,
  kBadIpChecksum,
  kBadUdpChecksum,
  kCount
};
const char* VerdictName(Verdict v);

struct Parsed {
  Verdict verdict = Verdict::kRunt;
  Mac src_mac{};
  uint8_t* payload = nullptr;
  uint32_t payload_len = 0;
};

// Classifies a received frame addressed (or not) to `self`. Checksums are
// verified in software only where the flags say so (the port did not).
Parsed ParseFrame(uint8_t* frame, size_t len, const Endpoint& self,
                  bool verify_ip_checksum, bool verify_udp_checksum);

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
