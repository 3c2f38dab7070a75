// Loss recovery components of the reliable service (transport_dpdk/reliable/),
// driven by scripted sends, acks and timer calls at explicit times.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "transport_dpdk/reliable/ack_scheduler.h"
#include "transport_dpdk/reliable/congestion_window.h"
#include "transport_dpdk/reliable/reliable_sender.h"
#include "transport_dpdk/reliable/send_scoreboard.h"

namespace optireduce {
namespace transport {
namespace {

using Time = SendScoreboard::Time;
using us = std::chrono::microseconds;
constexpr uint64_t kNone = SendScoreboard::kNone;

Time At(long micros) { return Time{} + std::chrono::seconds(1) + us(micros); }

// A selective-ack bitmap for cum: bit i <-> seq cum + 1 + i.
std::vector<uint8_t> Sack(uint64_t cum, const std::vector<uint64_t>& seqs) {
  std::vector<uint8_t> b;
  for (uint64_t s : seqs) {
    const uint64_t i = s - cum - 1;
    if (b.size() <= i / 8) b.resize(i / 8 + 1, 0);
    b[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
  }
  return b;
}

TEST(SendScoreboard, AckReportsEachPacketOnce) {
  SendScoreboard sb;
  for (uint64_t s = 0; s < 200; ++s) sb.OnSend(s, 100, At(s));
  EXPECT_EQ(sb.pipe_bytes(), 20000u);
  std::vector<uint64_t> got;
  auto rec = [&](uint64_t seq, const SendScoreboard::Segment&) { got.push_back(seq); };
  std::vector<uint64_t> sacked;
  for (uint64_t s = 20; s < 150; ++s) sacked.push_back(s);
  auto bits = Sack(10, sacked);
  ASSERT_TRUE(sb.OnAck(10, bits.data(), bits.size(), rec));
  EXPECT_EQ(got.size(), 10u + 130u);
  // The same ack again reports nothing; a wider one only the new part.
  got.clear();
  ASSERT_TRUE(sb.OnAck(10, bits.data(), bits.size(), rec));
  EXPECT_TRUE(got.empty());
  sacked.push_back(160);
  bits = Sack(10, sacked);
  ASSERT_TRUE(sb.OnAck(10, bits.data(), bits.size(), rec));
  EXPECT_EQ(got, std::vector<uint64_t>{160});
  EXPECT_EQ(sb.in_flight_packets(), 200u - 141u);
  EXPECT_EQ(sb.pipe_bytes(), (200u - 141u) * 100);
  // The cumulative point passing sacked packets reports only the holes.
  got.clear();
  ASSERT_TRUE(sb.OnAck(170, nullptr, 0, rec));
  std::set<uint64_t> g(got.begin(), got.end());
  EXPECT_EQ(g.size(), 10u + 10u + 9u);  // [10,20) [150,160) [161,170)
  EXPECT_EQ(sb.base(), 170u);
  EXPECT_FALSE(sb.OnAck(201, nullptr, 0, rec));  // never sent
}

TEST(SendScoreboard, InFlightListIsInSendOrderAndLostQueueSkipsDelivered) {
  SendScoreboard sb;
  for (uint64_t s = 0; s < 4; ++s) sb.OnSend(s, 10, At(s));
  sb.OnRetransmit(1, At(10));
  std::vector<uint64_t> order;
  for (uint64_t s = sb.OldestInFlight(); s != kNone; s = sb.NextInFlight(s)) order.push_back(s);
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 2, 3, 1}));
  sb.MarkAllLost();
  EXPECT_EQ(sb.in_flight_packets(), 0u);
  EXPECT_EQ(sb.pipe_bytes(), 0u);
  EXPECT_EQ(sb.lost_packets(), 4u);
  auto bits = Sack(0, {2});
  ASSERT_TRUE(sb.OnAck(0, bits.data(), bits.size(), [](uint64_t, const SendScoreboard::Segment&) {}));
  EXPECT_EQ(sb.PopLost(), 0u);
  EXPECT_EQ(sb.PopLost(), 3u);  // 2 was delivered meanwhile
  EXPECT_EQ(sb.PopLost(), 1u);
  EXPECT_EQ(sb.PopLost(), kNone);
}

TEST(CongestionWindow, ReducesOncePerEpisodeAndUndoes) {
  CongestionWindow w(1000, 100000);
  EXPECT_EQ(w.cwnd(), 100000u);
  w.OnLoss(/*next_seq=*/50);
  EXPECT_EQ(w.cwnd(), 70000u);
  w.OnLoss(60);  // same episode
  EXPECT_EQ(w.cwnd(), 70000u);
  w.OnAck(5000, 40);  // still in recovery: no growth
  EXPECT_EQ(w.cwnd(), 70000u);
  w.OnAck(70000, 50);  // episode over: one packet per window
  EXPECT_EQ(w.cwnd(), 71000u);
  w.OnRto(100);
  EXPECT_EQ(w.cwnd(), 1000u);
  w.OnAck(1000, 90);  // slow start after an RTO
  EXPECT_EQ(w.cwnd(), 2000u);
  w.Undo();
  EXPECT_EQ(w.cwnd(), 71000u);
  EXPECT_FALSE(w.in_recovery());
}

TEST(AckScheduler, AcksEveryNPacketsAtOnceWhenUrgentAndAfterTheDelay) {
  AckScheduler a(4, 1 << 20, us(100));
  EXPECT_FALSE(a.Pending());
  for (int i = 0; i < 3; ++i) a.OnArrival(At(i), 100, false);
  EXPECT_FALSE(a.Due(At(3)));
  EXPECT_EQ(a.Deadline(), At(100));
  EXPECT_TRUE(a.Due(At(100)));
  a.OnArrival(At(4), 100, false);
  EXPECT_TRUE(a.Due(At(4)));
  a.OnAckSent();
  a.OnArrival(At(5), 100, /*urgent=*/true);
  EXPECT_TRUE(a.Due(At(5)));
}

ReliableSender::Options Opts() {
  ReliableSender::Options o;
  o.initial_rto = us(20000);
  o.min_rto = us(4000);
  o.max_rto = us(200000);
  o.max_ack_delay = us(100);
  o.min_pto = us(1000);
  o.mss = 1000;
  o.window = 64 * 1000;
  o.pacing = false;  // see PacingSpreadsAWindowOverTheRoundTrip
  return o;
}

// Sends n new packets at time t (one microsecond apart).
void SendNew(ReliableSender& s, uint64_t n, long t) {
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t seq = s.scoreboard().next_seq();
    ASSERT_TRUE(s.CanSendNew(1000, At(t)));
    s.OnSendNew(seq, 1000, At(t + static_cast<long>(i)));
  }
}

uint64_t Ack(ReliableSender& s, uint64_t cum, const std::vector<uint64_t>& sacked, long t,
             uint64_t dsack = kNone) {
  auto bits = Sack(cum, sacked);
  uint64_t n = 0;
  EXPECT_TRUE(s.OnAck(cum, bits.data(), bits.size(), dsack, At(t), [&](uint64_t) { ++n; }));
  return n;
}

std::vector<uint64_t> DrainRetransmits(ReliableSender& s, long t) {
  std::vector<uint64_t> out;
  for (uint64_t seq; (seq = s.NextRetransmit(At(t))) != kNone;) {
    s.OnRetransmit(seq, At(t));
    out.push_back(seq);
  }
  return out;
}

// Runs the sender's timers from t0 until `until` returns true (step: 10 us).
long RunTimersUntil(ReliableSender& s, long t0, long limit,
                    const std::function<bool(long)>& until) {
  for (long t = t0; t < limit; t += 10) {
    s.OnTimer(At(t));
    if (until(t)) return t;
  }
  return -1;
}

// Runs the timers from t0, sending each tail-loss probe as the engine would, until an RTO
// fires: its time, or -1 if none by t = 100000.
long SendProbesUntilRto(ReliableSender& s, long t0) {
  return RunTimersUntil(s, t0, 100000, [&](long tt) {
    if (s.probe_pending()) {
      const uint64_t seq = s.ProbeSeq();
      s.OnRetransmit(seq, At(tt));
      s.OnProbeSent(seq);
    }
    return s.counters().rto_events > 0;
  });
}

TEST(ReliableSender, TailLossIsFoundByAProbeNotAnRto) {
  ReliableSender s(Opts());
  SendNew(s, 20, 0);
  // The first 12 arrive; the last 8 are lost.
  EXPECT_EQ(Ack(s, 12, {}, 100), 12u);
  const long probe = RunTimersUntil(s, 110, 20000, [&](long) { return s.probe_pending(); });
  ASSERT_GT(probe, 0);
  EXPECT_LT(probe, 100 + 4000);  // well before the RTO
  const uint64_t seq = s.ProbeSeq();
  EXPECT_EQ(seq, 19u);
  s.OnRetransmit(seq, At(probe));
  s.OnProbeSent(seq);
  // The probe's ack reports 19: RACK marks 12..18 lost (sent long before).
  Ack(s, 12, {19}, probe + 100);
  std::vector<uint64_t> resent = DrainRetransmits(s, probe + 100);
  EXPECT_EQ(resent, (std::vector<uint64_t>{12, 13, 14, 15, 16, 17, 18}));
  EXPECT_EQ(Ack(s, 20, {}, probe + 200), 7u);
  EXPECT_EQ(s.counters().rto_events, 0u);
  EXPECT_EQ(s.counters().tlp_probes, 1u);
  EXPECT_TRUE(s.scoreboard().empty());
  EXPECT_LT(probe + 200, 3 * 4000);
}

TEST(ReliableSender, RtoMarksEverythingLostAndResendsUnderTheWindow) {
  ReliableSender s(Opts());
  SendNew(s, 1, 0);
  Ack(s, 1, {}, 100);  // an RTT sample: srtt 100 us, RTO at its 4 ms floor
  SendNew(s, 10, 200);
  // Nothing comes back (probe included).
  long t = SendProbesUntilRto(s, 210);
  ASSERT_GT(t, 0);
  EXPECT_EQ(s.scoreboard().lost_packets(), 10u);
  // One packet at first (cwnd = 1 mss), then slow start.
  EXPECT_EQ(DrainRetransmits(s, t), std::vector<uint64_t>{1});
  Ack(s, 2, {}, t + 100);
  EXPECT_EQ(DrainRetransmits(s, t + 100), (std::vector<uint64_t>{2, 3}));
  Ack(s, 4, {}, t + 200);
  EXPECT_EQ(DrainRetransmits(s, t + 200), (std::vector<uint64_t>{4, 5, 6, 7}));
  Ack(s, 8, {}, t + 300);
  EXPECT_EQ(DrainRetransmits(s, t + 300), (std::vector<uint64_t>{8, 9, 10}));
  Ack(s, 11, {}, t + 400);
  EXPECT_TRUE(s.scoreboard().empty());
  EXPECT_EQ(s.counters().rto_events, 1u);
}

TEST(ReliableSender, ReorderingWithinTheWindowResendsNothing) {
  ReliableSender s(Opts());
  SendNew(s, 1, 0);
  Ack(s, 1, {}, 100);  // min_rtt 100 us: reordering window 25 us
  SendNew(s, 10, 1000);
  // 2..10 arrive first, 1 a little later (reordered, not lost).
  Ack(s, 1, {2, 3, 4, 5, 6, 7, 8, 9, 10}, 1100);
  EXPECT_TRUE(DrainRetransmits(s, 1100).empty());
  s.OnTimer(At(1105));
  EXPECT_TRUE(DrainRetransmits(s, 1105).empty());
  Ack(s, 11, {}, 1110);
  s.OnTimer(At(1200));
  EXPECT_TRUE(DrainRetransmits(s, 1200).empty());
  EXPECT_EQ(s.counters().retransmits, 0u);
  EXPECT_EQ(s.cwnd().cwnd(), 64000u);
}

TEST(ReliableSender, HoleIsResentAfterTheReorderingWindowAndWindowShrinksOnce) {
  ReliableSender s(Opts());
  SendNew(s, 1, 0);
  Ack(s, 1, {}, 100);
  SendNew(s, 10, 1000);
  Ack(s, 1, {3, 4, 5, 6, 7, 8, 9, 10}, 1100);  // 1 and 2 are missing
  EXPECT_TRUE(DrainRetransmits(s, 1100).empty());  // not yet: could be reordering
  const long t = RunTimersUntil(s, 1101, 5000, [&](long) { return s.scoreboard().lost_packets() > 0; });
  ASSERT_GT(t, 0);
  EXPECT_LE(t, 1100 + 30);
  EXPECT_EQ(DrainRetransmits(s, t), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.cwnd().cwnd(), 44800u);  // 0.7 x 64000, once for both
  EXPECT_EQ(s.counters().rack_lost, 2u);
  // A lost retransmission is found the same way (no RTO): 2 arrives, 1 not.
  SendNew(s, 1, t + 50);  // seq 11, sent after the retransmissions
  Ack(s, 1, {2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, t + 150);
  const long t2 = RunTimersUntil(s, t + 150, t + 5000, [&](long) { return s.scoreboard().lost_packets() > 0; });
  ASSERT_GT(t2, 0);
  EXPECT_EQ(DrainRetransmits(s, t2), std::vector<uint64_t>{1});
  Ack(s, 12, {}, t2 + 100);
  EXPECT_EQ(s.counters().rto_events, 0u);
}

TEST(ReliableSender, LateAcksAfterAnRtoCostOnePacketAndAreUndone) {
  ReliableSender s(Opts());
  SendNew(s, 1, 0);
  Ack(s, 1, {}, 100);
  SendNew(s, 30, 200);
  const uint64_t before = s.cwnd().cwnd();
  // The receiver is descheduled: its acks come 10 ms late.
  long t = SendProbesUntilRto(s, 210);
  ASSERT_GT(t, 0);
  EXPECT_EQ(DrainRetransmits(s, t).size(), 1u);
  // Everything (originals) was received; the receiver reports the duplicate.
  Ack(s, 31, {}, 10200);
  Ack(s, 31, {}, 10210, /*dsack=*/1);
  EXPECT_TRUE(DrainRetransmits(s, 10210).empty());
  EXPECT_EQ(s.counters().undos, 1u);
  EXPECT_EQ(s.cwnd().cwnd(), before);
  EXPECT_LE(s.counters().retransmits, 2u);  // the probe and one after the RTO
  EXPECT_GE(s.counters().spurious, 1u);
  EXPECT_GT(s.detector().reo_wnd_mult(), 1);  // the reordering window widened
}

TEST(ReliableSender, SpuriousRtoPutsItsPacketsBackInFlight) {
  ReliableSender s(Opts());
  SendNew(s, 1, 0);
  Ack(s, 1, {}, 100);
  SendNew(s, 10, 200);
  const uint64_t before = s.cwnd().cwnd();
  long t = SendProbesUntilRto(s, 210);
  ASSERT_GT(t, 0);
  EXPECT_EQ(DrainRetransmits(s, t), std::vector<uint64_t>{1});
  // A late ack delivers originals sent before the RTO: it was spurious. (It
  // also covers the resent 1, a round trip after the resend: RACK must not
  // take that for the resend's ack and mark everything sent before lost.)
  Ack(s, 5, {}, t + 150);
  EXPECT_EQ(s.counters().spurious_rtos, 1u);
  EXPECT_EQ(s.cwnd().cwnd(), before);
  s.OnTimer(At(t + 160));
  EXPECT_TRUE(DrainRetransmits(s, t + 160).empty());
  EXPECT_EQ(s.scoreboard().in_flight_packets(), 6u);  // 5..10 on their way
  EXPECT_EQ(s.scoreboard().lost_packets(), 0u);
  EXPECT_EQ(Ack(s, 11, {}, t + 200), 6u);
  EXPECT_EQ(s.counters().retransmits, 2u);  // the probe and the RTO's first
}

TEST(ReliableSender, LocalDropIsResentAtOnceWithoutBackoff) {
  ReliableSender s(Opts());
  SendNew(s, 1, 0);
  Ack(s, 1, {}, 100);
  SendNew(s, 4, 200);
  s.OnLocalDrop(3);
  s.OnLocalDrop(4);
  EXPECT_EQ(DrainRetransmits(s, 205), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(s.cwnd().cwnd(), 64000u);
  EXPECT_EQ(s.counters().local_drops, 2u);
}

TEST(ReliableSender, CongestionWindowLimitsNewData) {
  ReliableSender::Options o = Opts();
  o.pacing = false;
  o.window = 4000;
  ReliableSender s(o);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(s.CanSendNew(1000, At(0)));
    s.OnSendNew(s.scoreboard().next_seq(), 1000, At(0));
  }
  EXPECT_FALSE(s.CanSendNew(1000, At(0)));
  Ack(s, 1, {}, 100);
  EXPECT_TRUE(s.CanSendNew(1000, At(100)));
}

TEST(ReliableSender, PacingSpreadsAWindowOverTheRoundTrip) {
  ReliableSender::Options o = Opts();
  o.pacing = true;
  ReliableSender s(o);
  SendNew(s, 1, 0);
  Ack(s, 1, {}, 100);  // min_rtt 100 us: 1.25 x 64000 B per 100 us, 8000 B bursts
  int sent = 0;
  while (s.CanSendNew(1000, At(200)) && sent < 64) {
    s.OnSendNew(s.scoreboard().next_seq(), 1000, At(200));
    ++sent;
  }
  EXPECT_EQ(sent, 8);
  const Time next = s.Deadline(At(200));
  EXPECT_GT(next, At(200));
  EXPECT_LE(next, At(200 + 20));
  EXPECT_TRUE(s.CanSendNew(1000, next));
}

// A long but steady round trip (a queue: every sample 3.5 ms): the RTO must
// stay far enough above it that a tail loss is found by a probe, not by an
// RTO that marks everything lost and drops the window to one packet.
TEST(ReliableSender, SteadyLongRttLeavesRoomForAProbeBeforeTheRto) {
  ReliableSender s(Opts());
  for (int i = 0; i < 20; ++i) {
    SendNew(s, 1, i * 4000);
    Ack(s, static_cast<uint64_t>(i) + 1, {}, i * 4000 + 3500);
  }
  EXPECT_GE(s.rtt().rto(), s.rtt().srtt() + us(4000));
  const long t0 = 100000;
  SendNew(s, 10, t0);
  Ack(s, 25, {}, t0 + 3500);  // 20..24 arrive, the last five are lost
  const long t = RunTimersUntil(s, t0 + 3500, t0 + 100000, [&](long) {
    return s.probe_pending() || s.counters().rto_events > 0;
  });
  ASSERT_GT(t, 0);
  EXPECT_TRUE(s.probe_pending());
  EXPECT_EQ(s.counters().rto_events, 0u);
}

// When the probe time is past the RTO, the probe is sent at the RTO's time
// instead (RFC 8985: PTO = min(PTO, RTO)) and the RTO restarts from it.
TEST(ReliableSender, ProbeComesFirstWhenItsTimeIsPastTheRto) {
  ReliableSender::Options o = Opts();
  o.min_pto = us(30000);  // far above the RTO
  ReliableSender s(o);
  SendNew(s, 1, 0);
  Ack(s, 1, {}, 100);
  SendNew(s, 4, 1000);
  const long t = RunTimersUntil(s, 1000, 200000, [&](long) {
    return s.probe_pending() || s.counters().rto_events > 0;
  });
  ASSERT_GT(t, 0);
  EXPECT_TRUE(s.probe_pending());
  EXPECT_EQ(s.counters().rto_events, 0u);
  const uint64_t seq = s.ProbeSeq();
  s.OnRetransmit(seq, At(t));
  s.OnProbeSent(seq);
  s.OnTimer(At(t + 100));
  EXPECT_EQ(s.counters().rto_events, 0u);  // restarted by the probe
}

// In recovery, with every lost packet resent, the tail of the flight (the
// retransmissions included) is lost: nothing sent later can be delivered for
// RACK to judge them by, so a probe finds them, not an RTO.
TEST(ReliableSender, LostTailOfARecoveryIsProbedNotTimedOut) {
  ReliableSender s(Opts());
  SendNew(s, 1, 0);
  Ack(s, 1, {}, 100);
  SendNew(s, 10, 1000);
  Ack(s, 1, {3, 4, 5, 6, 7, 8}, 1100);  // 1, 2 missing; 9, 10 lost too
  const long t = RunTimersUntil(s, 1101, 5000, [&](long) { return s.scoreboard().lost_packets() > 0; });
  ASSERT_GT(t, 0);
  EXPECT_EQ(DrainRetransmits(s, t), (std::vector<uint64_t>{1, 2}));
  ASSERT_TRUE(s.cwnd().in_recovery());
  // Nothing more comes back: the resent 1, 2 and the originals 9, 10 are lost.
  const long p = RunTimersUntil(s, t + 10, t + 100000, [&](long) {
    return s.probe_pending() || s.counters().rto_events > 0;
  });
  ASSERT_GT(p, 0);
  EXPECT_TRUE(s.probe_pending());
  EXPECT_EQ(s.counters().rto_events, 0u);
  const uint64_t seq = s.ProbeSeq();
  EXPECT_EQ(seq, 2u);  // the newest transmission
  s.OnRetransmit(seq, At(p));
  s.OnProbeSent(seq);
  // The probe's ack lets RACK find the rest: 1 (resent before it), 9, 10.
  Ack(s, 1, {2, 3, 4, 5, 6, 7, 8}, p + 100);
  s.OnTimer(At(p + 400));
  std::vector<uint64_t> resent = DrainRetransmits(s, p + 400);
  EXPECT_EQ(std::set<uint64_t>(resent.begin(), resent.end()), (std::set<uint64_t>{1, 9, 10}));
  EXPECT_EQ(s.counters().rto_events, 0u);
}

// A thin flight (fewer than 4 packets on the wire) gets at most a few acks
// per RTO: its RTOs stay at the base value for the first six (linear, as
// Linux's tcp_thin_linear_timeouts) before backing off, so a loss burst that
// swallows a few consecutive datagrams costs six base RTOs, not 4 + 8 + 16 +
// ... ms. A thick flight's RTO backs off; the RTOs after it resend one packet
// each (the loss window), a thin flight again.
TEST(ReliableSender, ThinFlightRtosAreLinearForSixThenBackOff) {
  auto rto_times = [](uint64_t packets) {
    ReliableSender::Options o = Opts();
    o.min_pto = us(100000);  // the probe at the RTO's time...
    ReliableSender s(o);
    SendNew(s, 1, 0);
    Ack(s, 1, {}, 100);
    SendNew(s, packets, 1000);
    std::vector<long> at;
    uint64_t seen = 0;
    RunTimersUntil(s, 1000, 2000000, [&](long t) {
      if (s.probe_pending()) {  // ...is lost too
        const uint64_t seq = s.ProbeSeq();
        s.OnRetransmit(seq, At(t));
        s.OnProbeSent(seq);
      }
      if (s.counters().rto_events > seen) {
        seen = s.counters().rto_events;
        at.push_back(t);
        DrainRetransmits(s, t);  // every retransmission is lost
      }
      return at.size() == 8;
    });
    std::vector<long> gaps;
    for (size_t i = 1; i < at.size(); ++i) gaps.push_back(at[i] - at[i - 1]);
    return gaps;
  };
  const std::vector<long> thin = rto_times(2);
  ASSERT_EQ(thin.size(), 7u);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(thin[i], thin[0], 20) << i;
  EXPECT_GT(thin[6], thin[5] * 3 / 2);  // backs off after six
  const std::vector<long> thick = rto_times(20);
  ASSERT_EQ(thick.size(), 7u);
  EXPECT_NEAR(thick[0], 2 * thin[0], 40);
  for (int i = 1; i < 5; ++i) EXPECT_NEAR(thick[i], thick[0], 20) << i;
}

// With a steady RTT (variance near zero) the probe waits srtt plus a margin
// (max(4 rttvar, min_pto)), not 2 srtt: a long srtt is mostly the sender's
// own queue, and doubling it only delays finding a lost tail.
TEST(ReliableSender, ProbeAfterASteadyLongRttWaitsAMarginNotTwoRoundTrips) {
  ReliableSender s(Opts());  // min_pto 1 ms, max ack delay 100 us
  for (int i = 0; i < 20; ++i) {
    SendNew(s, 1, i * 4000);
    Ack(s, static_cast<uint64_t>(i) + 1, {}, i * 4000 + 3500);
  }
  const long t0 = 100000;
  SendNew(s, 10, t0);  // the last one leaves at t0 + 9
  Ack(s, 25, {}, t0 + 3500);
  const long t = RunTimersUntil(s, t0 + 3500, t0 + 100000, [&](long) { return s.probe_pending(); });
  ASSERT_GT(t, 0);
  EXPECT_LE(t, t0 + 3500 + 1000 + 100 + 50);
  EXPECT_LT(t, t0 + 2 * 3500);
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
