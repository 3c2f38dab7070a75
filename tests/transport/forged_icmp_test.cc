// A forged ICMP "port unreachable" must not fail a job (SECURITY.md: packets from outside
// the job cost CPU time at most). Anyone who knows two ranks' UDP ports can send one: a raw
// IPv4 socket, an ICMP destination-unreachable message whose quoted datagram claims to go
// from rank 1's port to rank 0's. The forger does not know the job's session token, so the
// datagram it quotes cannot be one rank 1 sent. Two ranks (udp devices, threads of this
// process, Gloo's unbound-buffer calls): rank 1 waits in recv while rank 0 computes for 3 s
// and then sends; both must get their data. Needs root (raw socket); skipped otherwise.
#include <arpa/inet.h>
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/ip_icmp.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/device.h"
#include "transport_dpdk/wire/wire_format.h"

namespace optireduce {
namespace testing {
namespace {

uint16_t InternetChecksum(const uint8_t* p, size_t n) {
  uint32_t sum = 0;
  for (size_t i = 0; i + 1 < n; i += 2) sum += (p[i] << 8) | p[i + 1];
  if (n % 2) sum += p[n - 1] << 8;
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return htons(static_cast<uint16_t>(~sum));
}

// A free UDP port on 127.0.0.1 (bound and released; the device binds it right after).
uint16_t FreeUdpPort() {
  const int s = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (s >= 0) close(s);
    return 0;
  }
  close(s);
  return ntohs(a.sin_port);
}

// Sends ICMP port unreachable to 127.0.0.1 quoting a UDP datagram 127.0.0.1:from ->
// 127.0.0.1:to whose payload is `quoted` (as much of it as a forger chooses to include).
// Returns "" or what failed.
std::string SendForgedPortUnreachable(uint16_t from, uint16_t to,
                                      const std::vector<uint8_t>& quoted) {
  const int s = socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
  if (s < 0) return std::string("raw socket: ") + std::strerror(errno);
  std::vector<uint8_t> msg(8 + 20 + 8 + quoted.size(), 0);
  uint8_t* icmp = msg.data();
  icmp[0] = ICMP_DEST_UNREACH;
  icmp[1] = ICMP_PORT_UNREACH;
  uint8_t* ip = icmp + 8;
  ip[0] = 0x45;  // IPv4, 20-byte header
  const uint16_t ip_len = htons(static_cast<uint16_t>(20 + 8 + quoted.size()));
  std::memcpy(ip + 2, &ip_len, 2);
  ip[8] = 64;  // TTL
  ip[9] = IPPROTO_UDP;
  const uint32_t lo = htonl(INADDR_LOOPBACK);
  std::memcpy(ip + 12, &lo, 4);  // source: rank 1's address
  std::memcpy(ip + 16, &lo, 4);  // destination: rank 0's address
  const uint16_t ip_sum = InternetChecksum(ip, 20);
  std::memcpy(ip + 10, &ip_sum, 2);
  uint8_t* udp = ip + 20;
  const uint16_t sport = htons(from), dport = htons(to);
  const uint16_t udp_len = htons(static_cast<uint16_t>(8 + quoted.size()));
  std::memcpy(udp, &sport, 2);
  std::memcpy(udp + 2, &dport, 2);
  std::memcpy(udp + 4, &udp_len, 2);
  if (!quoted.empty()) std::memcpy(udp + 8, quoted.data(), quoted.size());
  const uint16_t icmp_sum = InternetChecksum(msg.data(), msg.size());
  std::memcpy(icmp + 2, &icmp_sum, 2);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_addr.s_addr = lo;
  const ssize_t sent =
      sendto(s, msg.data(), msg.size(), 0, reinterpret_cast<sockaddr*>(&dst), sizeof(dst));
  const int err = errno;
  close(s);
  if (sent != static_cast<ssize_t>(msg.size())) {
    return std::string("sendto: ") + std::strerror(err);
  }
  return "";
}

TEST(ForgedIcmp, PortUnreachableFromOutsideTheJobDoesNotFailIt) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a raw ICMP socket)";
  const uint16_t port0 = FreeUdpPort(), port1 = FreeUdpPort();
  ASSERT_NE(port0, 0);
  ASSERT_NE(port1, 0);
  ASSERT_NE(port0, port1);
  std::shared_ptr<transport::Device> dev[2];
  for (int r = 0; r < 2; ++r) {
    transport::udp::attr a;
    a.port = r == 0 ? port0 : port1;
    auto d = transport::udp::CreateDeviceOrError(a);
    ASSERT_TRUE(d.ok()) << d.status();
    dev[r] = *d;
  }
  gloo::rendezvous::HashStore store;
  std::promise<void> waiting, forged;
  std::shared_future<void> forged_f = forged.get_future().share();
  std::string errors[2];
  constexpr size_t kCount = 1 << 14;

  std::thread rank0([&] {
    try {
      auto ctx = ConnectContext(store, dev[0], 0, 2, std::chrono::seconds(30));
      std::vector<float> out(kCount, 7.0f);
      auto ub = ctx->createUnboundBuffer(out.data(), out.size() * sizeof(float));
      forged_f.wait();
      std::this_thread::sleep_for(std::chrono::seconds(3));  // computing
      ub->send(1, 9);
      ub->waitSend();
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
  });
  std::thread rank1([&] {
    bool told = false;
    try {
      auto ctx = ConnectContext(store, dev[1], 1, 2, std::chrono::seconds(30));
      std::vector<float> in(kCount, 0.0f);
      auto ub = ctx->createUnboundBuffer(in.data(), in.size() * sizeof(float));
      ub->recv(0, 9);
      waiting.set_value();
      told = true;
      ub->waitRecv();
      for (size_t i = 0; i < kCount; ++i) {
        if (in[i] != 7.0f) {
          errors[1] = "received wrong data at " + std::to_string(i);
          break;
        }
      }
    } catch (const std::exception& e) {
      errors[1] = e.what();
    }
    if (!told) waiting.set_value();
  });

  waiting.get_future().wait();
  // What a forger can send: the bare UDP header of a datagram from rank 1 to rank 0, and
  // one quoting a PING-like header of ours with a guessed token.
  std::string forge_error = SendForgedPortUnreachable(port1, port0, {});
  if (forge_error.empty()) {
    transport::WireHeader h;
    h.type = static_cast<uint8_t>(transport::PacketType::kPing);
    h.session_token = 0x0123456789abcdefull;
    h.src_rank = 1;
    h.dst_rank = 0;
    h.message_id = 1;
    h.flags = transport::kFlagHeaderChecksum;
    std::vector<uint8_t> quoted(transport::kHeaderBytes);
    transport::EncodeHeader(h, nullptr, 0, quoted.data());
    forge_error = SendForgedPortUnreachable(port1, port0, quoted);
  }
  forged.set_value();
  rank0.join();
  rank1.join();
  ASSERT_EQ(forge_error, "");
  EXPECT_EQ(errors[0], "") << "rank 0";
  EXPECT_EQ(errors[1], "") << "rank 1";
  // The reports reached rank 1's device (else this test proves nothing) and proved nothing.
  const transport::Stats s1 = dev[1]->stats();
  EXPECT_GE(s1.unreachable_unproven, 2u) << s1.ToString();
  EXPECT_EQ(s1.peers_unreachable, 0u) << s1.ToString();
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
