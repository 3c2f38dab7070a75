// The bounded service's send side on a scripted port and clock (no network): the packets
// it hands the engine, incast order, repairs, pacing and TX backpressure.
#include "transport_dpdk/bounded/bounded_sender.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace optireduce {
namespace transport {
namespace {

using Clock = BoundedSender::Clock;
using Repair = BoundedSender::RepairQueued;

constexpr size_t kOverhead = 96;  // bytes a datagram costs beyond its payload

// The engine's side, scripted: connected peers, one source per operation, a device that
// takes at most `accept` packets per burst (then stays blocked until Unblock).
class FakePort : public BoundedPort {
 public:
  struct Sent {
    int peer;
    BoundedPacket packet;
    std::string bytes;
  };

  explicit FakePort(int size) : connected(static_cast<size_t>(size), true) {}

  bool Connected(int peer) const override { return connected[peer]; }
  uint32_t Payload(int) const override { return payload; }
  SourceAccess ReadSource(uint64_t op, int peer,
                          const std::function<void(const char*, size_t, bool)>& fn) override {
    ++reads;
    if (answer) return *answer;
    auto it = sources.find(op);
    if (it == sources.end()) return SourceAccess::kGone;
    fn(it->second.data(), it->second.size(), estimated);
    return SourceAccess::kDone;
  }
  void Flush() override { ++flushes; }
  bool Blocked() const override { return blocked; }
  size_t Transmit(int peer, const BoundedPacket* packets, size_t n) override {
    EXPECT_LE(n, BoundedSender::kMaxBurst);
    const size_t take = std::min(n, accept);
    for (size_t i = 0; i < take; ++i) {
      sent.push_back({peer, packets[i], std::string(packets[i].data, packets[i].len)});
    }
    if (take < n) blocked = true;
    return take;
  }

  // The peers the packets went to, one entry per run of packets to the same peer.
  std::vector<int> PeerRuns() const {
    std::vector<int> runs;
    for (const Sent& s : sent) {
      if (runs.empty() || runs.back() != s.peer) runs.push_back(s.peer);
    }
    return runs;
  }

  std::vector<bool> connected;
  uint32_t payload = 1000;
  std::map<uint64_t, std::string> sources;
  bool estimated = false;
  std::optional<SourceAccess> answer;
  size_t accept = SIZE_MAX;
  bool blocked = false;
  int reads = 0, flushes = 0;
  std::vector<Sent> sent;
};

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i % 97);
  return s;
}

const Clock::time_point kT0 = Clock::time_point(std::chrono::seconds(1000));
constexpr Clock::duration kSpin = std::chrono::microseconds(100);

// Pumps once at `now`; returns the deadline it asked for (max: none).
Clock::time_point PumpAt(BoundedSender& s, FakePort& port, BoundedPacer& pacer,
                         Clock::time_point now) {
  Clock::time_point deadline = Clock::time_point::max();
  s.Pump(port, pacer, now, kSpin, &deadline);
  return deadline;
}

TEST(BoundedSender, SendsTheWholeSourceInPayloadSizedPacketsFlaggingTheLastOnes) {
  FakePort port(2);
  port.sources[7] = Bytes(9500, 'a');
  port.estimated = true;
  BoundedPacer unpaced(0, port.payload, kOverhead);
  BoundedSender s(2, 1);
  s.QueueSend(1, 7, 9500, port.payload, /*op_bytes=*/123456);
  EXPECT_EQ(s.Pending(), 1u);
  EXPECT_EQ(s.QueuedSends(7), 1u);
  PumpAt(s, port, unpaced, kT0);

  ASSERT_EQ(port.sent.size(), 10u);
  std::string got;
  for (size_t i = 0; i < port.sent.size(); ++i) {
    const FakePort::Sent& p = port.sent[i];
    EXPECT_EQ(p.peer, 1);
    EXPECT_EQ(p.packet.op, 7u);
    EXPECT_EQ(p.packet.offset, i * 1000);
    EXPECT_EQ(p.packet.len, i < 9 ? 1000u : 500u);
    EXPECT_EQ(p.packet.total, 9500u);
    EXPECT_EQ(p.packet.op_bytes, 123456u);
    EXPECT_TRUE(p.packet.estimated);
    // 10 packets: the last four (at least four, else 1%) carry the flag.
    EXPECT_EQ(p.packet.last, i >= 6) << i;
    got += p.bytes;
  }
  EXPECT_EQ(got, port.sources[7]);
  EXPECT_EQ(s.Pending(), 0u);
  EXPECT_EQ(s.QueuedSends(7), 0u);
}

TEST(BoundedSender, OnlyTheOldestSendsAreActiveAndTheLimitFollowsSetSenders) {
  FakePort port(4);
  port.sources[1] = Bytes(2000, 'x');
  BoundedPacer unpaced(0, port.payload, kOverhead);
  BoundedSender s(4, 1);
  // Submitted in TAR's staggered order: 3, then 1, then 2.
  s.QueueSend(3, 1, 2000, port.payload, 0);
  s.QueueSend(1, 1, 2000, port.payload, 0);
  s.QueueSend(2, 1, 2000, port.payload, 0);
  EXPECT_EQ(s.QueuedSends(1), 3u);
  PumpAt(s, port, unpaced, kT0);
  EXPECT_EQ(port.PeerRuns(), (std::vector<int>{3}));
  PumpAt(s, port, unpaced, kT0);
  PumpAt(s, port, unpaced, kT0);
  EXPECT_EQ(port.PeerRuns(), (std::vector<int>{3, 1, 2}));

  // Two at once; the limit is clamped to [1, size - 1].
  s.SetSenders(2);
  EXPECT_EQ(s.senders(), 2);
  port.sent.clear();
  s.QueueSend(2, 1, 2000, port.payload, 0);
  s.QueueSend(3, 1, 2000, port.payload, 0);
  s.QueueSend(1, 1, 2000, port.payload, 0);
  PumpAt(s, port, unpaced, kT0);
  EXPECT_EQ(port.PeerRuns(), (std::vector<int>{2, 3}));
  s.SetSenders(10);
  EXPECT_EQ(s.senders(), 3);
  s.SetSenders(0);
  EXPECT_EQ(s.senders(), 1);

  // A peer that is not connected is not sent to; Clear drops everything.
  port.sent.clear();
  port.connected[1] = false;
  PumpAt(s, port, unpaced, kT0);
  EXPECT_TRUE(port.sent.empty());
  EXPECT_EQ(s.Pending(), 1u);
  s.Clear();
  EXPECT_EQ(s.Pending(), 0u);
}

TEST(BoundedSender, RepairsGoFirstAreMergedClippedAndBounded) {
  FakePort port(3);
  port.sources[5] = Bytes(8000, 'r');
  port.sources[9] = Bytes(4000, 's');
  BoundedPacer unpaced(0, port.payload, kOverhead);
  BoundedSender s(3, 1);
  s.QueueSend(1, 9, 4000, port.payload, 0);
  // Overlapping and out-of-range asks: one pass over [1000, 3500) and [7000, 8000).
  EXPECT_EQ(s.QueueRepair(2, 5, {{2000, 3500}, {1000, 2500}, {7000, 9000}}, 8000),
            Repair::kQueued);
  // A second request for the same operation is merged into the queued repair.
  EXPECT_EQ(s.QueueRepair(2, 5, {{3000, 3600}}, 8000), Repair::kMerged);
  EXPECT_EQ(s.QueueRepair(2, 5, {{9000, 9500}}, 8000), Repair::kMerged);
  EXPECT_EQ(s.QueueRepair(2, 6, {{9000, 9500}}, 8000), Repair::kNothing);
  EXPECT_EQ(s.Pending(), 2u);
  EXPECT_EQ(s.QueuedSends(5), 0u);  // repairs are not sends

  // The repair to peer 2 goes although the one active send is peer 1's.
  PumpAt(s, port, unpaced, kT0);
  std::vector<std::pair<uint64_t, uint32_t>> repaired;
  for (const FakePort::Sent& p : port.sent) {
    if (p.peer != 2) continue;
    EXPECT_EQ(p.packet.op, 5u);
    EXPECT_EQ(p.packet.op_bytes, 0u);
    EXPECT_FALSE(p.packet.last);
    EXPECT_EQ(p.bytes, port.sources[5].substr(p.packet.offset, p.packet.len));
    repaired.emplace_back(p.packet.offset, p.packet.len);
  }
  EXPECT_EQ(repaired, (std::vector<std::pair<uint64_t, uint32_t>>{
                          {1000, 1000}, {2000, 1000}, {3000, 600}, {7000, 1000}}));
  EXPECT_EQ(port.PeerRuns(), (std::vector<int>{2, 1}));
  EXPECT_EQ(s.Pending(), 0u);

  // At most kMaxQueuedRepairs distinct operations per peer.
  for (uint64_t op = 100; op < 100 + BoundedSender::kMaxQueuedRepairs; ++op) {
    EXPECT_EQ(s.QueueRepair(1, op, {{0, 10}}, 8000), Repair::kQueued);
  }
  EXPECT_EQ(s.QueueRepair(1, 99, {{0, 10}}, 8000), Repair::kDropped);
  EXPECT_EQ(s.QueueRepair(1, 100, {{10, 20}}, 8000), Repair::kMerged);
}

TEST(BoundedSender, PacingSpendsTheBucketAndAsksToBeCalledWhenTokensAreBack) {
  FakePort port(2);
  port.payload = 8192;
  port.sources[1] = Bytes(64 * 8192, 'p');
  const double rate = 1e6;  // bytes per second
  BoundedPacer pacer(rate, port.payload, kOverhead);
  EXPECT_EQ(pacer.burst(), 256.0 * 1024);  // at least 256 KiB
  BoundedSender s(2, 1);
  s.QueueSend(1, 1, 64 * 8192, port.payload, 0);

  // A full bucket: packets go while tokens are left (the last one overdraws it).
  Clock::time_point deadline = PumpAt(s, port, pacer, kT0);
  const size_t cost = 8192 + kOverhead;
  const size_t first = (256 * 1024 + cost - 1) / cost;
  EXPECT_EQ(port.sent.size(), first);
  const double owed = static_cast<double>(first * cost) - 256.0 * 1024;
  EXPECT_DOUBLE_EQ(pacer.tokens(), -owed);
  const auto due = kT0 + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(owed / rate + 1e-5));
  EXPECT_EQ(deadline, due);

  // Before then nothing goes; at the due time one packet does.
  deadline = PumpAt(s, port, pacer, kT0 + std::chrono::milliseconds(1));
  EXPECT_EQ(port.sent.size(), first);
  EXPECT_GT(deadline, kT0 + std::chrono::milliseconds(1));
  PumpAt(s, port, pacer, due);
  EXPECT_EQ(port.sent.size(), first + 1);
}

TEST(BoundedSender, RefusedPacketsAreSentAgainWithTheirTokensGivenBack) {
  FakePort port(2);
  port.sources[4] = Bytes(10000, 'b');
  BoundedPacer pacer(1e9, port.payload, kOverhead);
  BoundedSender s(2, 1);
  s.QueueSend(1, 4, 10000, port.payload, 0);
  port.accept = 3;
  const Clock::time_point deadline = PumpAt(s, port, pacer, kT0);
  ASSERT_EQ(port.sent.size(), 3u);
  EXPECT_TRUE(port.blocked);
  // Only the three taken are paid for; the sender retries after kTxRetry, not in a spin.
  EXPECT_DOUBLE_EQ(pacer.tokens(), pacer.burst() - 3.0 * (1000 + kOverhead));
  EXPECT_EQ(deadline, kT0 + BoundedSender::kTxRetry);

  // The device takes packets again: the rest follows from the first refused one.
  port.blocked = false;
  port.accept = SIZE_MAX;
  PumpAt(s, port, pacer, kT0 + BoundedSender::kTxRetry);
  ASSERT_EQ(port.sent.size(), 10u);
  for (size_t i = 0; i < port.sent.size(); ++i) {
    EXPECT_EQ(port.sent[i].packet.offset, i * 1000);
  }
  EXPECT_EQ(s.Pending(), 0u);
}

TEST(BoundedSender, ABusySourceWaitsAndAGoneOneIsDropped) {
  FakePort port(2);
  port.sources[3] = Bytes(3000, 'g');
  BoundedPacer unpaced(0, port.payload, kOverhead);
  BoundedSender s(2, 1);
  s.QueueSend(1, 3, 3000, port.payload, 0);
  port.answer = SourceAccess::kBusy;
  // Kept, and asked for again at once (the owner is detaching its sources).
  EXPECT_EQ(PumpAt(s, port, unpaced, kT0), kT0);
  EXPECT_TRUE(port.sent.empty());
  EXPECT_EQ(s.Pending(), 1u);
  port.answer = SourceAccess::kGone;
  EXPECT_EQ(PumpAt(s, port, unpaced, kT0), Clock::time_point::max());
  EXPECT_TRUE(port.sent.empty());
  EXPECT_EQ(s.Pending(), 0u);
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
