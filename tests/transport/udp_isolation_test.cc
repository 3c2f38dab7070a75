// Job isolation over the udp device with default settings (random per-job session
// tokens): two jobs of three ranks each run allreduces on this host at the same time and
// stay exact, while a hostile process sprays job A's rank 0 with garbage, packets of
// job B, packets of a stale run (old token), forged ranks, a wrong context and replays
// of sequence numbers job A already delivered. Job A's results must not change and its
// drop counters must grow; job B must see none of it.
//
// The replays are crafted rather than captured: a receiver decides on (token, context,
// ranks, seq) alone before it looks at the payload, so a packet with job A's real token,
// context and ranks and a sequence number that was already delivered is exactly what a
// captured-and-resent packet looks like to it (the CRC is valid, the payload arbitrary).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/transport/worker_processes.h"
#include "transport_dpdk/wire/wire_format.h"

namespace optireduce {
namespace testing {
namespace {

using transport::kHeaderBytes;
using transport::PacketType;
using transport::WireHeader;

struct Target {
  uint16_t port = 0;
  uint32_t ctx = 0;
  uint64_t token = 0;
};

// Waits for a job's rank 0 to publish its port, context id and token.
bool ReadTarget(const std::string& info_dir, Target* t) {
  const std::string path = info_dir + "/target";
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (!fs::exists(path) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ifstream f(path);
  unsigned port = 0;
  unsigned long long token = 0;
  if (!(f >> port >> t->ctx >> token)) return false;
  t->port = static_cast<uint16_t>(port);
  t->token = token;
  return true;
}

// A UDP socket that sends hostile datagrams to one port on this host.
class Attacker {
 public:
  explicit Attacker(uint16_t port) : fd_(socket(AF_INET, SOCK_DGRAM, 0)) {
    to_.sin_family = AF_INET;
    to_.sin_port = htons(port);
    to_.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  ~Attacker() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }

  void Raw(const std::vector<uint8_t>& d) {
    sendto(fd_, d.data(), d.size(), 0, reinterpret_cast<const sockaddr*>(&to_), sizeof(to_));
    ++sent_;
  }
  // A well-formed datagram (valid CRC) with header h and `len` payload bytes.
  void Packet(WireHeader h, size_t len, uint8_t fill) {
    std::vector<uint8_t> payload(len, fill);
    h.payload_length = static_cast<uint32_t>(len);
    std::vector<uint8_t> d(kHeaderBytes + len);
    transport::EncodeHeader(h, payload.data(), len, d.data());
    std::copy(payload.begin(), payload.end(), d.begin() + kHeaderBytes);
    Raw(d);
  }
  int sent() const { return sent_; }

 private:
  int fd_;
  sockaddr_in to_{};
  int sent_ = 0;
};

// One round of every kind of bad packet at job A's rank 0 (job size 3).
void Attack(Attacker& at, const Target& a, const Target& b, std::mt19937_64& rng) {
  // 1. Garbage of every length up to a jumbo frame, and headers with a valid magic and
  //    version but random fields (mostly bad type/flags/length/checksum).
  for (int i = 0; i < 40; ++i) {
    std::vector<uint8_t> d(rng() % 1600);
    for (auto& x : d) x = static_cast<uint8_t>(rng());
    if (i % 2 == 1 && d.size() >= kHeaderBytes) {
      const uint32_t magic = transport::kMagic;
      std::memcpy(d.data(), &magic, 4);
      d[4] = transport::kVersion;
    }
    at.Raw(d);
  }
  WireHeader base;
  base.type = static_cast<uint8_t>(PacketType::kData);
  base.flags = transport::kFlagEager;
  base.session_token = a.token;
  base.src_rank = 1;
  base.dst_rank = 0;
  base.dst_context = a.ctx;
  base.total_length = 64;
  for (int i = 0; i < 5; ++i) {
    // 2. A packet of job B (its token and context) sent to job A's port by mistake,
    //    and one with job B's token aimed at job A's context.
    WireHeader h = base;
    h.session_token = b.token;
    h.dst_context = b.ctx;
    at.Packet(h, 64, 0xB0);
    h.dst_context = a.ctx;
    at.Packet(h, 64, 0xB1);
    // 3. A stale run of job A: the same context id, an old token.
    h = base;
    h.session_token = a.token ^ (rng() | 1);
    at.Packet(h, 64, 0x5A);
    // 4. Forged ranks: out of range, ourselves, another receiver.
    h = base;
    h.src_rank = 3 + static_cast<uint32_t>(rng() % 1000);
    at.Packet(h, 64, 0xF0);
    h = base;
    h.src_rank = 0;
    at.Packet(h, 64, 0xF1);
    h = base;
    h.dst_rank = 2;
    at.Packet(h, 64, 0xF2);
    // 5. A context that does not exist on that device.
    h = base;
    h.dst_context = a.ctx + 1000 + static_cast<uint32_t>(rng() % 1000);
    at.Packet(h, 64, 0xC0);
    // 6. Replays of what rank 2 already delivered: in gloo's ring allreduce rank 0
    //    receives from its left neighbour, rank 2, so the first allreduces used these
    //    sequence numbers. (Rank 1 may never have sent to rank 0: a "replay" of an
    //    unused number would be a forgery with the real token, which the token does not
    //    claim to stop — see SECURITY.md.)
    for (uint32_t src = 2; src <= 2; ++src) {
      for (uint64_t seq = 0; seq < 4; ++seq) {
        h = base;
        h.src_rank = src;
        h.seq = seq;
        h.message_id = seq;
        at.Packet(h, 64, 0xEE);
        h.type = static_cast<uint8_t>(PacketType::kRts);
        h.flags = 0;
        at.Packet(h, 0, 0);
      }
    }
  }
}

TEST_F(Workers, ConcurrentJobsStayIsolatedUnderAttack) {
  const std::string info_a = dir_ + "/info_a", info_b = dir_ + "/info_b";
  fs::create_directory(info_a);
  fs::create_directory(info_b);
  // Default device settings: each job draws its own random session token.
  Start(3, {"--mode=isolation", "--seed=7", "--role=attacked", "--info=" + info_a});
  Start(3, {"--mode=isolation", "--seed=50", "--role=bystander", "--info=" + info_b});
  Target a, b;
  ASSERT_TRUE(ReadTarget(info_a, &a)) << "job A never published its address";
  ASSERT_TRUE(ReadTarget(info_b, &b)) << "job B never published its address";
  EXPECT_NE(a.token, b.token) << "two jobs drew the same session token";
  EXPECT_NE(a.port, b.port);

  Attacker at(a.port);
  ASSERT_TRUE(at.ok());
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 20; ++round) {  // while both jobs are allreducing
    Attack(at, a, b, rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  RecordProperty("datagrams_sent", std::to_string(at.sent()));
  std::ofstream(info_a + "/done") << "1";
  std::ofstream(info_b + "/done") << "1";
  ExpectAllSucceeded(Reap(std::chrono::seconds(90)));
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
