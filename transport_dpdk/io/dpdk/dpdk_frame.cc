#include "transport_dpdk/io/dpdk/dpdk_frame.h"

#include <arpa/inet.h>

#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {
namespace dpdk {
namespace {

constexpr uint8_t kTag = 'D';
constexpr uint8_t kVersion = 1;
constexpr uint8_t kProtoUdp = 17;

uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
void Store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}

uint16_t Fold(uint64_t sum);

// Adds bytes as big-endian 16-bit words to an accumulator (p must start at
// an even offset of the checksummed stream; an odd tail byte is the high
// byte of a last word). The one's-complement sum is byte-order independent
// (RFC 1071): sum native 32-bit loads, fold, and swap into big-endian.
uint64_t SumWords(const uint8_t* p, size_t n, uint64_t sum) {
  uint64_t native = 0;
  while (n >= 8) {
    uint32_t a, b;
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + 4, 4);
    native += a;
    native += b;
    p += 8;
    n -= 8;
  }
  while (n >= 2) {
    uint16_t w;
    std::memcpy(&w, p, 2);
    native += w;
    p += 2;
    n -= 2;
  }
  uint16_t folded = Fold(native);
  if (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__) {
    folded = static_cast<uint16_t>((folded >> 8) | (folded << 8));
  }
  sum += folded;
  if (n) sum += static_cast<uint16_t>(p[0] << 8);
  return sum;
}

uint16_t Fold(uint64_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

uint64_t PseudoSum(uint32_t src_be, uint32_t dst_be, size_t udp_len) {
  uint8_t ph[12];
  std::memcpy(ph, &src_be, 4);
  std::memcpy(ph + 4, &dst_be, 4);
  ph[8] = 0;
  ph[9] = kProtoUdp;
  Store16(ph + 10, static_cast<uint16_t>(udp_len));
  return SumWords(ph, sizeof(ph), 0);
}

}  // namespace

IoAddress EncodeAddress(const Endpoint& e) {
  IoAddress a{};
  a[0] = kTag;
  a[1] = kVersion;
  std::memcpy(&a[2], e.mac.data(), 6);
  std::memcpy(&a[8], &e.ipv4_be, 4);
  std::memcpy(&a[12], &e.port_be, 2);
  a[14] = static_cast<uint8_t>(e.queue);
  a[15] = static_cast<uint8_t>(e.queue >> 8);
  return a;
}

absl::StatusOr<Endpoint> DecodeAddress(const IoAddress& a) {
  if (a[0] != kTag) {
    return absl::InvalidArgumentError(
        "peer address is not a dpdk address (is every rank using the dpdk "
        "transport?)");
  }
  if (a[1] != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dpdk peer address has version ", a[1], ", this build speaks ",
        kVersion));
  }
  Endpoint e;
  std::memcpy(e.mac.data(), &a[2], 6);
  std::memcpy(&e.ipv4_be, &a[8], 4);
  std::memcpy(&e.port_be, &a[12], 2);
  e.queue = static_cast<uint16_t>(a[14] | a[15] << 8);
  if (e.port_be == 0) {
    return absl::InvalidArgumentError("dpdk peer address has UDP port 0");
  }
  if (IsBroadcast(e.mac.data()) || (e.mac[0] & 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dpdk peer address has a multicast MAC ", MacToString(e.mac)));
  }
  return e;
}

std::string MacToString(const Mac& m) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1],
                m[2], m[3], m[4], m[5]);
  return buf;
}

std::string EndpointToString(const Endpoint& e) {
  char ip[INET_ADDRSTRLEN] = {};
  in_addr in;
  in.s_addr = e.ipv4_be;
  inet_ntop(AF_INET, &in, ip, sizeof(ip));
  return absl::StrCat(MacToString(e.mac), " ", ip, ":", ntohs(e.port_be),
                      " q", e.queue);
}

bool IsBroadcast(const uint8_t* mac) {
  for (int i = 0; i < 6; ++i)
    if (mac[i] != 0xFF) return false;
  return true;
}

uint16_t Ipv4HeaderChecksum(const uint8_t* ip) {
  uint64_t sum = SumWords(ip, 10, 0);        // up to the checksum field
  sum = SumWords(ip + 12, kIpv4Header - 12, sum);  // skip it
  return static_cast<uint16_t>(~Fold(sum));
}

uint16_t UdpPseudoHeaderSum(uint32_t src_be, uint32_t dst_be, size_t udp_len) {
  return Fold(PseudoSum(src_be, dst_be, udp_len));
}

uint16_t UdpChecksum(uint32_t src_be, uint32_t dst_be, const uint8_t* udp,
                     size_t udp_len) {
  return UdpChecksum(src_be, dst_be, udp, udp_len, nullptr, 0);
}

uint16_t UdpChecksum(uint32_t src_be, uint32_t dst_be, const uint8_t* udp,
                     size_t udp_len, const uint8_t* rest, size_t rest_len) {
  uint64_t sum = PseudoSum(src_be, dst_be, udp_len + rest_len);
  sum = SumWords(udp, 6, sum);  // skip the checksum field itself
  sum = SumWords(udp + 8, udp_len - 8, sum);
  if (rest_len) sum = SumWords(rest, rest_len, sum);  // udp_len is even: words align
  uint16_t c = static_cast<uint16_t>(~Fold(sum));
  return c == 0 ? 0xFFFF : c;
}

void WriteHeaders(uint8_t* f, const Endpoint& src, const Endpoint& dst,
                  uint16_t ip_id, size_t payload_len, bool ip_checksum) {
  std::memcpy(f, dst.mac.data(), 6);
  std::memcpy(f + 6, src.mac.data(), 6);
  Store16(f + 12, kEtherTypeIpv4);
  uint8_t* ip = f + kEthHeader;
  ip[0] = 0x45;  // version 4, IHL 5
  ip[1] = 0;
  Store16(ip + 2, static_cast<uint16_t>(kIpv4Header + kUdpHeader + payload_len));
  Store16(ip + 4, ip_id);
  Store16(ip + 6, 0x4000);  // don't fragment
  ip[8] = 64;
  ip[9] = kProtoUdp;
  Store16(ip + 10, 0);
  std::memcpy(ip + 12, &src.ipv4_be, 4);
  std::memcpy(ip + 16, &dst.ipv4_be, 4);
  if (ip_checksum) Store16(ip + 10, Ipv4HeaderChecksum(ip));
  uint8_t* udp = ip + kIpv4Header;
  std::memcpy(udp, &src.port_be, 2);
  std::memcpy(udp + 2, &dst.port_be, 2);
  Store16(udp + 4, static_cast<uint16_t>(kUdpHeader + payload_len));
  Store16(udp + 6, 0);
}

void WriteHello(uint8_t* f, const Mac& src) {
  std::memset(f, 0, kHelloFrame);
  std::memset(f, 0xFF, 6);
  std::memcpy(f + 6, src.data(), 6);
  Store16(f + 12, kEtherTypeHello);
  std::memcpy(f + 14, "optireduce-hello", 16);
}

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kOk: return "ok";
    case Verdict::kHello: return "hello";
    case Verdict::kRunt: return "runt";
    case Verdict::kNotIpv4: return "not_ipv4";
    case Verdict::kWrongMac: return "wrong_mac";
    case Verdict::kBadIpHeader: return "bad_ip_header";
    case Verdict::kNotUdp: return "not_udp";
    case Verdict::kWrongIp: return "wrong_ip";
    case Verdict::kWrongPort: return "wrong_port";
    case Verdict::kBadIpChecksum: return "bad_ip_checksum";
    case Verdict::kBadUdpChecksum: return "bad_udp_checksum";
    default: return "?";
  }
}

Parsed ParseFrame(uint8_t* f, size_t len, const Endpoint& self,
                  bool verify_ip_checksum, bool verify_udp_checksum) {
  Parsed p;
  if (len < kEthHeader) return p;
  std::memcpy(p.src_mac.data(), f + 6, 6);
  const uint16_t type = Load16(f + 12);
  if (type == kEtherTypeHello) {
    p.verdict = IsBroadcast(f) ? Verdict::kHello : Verdict::kWrongMac;
    return p;
  }
  if (type != kEtherTypeIpv4) {
    p.verdict = Verdict::kNotIpv4;
    return p;
  }
  if (!IsBroadcast(f) && std::memcmp(f, self.mac.data(), 6) != 0) {
    p.verdict = Verdict::kWrongMac;
    return p;
  }
  if (len < kFrameHeader) return p;  // runt
  uint8_t* ip = f + kEthHeader;
  const size_t ihl = static_cast<size_t>(ip[0] & 0x0F) * 4;
  const size_t ip_total = Load16(ip + 2);
  const uint16_t frag = Load16(ip + 6);
  if ((ip[0] >> 4) != 4 || ihl < kIpv4Header ||
      ip_total < ihl + kUdpHeader || kEthHeader + ip_total > len ||
      (frag & 0x3FFF) != 0) {  // MF set or a fragment offset
    p.verdict = Verdict::kBadIpHeader;
    return p;
  }
  if (ip[9] != kProtoUdp) {
    p.verdict = Verdict::kNotUdp;
    return p;
  }
  if (std::memcmp(ip + 16, &self.ipv4_be, 4) != 0) {
    p.verdict = Verdict::kWrongIp;
    return p;
  }
  if (verify_ip_checksum && Fold(SumWords(ip, ihl, 0)) != 0xFFFF) {
    p.verdict = Verdict::kBadIpChecksum;
    return p;
  }
  uint8_t* udp = ip + ihl;
  if (std::memcmp(udp + 2, &self.port_be, 2) != 0) {
    p.verdict = Verdict::kWrongPort;
    return p;
  }
  const size_t udp_len = Load16(udp + 4);
  if (udp_len < kUdpHeader || udp_len > ip_total - ihl) {
    p.verdict = Verdict::kBadIpHeader;
    return p;
  }
  const uint16_t csum = Load16(udp + 6);
  if (verify_udp_checksum && csum != 0) {
    uint32_t s, d;
    std::memcpy(&s, ip + 12, 4);
    std::memcpy(&d, ip + 16, 4);
    if (UdpChecksum(s, d, udp, udp_len) != csum) {
      p.verdict = Verdict::kBadUdpChecksum;
      return p;
    }
  }
  p.verdict = Verdict::kOk;
  p.payload = udp + kUdpHeader;
  p.payload_len = static_cast<uint32_t>(udp_len - kUdpHeader);
  return p;
}

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
