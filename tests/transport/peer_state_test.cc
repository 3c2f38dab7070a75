// The engine's per-peer liveness and closing state (transport_dpdk/engine/
// peer_liveness_state.h, peer_close_state.h) driven by scripted packets, reports and
// made-up times (no clock, no engine).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "transport_dpdk/engine/peer_close_state.h"
#include "transport_dpdk/engine/peer_liveness_state.h"

namespace optireduce {
namespace transport {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Clock = PeerLivenessState::Clock;
using Verdict = PeerLivenessState::Verdict;

const Clock::time_point kT0 = Clock::time_point{} + std::chrono::hours(1);
constexpr char kCause[] = "ICMP port unreachable";

TEST(PeerLivenessStateTest, PingIdsCountUpAndOnlyTheLastOnesAreInFlight) {
  PeerLivenessState s(2);
  EXPECT_EQ(s.pings(), 0u);
  EXPECT_FALSE(s.PingInFlight(1));
  for (uint64_t i = 1; i <= 100; ++i) EXPECT_EQ(s.NextPingId(), i);
  EXPECT_EQ(s.pings(), 100u);
  EXPECT_TRUE(s.PingInFlight(100));
  EXPECT_TRUE(s.PingInFlight(100 - PeerLivenessState::kPingsInFlight + 1));
  EXPECT_FALSE(s.PingInFlight(100 - PeerLivenessState::kPingsInFlight));
  EXPECT_FALSE(s.PingInFlight(101));  // not sent yet
  EXPECT_TRUE(PeerLivenessState::InFlight(7, 7));
  EXPECT_FALSE(PeerLivenessState::InFlight(8, 7));
}

TEST(PeerLivenessStateTest, AbortNamingAThirdRankBlamesIt) {
  PeerLivenessState p(1);  // this rank is 0; peer 1's ABORT names rank 3
  p.Aborted(/*self=*/0, /*blamed=*/3);
  EXPECT_TRUE(p.unreachable());
  EXPECT_EQ(p.blame(), 3);
  EXPECT_EQ(p.BlamedRank(), 3);
  EXPECT_EQ(p.reason(),
            "peer rank 3 is gone (rank 1's context failed on it and closed its connection)");
  EXPECT_EQ(p.DeathReason(kCause), p.reason());
  EXPECT_FALSE(p.GoneOnItsOwn());
}

TEST(PeerLivenessStateTest, AbortBlamingThisRankOrNoneBlamesThePeer) {
  PeerLivenessState lost(1);
  lost.Aborted(/*self=*/0, /*blamed=*/0);
  EXPECT_EQ(lost.BlamedRank(), 1);
  EXPECT_EQ(lost.reason(),
            "peer rank 1 closed the connection: its context failed (it lost contact with this "
            "rank)");
  PeerLivenessState timed_out(1);
  timed_out.Aborted(/*self=*/0, /*blamed=*/-1);
  EXPECT_EQ(timed_out.BlamedRank(), 1);
  EXPECT_EQ(timed_out.reason(),
            "peer rank 1 closed the connection: its context failed (a wait there timed out)");
  PeerLivenessState itself(1);
  itself.Aborted(/*self=*/0, /*blamed=*/1);
  EXPECT_EQ(itself.blame(), 1);
  EXPECT_TRUE(itself.unreachable());
}

TEST(PeerLivenessStateTest, ThePeerSpeakingAgainDropsTheReason) {
  PeerLivenessState p(1);
  p.Connected(kT0);
  p.Aborted(0, 3);
  ASSERT_FALSE(p.reason().empty());
  p.Heard(kT0 + milliseconds(1), /*probe_answer=*/false);
  EXPECT_TRUE(p.reason().empty());
  EXPECT_EQ(p.blame(), -1);
  EXPECT_EQ(p.BlamedRank(), 1);
  EXPECT_FALSE(p.unreachable());
  EXPECT_EQ(p.last_heard(), kT0 + milliseconds(1));
}

TEST(PeerLivenessStateTest, TheBlamedRankSharesTheReasonUnlessItHasOne) {
  PeerLivenessState reporter(1), blamed(3), other(2);
  reporter.Aborted(0, 3);
  blamed.GoneWith(reporter);
  EXPECT_TRUE(blamed.unreachable());
  EXPECT_EQ(blamed.reason(), reporter.reason());
  EXPECT_EQ(blamed.BlamedRank(), 3);
  // A peer that has its own reason keeps it (and is left as it was).
  other.Aborted(0, -1);
  const std::string own = other.reason();
  other.GoneWith(reporter);
  EXPECT_EQ(other.reason(), own);
  EXPECT_EQ(other.BlamedRank(), 2);
}

TEST(PeerLivenessStateTest, AnEarlierGonePeerExplainsALaterReport) {
  PeerLivenessState first(2), second(3);
  first.Unreachable();
  EXPECT_TRUE(first.GoneOnItsOwn());
  EXPECT_FALSE(second.GoneOnItsOwn());
  second.ExplainedBy(first, kCause);
  EXPECT_EQ(second.reason(), "peer rank 2 is gone: ICMP port unreachable (and then rank 3 too)");
  EXPECT_EQ(second.BlamedRank(), 2);
  EXPECT_FALSE(second.unreachable());  // the caller marks it
  // A second explanation does not replace the first.
  PeerLivenessState third(4);
  third.Unreachable();
  second.ExplainedBy(third, kCause);
  EXPECT_EQ(second.BlamedRank(), 2);
}

TEST(PeerLivenessStateTest, DeathReasonsNameTheProofOrTheSilenceBound) {
  PeerLivenessState proven(5, milliseconds(1000));
  proven.Connected(kT0);
  proven.Unreachable();
  EXPECT_EQ(proven.Check(kT0, /*pending=*/true), Verdict::kDead);
  EXPECT_EQ(proven.DeathReason(kCause), "peer rank 5 is gone: ICMP port unreachable");
  EXPECT_EQ(proven.BlamedRank(), 5);

  PeerLivenessState silent(6, milliseconds(1000));
  silent.Connected(kT0);
  EXPECT_EQ(silent.Check(kT0, true), Verdict::kAlive);
  // Pending and silent for the bound: gone.
  Verdict v = Verdict::kAlive;
  for (int ms = 1; ms <= 1000 && v != Verdict::kDead; ++ms) {
    v = silent.Check(kT0 + milliseconds(ms), true);
  }
  EXPECT_EQ(v, Verdict::kDead);
  EXPECT_FALSE(silent.unreachable());
  EXPECT_EQ(silent.DeathReason(kCause),
            "peer rank 6 is gone: no packet from it for 1000 ms while operations with it were "
            "pending (OPTIREDUCE_PEER_DEAD_MS)");
}

TEST(PeerLivenessStateTest, ChecksFollowTheProbeSchedule) {
  PeerLivenessState s(1);  // no silence bound: first probes 1 ms apart
  s.Connected(kT0);
  EXPECT_EQ(s.Check(kT0, /*pending=*/false), Verdict::kIdle);
  EXPECT_EQ(s.Check(kT0, true), Verdict::kAlive);
  EXPECT_EQ(s.NextProbe(), kT0 + milliseconds(1));
  EXPECT_EQ(s.Check(kT0 + milliseconds(1), true), Verdict::kProbe);
  EXPECT_EQ(s.Check(kT0 + microseconds(1500), true), Verdict::kAlive);
  // Silence alone never kills without a bound.
  EXPECT_NE(s.Check(kT0 + std::chrono::hours(2), true), Verdict::kDead);
}

TEST(PeerCloseStateTest, ProbesGoOutAtMostEveryProbeInterval) {
  PeerCloseState c;
  EXPECT_EQ(c.probe_id(), 0u);
  EXPECT_EQ(c.ProbeDue(kT0), 1u);
  EXPECT_EQ(c.ProbeDue(kT0), 0u);
  EXPECT_EQ(c.ProbeDue(kT0 + PeerCloseState::kProbeEvery - microseconds(1)), 0u);
  EXPECT_EQ(c.ProbeDue(kT0 + PeerCloseState::kProbeEvery), 2u);
  EXPECT_EQ(c.probe_id(), 2u);
  EXPECT_EQ(c.ProbeDue(kT0 + 5 * PeerCloseState::kProbeEvery), 3u);
}

TEST(PeerCloseStateTest, OnlyASettledAnswerToAProbeSentSinceTheLastPacketConfirms) {
  PeerCloseState c;
  c.Answered(1, /*settled=*/true);  // no probe sent: an answer to nothing
  EXPECT_FALSE(c.confirmed());
  ASSERT_EQ(c.ProbeDue(kT0), 1u);
  c.Answered(1, /*settled=*/false);  // busy
  EXPECT_FALSE(c.confirmed());
  c.Answered(2, true);  // not sent yet
  EXPECT_FALSE(c.confirmed());
  c.Answered(1, true);
  EXPECT_TRUE(c.confirmed());
  // A sequenced packet from the peer clears it; answers to probes sent before it do not
  // count any more.
  c.SequencedArrival();
  EXPECT_FALSE(c.confirmed());
  c.Answered(1, true);
  EXPECT_FALSE(c.confirmed());
  ASSERT_EQ(c.ProbeDue(kT0 + PeerCloseState::kProbeEvery), 2u);
  c.Answered(2, true);
  EXPECT_TRUE(c.confirmed());
}

TEST(PeerCloseStateTest, AnAnswerToAnyProbeAfterTheFloorCounts) {
  // The round trip is longer than the probe interval: probes 1..3 are out when the answer
  // to 2 comes back.
  PeerCloseState c;
  ASSERT_EQ(c.ProbeDue(kT0), 1u);
  c.SequencedArrival();  // floor 1
  ASSERT_EQ(c.ProbeDue(kT0 + PeerCloseState::kProbeEvery), 2u);
  ASSERT_EQ(c.ProbeDue(kT0 + 2 * PeerCloseState::kProbeEvery), 3u);
  c.Answered(2, true);
  EXPECT_TRUE(c.confirmed());
}

TEST(PeerCloseStateTest, APeerClosingIsRemembered) {
  PeerCloseState c;
  EXPECT_FALSE(c.peer_closing());
  c.PeerClosing();
  EXPECT_TRUE(c.peer_closing());
  c.SequencedArrival();
  EXPECT_TRUE(c.peer_closing());
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
