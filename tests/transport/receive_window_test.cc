// ReceiveWindow (transport_dpdk/reliable/receive_window.h), the receiver's record of one
// peer's sequence numbers, driven by scripted arrivals: verdicts, the cumulative point,
// and the selective-ack bitmap an ack carries (bit i <-> seq cum + 1 + i), also as the
// sender's SendScoreboard reads it. Sequence numbers are uint64_t counted from 0 and do
// not wrap; the bitmap is a ring of kSpan slots (seq % kSpan) that does, so slot reuse
// across the ring's end is what the wraparound cases check.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <vector>

#include "transport_dpdk/reliable/receive_window.h"
#include "transport_dpdk/reliable/send_scoreboard.h"

namespace optireduce {
namespace transport {
namespace {

using Verdict = ReceiveWindow::Verdict;
constexpr uint64_t kSpan = ReceiveWindow::kSpan;

// Classifies seq, requires it new, marks it.
void Arrive(ReceiveWindow& w, uint64_t seq) {
  ASSERT_EQ(w.Classify(seq), Verdict::kNew) << "seq " << seq;
  w.Mark(seq);
}

// The window's SACK bitmap (buffer of max_bytes, pre-filled with 0xFF so bytes the call
// leaves alone show up), decoded into the sequence numbers it reports.
struct SackView {
  size_t bytes = 0;
  std::vector<uint8_t> raw;
  std::set<uint64_t> seqs;
};
SackView ReadSack(const ReceiveWindow& w, size_t max_bytes = kSpan / 8) {
  SackView v;
  v.raw.assign(max_bytes, 0xFF);
  v.bytes = w.Sack(v.raw.data(), max_bytes);
  v.raw.resize(v.bytes);
  for (size_t i = 0; i < v.bytes * 8; ++i) {
    if (v.raw[i / 8] & (1u << (i % 8))) v.seqs.insert(w.cum() + 1 + i);
  }
  return v;
}

TEST(ReceiveWindow, InOrderArrivalsAdvanceCumAndNeedNoSack) {
  ReceiveWindow w;
  EXPECT_EQ(w.cum(), 0u);
  EXPECT_EQ(w.highest(), 0u);
  EXPECT_EQ(ReadSack(w).bytes, 0u);
  for (uint64_t s = 0; s < 300; ++s) {
    Arrive(w, s);
    EXPECT_EQ(w.cum(), s + 1);
    EXPECT_EQ(w.highest(), s + 1);
    EXPECT_EQ(w.Classify(s), Verdict::kDuplicate);
    EXPECT_EQ(ReadSack(w).bytes, 0u) << "after seq " << s;
  }
}

TEST(ReceiveWindow, OutOfOrderArrivalsReportedAsSackRanges) {
  ReceiveWindow w;
  Arrive(w, 0);
  Arrive(w, 1);
  // Holes at 2, 3, 4 and 8, 9: cum stays at the first hole.
  for (uint64_t s : {5, 6, 7, 10}) Arrive(w, s);
  EXPECT_EQ(w.cum(), 2u);
  EXPECT_EQ(w.highest(), 11u);
  // Bits for seq 3..10: seq 5, 6, 7 -> bits 2, 3, 4; seq 10 -> bit 7.
  SackView v = ReadSack(w);
  ASSERT_EQ(v.bytes, 1u);
  EXPECT_EQ(v.raw[0], 0x9C);
  EXPECT_EQ(v.seqs, (std::set<uint64_t>{5, 6, 7, 10}));

  // One more past the byte boundary: seq 11 is bit 8, the bitmap grows to 2 bytes and the
  // new byte holds only that bit (not the 0xFF the buffer held).
  Arrive(w, 11);
  v = ReadSack(w);
  ASSERT_EQ(v.bytes, 2u);
  EXPECT_EQ(v.raw[0], 0x9C);
  EXPECT_EQ(v.raw[1], 0x01);
  EXPECT_EQ(v.seqs, (std::set<uint64_t>{5, 6, 7, 10, 11}));

  // A far arrival: the bitmap reaches it, and a short buffer truncates it to its size.
  Arrive(w, 200);
  v = ReadSack(w);
  EXPECT_EQ(v.bytes, 25u);  // 198 bits: seq 3..200
  EXPECT_EQ(v.seqs, (std::set<uint64_t>{5, 6, 7, 10, 11, 200}));
  v = ReadSack(w, 2);
  EXPECT_EQ(v.bytes, 2u);
  EXPECT_EQ(v.seqs, (std::set<uint64_t>{5, 6, 7, 10, 11}));
}

TEST(ReceiveWindow, DuplicatesDetectedBelowAndAboveCum) {
  ReceiveWindow w;
  for (uint64_t s = 0; s < 10; ++s) Arrive(w, s);
  Arrive(w, 15);
  ASSERT_EQ(w.cum(), 10u);
  // Below the cumulative point: every one a duplicate, also the first and the last.
  EXPECT_EQ(w.Classify(0), Verdict::kDuplicate);
  EXPECT_EQ(w.Classify(9), Verdict::kDuplicate);
  // Above it: the one marked is a duplicate, its neighbours and the hole at cum are new.
  EXPECT_EQ(w.Classify(15), Verdict::kDuplicate);
  EXPECT_EQ(w.Classify(14), Verdict::kNew);
  EXPECT_EQ(w.Classify(16), Verdict::kNew);
  EXPECT_EQ(w.Classify(10), Verdict::kNew);
  // Classify records nothing: asking twice gives the same answer, cum does not move.
  EXPECT_EQ(w.Classify(10), Verdict::kNew);
  EXPECT_EQ(w.cum(), 10u);
  EXPECT_EQ(w.highest(), 16u);
}

TEST(ReceiveWindow, ArrivalsBeyondTheWindowRejected) {
  ReceiveWindow w;
  // The window is [cum, cum + kSpan).
  EXPECT_EQ(w.Classify(kSpan - 1), Verdict::kNew);
  EXPECT_EQ(w.Classify(kSpan), Verdict::kOutOfWindow);
  EXPECT_EQ(w.Classify(10 * kSpan), Verdict::kOutOfWindow);
  // The last seq in the window is accepted and reported in the bitmap's last bit.
  Arrive(w, kSpan - 1);
  EXPECT_EQ(w.cum(), 0u);
  SackView v = ReadSack(w);
  EXPECT_EQ(v.bytes, kSpan / 8);
  EXPECT_EQ(v.seqs, (std::set<uint64_t>{kSpan - 1}));
  // The window slides with cum: 100 in-order arrivals admit 100 more at its top.
  for (uint64_t s = 0; s < 100; ++s) Arrive(w, s);
  ASSERT_EQ(w.cum(), 100u);
  EXPECT_EQ(w.Classify(kSpan + 99), Verdict::kNew);
  EXPECT_EQ(w.Classify(kSpan + 100), Verdict::kOutOfWindow);
}

TEST(ReceiveWindow, CumAdvancesOverGapsOnceFilled) {
  ReceiveWindow w;
  for (uint64_t s : {0, 2, 3, 4, 6, 8}) Arrive(w, s);
  EXPECT_EQ(w.cum(), 1u);
  EXPECT_EQ(ReadSack(w).seqs, (std::set<uint64_t>{2, 3, 4, 6, 8}));
  // Filling the first hole moves cum over the run behind it, to the next hole.
  Arrive(w, 1);
  EXPECT_EQ(w.cum(), 5u);
  SackView v = ReadSack(w);
  ASSERT_EQ(v.bytes, 1u);
  EXPECT_EQ(v.raw[0], 0x05);  // seq 6 -> bit 0, seq 8 -> bit 2
  // Filling a later hole first leaves cum where it is.
  Arrive(w, 7);
  EXPECT_EQ(w.cum(), 5u);
  EXPECT_EQ(ReadSack(w).seqs, (std::set<uint64_t>{6, 7, 8}));
  // The last hole: cum reaches highest, nothing is left to report.
  Arrive(w, 5);
  EXPECT_EQ(w.cum(), 9u);
  EXPECT_EQ(w.highest(), 9u);
  EXPECT_EQ(ReadSack(w).bytes, 0u);
  EXPECT_EQ(w.Classify(9), Verdict::kNew);
}

TEST(ReceiveWindow, BitmapSlotsReusedAcrossTheRingEnd) {
  ReceiveWindow w;
  // Bring cum to 3 below the ring's end (slot kSpan - 3).
  for (uint64_t s = 0; s + 3 < kSpan; ++s) Arrive(w, s);
  ASSERT_EQ(w.cum(), kSpan - 3);
  // Slots 0 and 1 were used by seq 0 and 1; seq kSpan and kSpan + 1 map onto them and
  // must read as new, not as the old arrivals.
  EXPECT_EQ(w.Classify(kSpan), Verdict::kNew);
  EXPECT_EQ(w.Classify(kSpan + 1), Verdict::kNew);
  // Out of order on both sides of the ring's end.
  Arrive(w, kSpan + 1);
  Arrive(w, kSpan - 1);
  EXPECT_EQ(w.Classify(kSpan), Verdict::kNew);
  EXPECT_EQ(w.Classify(kSpan + 1), Verdict::kDuplicate);
  SackView v = ReadSack(w);
  ASSERT_EQ(v.bytes, 1u);
  EXPECT_EQ(v.raw[0], 0x0A);  // bits for seq kSpan-2..: kSpan-1 -> bit 1, kSpan+1 -> bit 3
  EXPECT_EQ(v.seqs, (std::set<uint64_t>{kSpan - 1, kSpan + 1}));
  // Filling the holes carries cum across the end of the ring.
  Arrive(w, kSpan - 3);
  Arrive(w, kSpan - 2);
  EXPECT_EQ(w.cum(), kSpan);
  Arrive(w, kSpan);
  EXPECT_EQ(w.cum(), kSpan + 2);
  EXPECT_EQ(ReadSack(w).bytes, 0u);
  // cum passing a slot clears it: seq 2 kSpan + 1 (slot 1 again) is new.
  EXPECT_EQ(w.Classify(2 * kSpan + 1), Verdict::kNew);
}

TEST(ReceiveWindow, ManyRingTurnsWithReorderingKeepCumExact) {
  ReceiveWindow w;
  // Pairs swapped (1, 0, 3, 2, ...) over four turns of the ring: after each pair cum is
  // past both, between them it waits at the first.
  for (uint64_t s = 0; s < 4 * kSpan; s += 2) {
    Arrive(w, s + 1);
    ASSERT_EQ(w.cum(), s) << "seq " << s + 1;
    ASSERT_EQ(ReadSack(w).seqs, (std::set<uint64_t>{s + 1}));
    Arrive(w, s);
    ASSERT_EQ(w.cum(), s + 2) << "seq " << s;
  }
  EXPECT_EQ(w.highest(), 4 * kSpan);
  EXPECT_EQ(w.Classify(4 * kSpan - 1), Verdict::kDuplicate);
  EXPECT_EQ(w.Classify(4 * kSpan), Verdict::kNew);
  EXPECT_EQ(w.Classify(5 * kSpan), Verdict::kOutOfWindow);
}

TEST(ReceiveWindow, SenderScoreboardReadsTheAckAsMeant) {
  // The receiver's ack (cum + SACK bitmap) applied to the sender's scoreboard reports
  // exactly the packets that arrived, and leaves the holes in flight.
  SendScoreboard sb;
  const SendScoreboard::Time t0 = SendScoreboard::Time{} + std::chrono::seconds(1);
  for (uint64_t s = 0; s < 64; ++s) sb.OnSend(s, 100, t0);
  ReceiveWindow w;
  const std::set<uint64_t> holes = {3, 10, 11, 40, 63};
  std::set<uint64_t> arrived;
  for (uint64_t s = 0; s < 64; ++s) {
    if (holes.count(s)) continue;
    Arrive(w, s);
    arrived.insert(s);
  }
  ASSERT_EQ(w.cum(), 3u);
  std::vector<uint8_t> sack(kSpan / 8);
  const size_t n = w.Sack(sack.data(), sack.size());
  std::set<uint64_t> reported;
  ASSERT_TRUE(sb.OnAck(w.cum(), sack.data(), n,
                       [&](uint64_t seq, const SendScoreboard::Segment&) {
                         EXPECT_TRUE(reported.insert(seq).second) << "seq " << seq << " twice";
                       }));
  EXPECT_EQ(reported, arrived);
  EXPECT_EQ(sb.base(), 3u);
  EXPECT_EQ(sb.in_flight_packets(), holes.size());
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
