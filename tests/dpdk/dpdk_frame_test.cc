// Framing and address format of the DPDK backend (no EAL needed).
#include "transport_dpdk/io/dpdk/dpdk_frame.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <vector>

namespace optireduce {
namespace transport {
namespace dpdk {
namespace {

Endpoint Ep(uint8_t last, const char* ip, uint16_t port) {
  Endpoint e;
  e.mac = {0x02, 0, 0, 0, 0, last};
  inet_pton(AF_INET, ip, &e.ipv4_be);
  e.port_be = htons(port);
  e.queue = 3;
  return e;
}

TEST(DpdkAddress, RoundTripsAndRejectsForeign) {
  Endpoint e = Ep(7, "10.77.1.2", 17000);
  IoAddress a = EncodeAddress(e);
  auto d = DecodeAddress(a);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->mac, e.mac);
  EXPECT_EQ(d->ipv4_be, e.ipv4_be);
  EXPECT_EQ(d->port_be, e.port_be);
  EXPECT_EQ(d->queue, 3);
  for (size_t i = 16; i < a.size(); ++i) EXPECT_EQ(a[i], 0);
  EXPECT_EQ(EndpointToString(e), "02:00:00:00:00:07 10.77.1.2:17000 q3");
  IoAddress udp{};
  udp[0] = 'U';
  EXPECT_FALSE(DecodeAddress(udp).ok());
  a[1] = 9;
  EXPECT_NE(DecodeAddress(a).status().message().find("version"), std::string::npos);
}

TEST(DpdkFrame, BuildThenParse) {
  Endpoint src = Ep(1, "10.77.0.1", 17000), dst = Ep(2, "10.77.0.2", 17001);
  std::vector<uint8_t> f(kFrameHeader + 301);
  for (size_t i = 0; i < 301; ++i) f[kFrameHeader + i] = static_cast<uint8_t>(i);
  WriteHeaders(f.data(), src, dst, 42, 301, true);
  uint8_t* udp = f.data() + kEthHeader + kIpv4Header;
  uint16_t c = UdpChecksum(src.ipv4_be, dst.ipv4_be, udp, kUdpHeader + 301);
  udp[6] = c >> 8;
  udp[7] = c & 0xFF;
  Parsed p = ParseFrame(f.data(), f.size(), dst, true, true);
  ASSERT_EQ(p.verdict, Verdict::kOk) << VerdictName(p.verdict);
  EXPECT_EQ(p.payload_len, 301u);
  EXPECT_EQ(p.payload, f.data() + kFrameHeader);
  EXPECT_EQ(p.src_mac, src.mac);

  // Trailing Ethernet padding is ignored (lengths come from the headers).
  f.resize(f.size() + 10, 0);
  EXPECT_EQ(ParseFrame(f.data(), f.size(), dst, true, true).payload_len, 301u);

  auto flip = [&](size_t at, uint8_t bit, Verdict want) {
    std::vector<uint8_t> g = f;
    g[at] ^= bit;
    Parsed q = ParseFrame(g.data(), g.size(), dst, true, true);
    EXPECT_EQ(q.verdict, want) << "byte " << at << " got " << VerdictName(q.verdict);
  };
  flip(5, 1, Verdict::kWrongMac);
  flip(12, 1, Verdict::kNotIpv4);
  flip(kEthHeader + 9, 1, Verdict::kNotUdp);
  flip(kEthHeader + 19, 1, Verdict::kWrongIp);
  flip(kEthHeader + 13, 1, Verdict::kBadIpChecksum);
  flip(kEthHeader + 20 + 3, 1, Verdict::kWrongPort);
  flip(kFrameHeader + 100, 1, Verdict::kBadUdpChecksum);
  flip(kEthHeader + 6, 0x20, Verdict::kBadIpHeader);  // more-fragments
  // Without software verification a corrupt payload passes (offload case).
  std::vector<uint8_t> g = f;
  g[kFrameHeader + 5] ^= 1;
  EXPECT_EQ(ParseFrame(g.data(), g.size(), dst, true, false).verdict, Verdict::kOk);
  EXPECT_EQ(ParseFrame(f.data(), 20, dst, true, true).verdict, Verdict::kRunt);
  // Broadcast destination MAC is accepted.
  g = f;
  for (int i = 0; i < 6; ++i) g[i] = 0xFF;
  EXPECT_EQ(ParseFrame(g.data(), g.size(), dst, true, true).verdict, Verdict::kOk);
}

TEST(DpdkFrame, HelloIsRecognised) {
  Endpoint me = Ep(1, "10.77.0.1", 17000);
  uint8_t f[kHelloFrame];
  WriteHello(f, Mac{0x02, 9, 9, 9, 9, 9});
  Parsed p = ParseFrame(f, sizeof(f), me, true, true);
  EXPECT_EQ(p.verdict, Verdict::kHello);
  EXPECT_EQ(p.src_mac, (Mac{0x02, 9, 9, 9, 9, 9}));
}

TEST(DpdkFrame, UdpChecksumKnownValue) {
  // A zero computed checksum is sent as 0xFFFF; 0 means "none".
  Endpoint src = Ep(1, "10.0.0.1", 1), dst = Ep(2, "10.0.0.2", 2);
  std::vector<uint8_t> f(kFrameHeader + 2);
  WriteHeaders(f.data(), src, dst, 0, 2, true);
  uint8_t* udp = f.data() + kEthHeader + kIpv4Header;
  uint16_t c = UdpChecksum(src.ipv4_be, dst.ipv4_be, udp, kUdpHeader + 2);
  EXPECT_NE(c, 0);
  // Verify the IPv4 header checksum makes the header sum to 0xFFFF.
  EXPECT_EQ(Ipv4HeaderChecksum(f.data() + kEthHeader),
            (f[kEthHeader + 10] << 8) | f[kEthHeader + 11]);
}

TEST(DpdkFrame, UdpChecksumInTwoPiecesEqualsOnePiece) {
  // Zero-copy frames checksum the head (UDP header + datagram header) and the
  // caller's body separately; every even split and odd body length must agree.
  Endpoint src = Ep(1, "10.0.0.1", 1), dst = Ep(2, "10.0.0.2", 2);
  for (size_t body : {size_t{1}, size_t{2}, size_t{7}, size_t{1024}, size_t{8999}}) {
    const size_t head = 96;
    std::vector<uint8_t> f(kFrameHeader + head + body);
    for (size_t i = kFrameHeader; i < f.size(); ++i) f[i] = static_cast<uint8_t>(i * 131 + 7);
    WriteHeaders(f.data(), src, dst, 0, head + body, true);
    const uint8_t* udp = f.data() + kEthHeader + kIpv4Header;
    const uint16_t whole = UdpChecksum(src.ipv4_be, dst.ipv4_be, udp, kUdpHeader + head + body);
    std::vector<uint8_t> elsewhere(f.begin() + kFrameHeader + head, f.end());  // not adjacent
    EXPECT_EQ(UdpChecksum(src.ipv4_be, dst.ipv4_be, udp, kUdpHeader + head, elsewhere.data(),
                          body),
              whole)
        << body;
  }
}

}  // namespace
}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
