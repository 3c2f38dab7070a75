// BoundedReceiver's repair requests: holes are asked for at once; the tail of a region whose
// sender is still streaming is not (it is on its way), until that sender has been quiet for
// the streaming window.
#include "transport_dpdk/bounded/bounded_receiver.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

namespace optireduce {
namespace transport {
namespace {

using Clock = BoundedClock;

struct Request {
  Clock::time_point at;
  int peer;
  std::vector<std::pair<size_t, size_t>> missing;
};

class RepairLog {
 public:
  BoundedReceiver::RepairRequest Callback() {
    return [this](int peer, uint64_t, const std::vector<ByteRange>& missing) {
      std::lock_guard<std::mutex> lock(mu_);
      Request r{Clock::now(), peer, {}};
      for (const ByteRange& m : missing) r.missing.emplace_back(m.begin, m.end);
      log_.push_back(r);
    };
  }
  std::vector<Request> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }

 private:
  std::mutex mu_;
  std::vector<Request> log_;
};

TEST(BoundedReceiverRepair, AsksAStreamingSenderOnlyForHolesThenForTheTailOnceItIsQuiet) {
  BoundedReceiver::Options options;
  options.streaming_window = std::chrono::milliseconds(20);
  BoundedReceiver receiver(options);
  std::vector<char> dst1(1000), dst2(1000);
  RepairLog log;
  auto rx = receiver.Post(7, {{1, dst1.data(), dst1.size()}, {2, dst2.data(), dst2.size()}},
                          log.Callback());
  std::vector<char> bytes(1000, 'x');
  // Peer 1: [0, 200) and [300, 400) so far, still sending. Peer 2 sent nothing yet.
  receiver.OnData(7, 1, 0, bytes.data(), 200, /*last=*/false);
  receiver.OnData(7, 1, 300, bytes.data(), 100, /*last=*/false);
  const auto start = Clock::now();
  // Repairs re-ask every deadline/8 (here ~10 ms) until the deadline: 80 ms.
  EXPECT_EQ(rx->Repair(start + std::chrono::milliseconds(80), std::chrono::milliseconds(80)),
            PhaseEnd::kDeadline);
  const std::vector<Request> requests = log.Get();
  bool hole_only = false, tail_later = false, peer2_whole = false;
  for (const Request& r : requests) {
    const auto since = r.at - start;
    if (r.peer == 1 && since < std::chrono::milliseconds(15)) {
      // Within the window of its last payload: the hole only.
      EXPECT_EQ(r.missing, (std::vector<std::pair<size_t, size_t>>{{200, 300}}));
      hole_only = true;
    }
    if (r.peer == 1 && since > std::chrono::milliseconds(25)) {
      EXPECT_EQ(r.missing, (std::vector<std::pair<size_t, size_t>>{{200, 300}, {400, 1000}}));
      tail_later = true;
    }
    // A sender never heard from is asked for everything from the first request on.
    if (r.peer == 2) {
      EXPECT_EQ(r.missing, (std::vector<std::pair<size_t, size_t>>{{0, 1000}}));
      peer2_whole = true;
    }
  }
  EXPECT_TRUE(hole_only);
  EXPECT_TRUE(tail_later);
  EXPECT_TRUE(peer2_whole);
}

TEST(BoundedReceiverRepair, ASenderWhoseLastPacketsArrivedIsAskedForTheWholeRest) {
  BoundedReceiver receiver;  // default 5 ms window
  std::vector<char> dst(1000);
  RepairLog log;
  auto rx = receiver.Post(9, {{1, dst.data(), dst.size()}}, log.Callback());
  std::vector<char> bytes(1000, 'y');
  receiver.OnData(9, 1, 0, bytes.data(), 500, /*last=*/false);
  receiver.OnData(9, 1, 900, bytes.data(), 100, /*last=*/true);  // its last packet: done
  rx->Repair(Clock::now() + std::chrono::milliseconds(8), std::chrono::milliseconds(8));
  const std::vector<Request> requests = log.Get();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.front().missing, (std::vector<std::pair<size_t, size_t>>{{500, 900}}));
}

// A straggler given up in phase 1 is not waited for in phase 2 (BoundedReceive::GiveUp).
TEST(BoundedReceiverGiveUp, WaitEndsWhenTheOthersAreInAndTheStragglerIsNotAsked) {
  BoundedReceiver receiver;
  std::vector<char> dst1(1000), dst2(1000), dst3(1000);
  RepairLog log;
  auto rx = receiver.Post(11, {{1, dst1.data(), 1000}, {2, dst2.data(), 1000},
                               {3, dst3.data(), 1000}}, log.Callback());
  std::vector<char> bytes(1000, 'z');
  receiver.OnData(11, 1, 0, bytes.data(), 1000, /*last=*/true);
  rx->GiveUp(3);
  // Peer 2 arrives 30 ms from now; the phase's deadline is 2 s away.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    receiver.OnData(11, 2, 0, bytes.data(), 1000, /*last=*/true);
  });
  const auto start = Clock::now();
  const PhaseEnd end = rx->Wait(start + std::chrono::seconds(2), std::chrono::seconds(1), 2.0);
  const auto took = Clock::now() - start;
  late.join();
  EXPECT_EQ(end, PhaseEnd::kPeerTimeout);  // cut: region 3 stays missing
  EXPECT_GE(took, std::chrono::milliseconds(25));  // waited for peer 2...
  EXPECT_LT(took, std::chrono::milliseconds(900));  // ...not for 3 (nor the quiet period)
  EXPECT_EQ(rx->Arrived(1).size(), 1u);
  EXPECT_TRUE(rx->Arrived(2).empty());
  // A repair asks nobody (1 and 2 are complete, 3 given up) and returns at once.
  const auto repair_start = Clock::now();
  EXPECT_EQ(rx->Repair(repair_start + std::chrono::seconds(2), std::chrono::seconds(1)),
            PhaseEnd::kDeadline);
  EXPECT_LT(Clock::now() - repair_start, std::chrono::milliseconds(500));
  for (const Request& r : log.Get()) EXPECT_NE(r.peer, 3);
}

TEST(BoundedReceiverGiveUp, FirstArrivalIsWhenTheFirstPayloadCameOrThePostForStagedData) {
  BoundedReceiver receiver;
  std::vector<char> bytes(100, 'a');
  receiver.OnData(12, 1, 0, bytes.data(), 100, /*last=*/true);  // staged: op 12 not posted
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<char> dst1(100), dst2(100);
  const auto posted = Clock::now();
  auto rx = receiver.Post(12, {{1, dst1.data(), 100}, {2, dst2.data(), 100}}, nullptr);
  ASSERT_TRUE(rx->FirstArrival(0).has_value());
  EXPECT_GE(*rx->FirstArrival(0), posted);  // staged data counts from the post
  EXPECT_FALSE(rx->FirstArrival(1).has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto before = Clock::now();
  receiver.OnData(12, 2, 0, bytes.data(), 50, /*last=*/false);
  receiver.OnData(12, 2, 50, bytes.data(), 50, /*last=*/true);
  ASSERT_TRUE(rx->FirstArrival(1).has_value());
  EXPECT_GE(*rx->FirstArrival(1), before);
  EXPECT_LE(*rx->FirstArrival(1), Clock::now());
  EXPECT_FALSE(rx->FirstArrival(5).has_value());  // no such region
}

// The unstarted cutoff (a decider's start grace): a region that received nothing by then
// does not hold the wait, and what its sender sends afterwards still lands, until the
// region is given up; a region that has started holds the wait as before.
TEST(BoundedReceiverCutoff, ARegionWithNothingByTheCutoffEndsTheWaitAndStillLandsUntilGivenUp) {
  BoundedReceiver receiver;
  std::vector<char> dst1(100, 0), dst3(100, 0);
  auto rx = receiver.Post(21, {{1, dst1.data(), 100}, {3, dst3.data(), 100}}, nullptr);
  const std::vector<char> ones(100, 1), twos(100, 2);
  receiver.OnData(21, 1, 0, ones.data(), 100, /*last=*/true);
  const auto start = Clock::now();
  // The deadline and the quiet period are far away: only the cutoff (passed) ends it.
  EXPECT_EQ(rx->Wait(start + std::chrono::seconds(60), std::chrono::hours(1), 0,
                     /*unstarted_cutoff=*/start),
            PhaseEnd::kPeerTimeout);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  // Peer 3 starts after the wait: its payload is written (a decider may count it).
  receiver.OnData(21, 3, 0, twos.data(), 50, /*last=*/false);
  ASSERT_EQ(rx->Arrived(1).size(), 1u);
  EXPECT_EQ(rx->Arrived(1)[0].end, 50u);
  EXPECT_EQ(dst3[0], 2);
  EXPECT_EQ(receiver.counters().stale_packets, 0u);
  // Given up: no more writes.
  rx->GiveUp(3);
  receiver.OnData(21, 3, 50, twos.data(), 50, /*last=*/true);
  EXPECT_EQ(dst3[99], 0);
  EXPECT_EQ(receiver.counters().stale_packets, 1u);
  // Region 1 was complete when the wait ended: it is read, never written again.
  receiver.OnData(21, 1, 0, twos.data(), 100, /*last=*/true);
  EXPECT_EQ(dst1, ones);
}

TEST(BoundedReceiverCutoff, ARegionThatStartedAfterTheCutoffDoesNotHoldTheWait) {
  BoundedReceiver receiver;
  std::vector<char> dst1(100, 0), dst3(100, 0);
  auto rx = receiver.Post(24, {{1, dst1.data(), 100}, {3, dst3.data(), 100}}, nullptr);
  const std::vector<char> ones(100, 1), twos(100, 2);
  receiver.OnData(24, 1, 0, ones.data(), 100, /*last=*/true);
  const auto cutoff = Clock::now();
  // Peer 3's first payload comes after the cutoff (the clock is monotonic): a straggler
  // that starts while the decider still waits for the others is as late as one that has
  // not started yet.
  while (Clock::now() == cutoff) {
  }
  receiver.OnData(24, 3, 0, twos.data(), 10, /*last=*/false);
  ASSERT_TRUE(rx->FirstArrival(1).has_value());
  EXPECT_GT(*rx->FirstArrival(1), cutoff);
  const auto start = Clock::now();
  EXPECT_EQ(rx->Wait(start + std::chrono::seconds(60), std::chrono::hours(1), 0, cutoff),
            PhaseEnd::kPeerTimeout);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  // Its region stays open: the rest lands in place (a decider may count it once complete).
  receiver.OnData(24, 3, 10, twos.data(), 90, /*last=*/true);
  EXPECT_EQ(dst3, twos);
  EXPECT_EQ(receiver.counters().stale_packets, 0u);
}

TEST(BoundedReceiverCutoff, AStartedRegionHoldsTheWaitAndWithoutACutoffNothingLandsAfterIt) {
  BoundedReceiver receiver;
  std::vector<char> dst1(100, 0), dst2(100, 0), dst3(100, 0);
  auto rx = receiver.Post(22, {{1, dst1.data(), 100}, {2, dst2.data(), 100}}, nullptr);
  const std::vector<char> ones(100, 1);
  receiver.OnData(22, 1, 0, ones.data(), 100, /*last=*/true);
  receiver.OnData(22, 2, 0, ones.data(), 10, /*last=*/false);  // started, not complete
  const auto start = Clock::now();
  EXPECT_EQ(rx->Wait(start + std::chrono::milliseconds(30), std::chrono::hours(1), 0,
                     /*unstarted_cutoff=*/start),
            PhaseEnd::kDeadline);  // held by region 2 until the deadline
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(30));
  receiver.OnData(22, 2, 10, ones.data(), 90, /*last=*/true);
  EXPECT_EQ(dst2[10], 0) << "a started region was written after its wait";
  // No cutoff: a region with nothing is not held open either.
  auto later = receiver.Post(23, {{1, dst1.data(), 100}, {3, dst3.data(), 100}}, nullptr);
  receiver.OnData(23, 1, 0, ones.data(), 100, /*last=*/true);
  EXPECT_EQ(later->Wait(Clock::now() + std::chrono::milliseconds(10), std::chrono::hours(1), 0),
            PhaseEnd::kDeadline);
  receiver.OnData(23, 3, 0, ones.data(), 100, /*last=*/true);
  EXPECT_EQ(dst3[0], 0);
  EXPECT_EQ(receiver.counters().stale_packets, 2u);
}

// Staging (packets of operations this rank has not posted yet: it is behind).
void Stage(BoundedReceiver& r, uint64_t op, int src, size_t bytes, size_t packet = 100) {
  std::vector<char> data(packet, static_cast<char>(op));
  for (size_t at = 0; at < bytes; at += packet) {
    r.OnData(op, src, at, data.data(), std::min(packet, bytes - at), at + packet >= bytes);
  }
}

TEST(BoundedReceiverStaging, GrowsToHoldWholePostsOfTheLargestSizePosted) {
  BoundedReceiver::Options options;
  options.staging_bytes = 1000;
  options.staged_posts = 4;
  BoundedReceiver receiver(options);
  std::vector<char> dst(1500);
  { auto rx = receiver.Post(1, {{1, dst.data(), 1500}}, nullptr); }  // largest post: 1500
  // A peer one operation ahead: 3000 bytes of op 2 (and their bookkeeping) must all be
  // kept (limit 4 x 1500).
  Stage(receiver, 2, 1, 1500, 500);
  Stage(receiver, 2, 2, 1500, 500);
  EXPECT_EQ(receiver.counters().staging_overflow_packets, 0u);
  std::vector<char> a(1500), b(1500);
  auto rx = receiver.Post(2, {{1, a.data(), 1500}, {2, b.data(), 1500}}, nullptr);
  EXPECT_EQ(rx->Wait(Clock::now() + std::chrono::seconds(1), std::chrono::microseconds(1000), 0),
            PhaseEnd::kComplete);
}

TEST(BoundedReceiverStaging, WhenFullKeepsWhatThisRankPostsNextAndDropsTheNewcomer) {
  BoundedReceiver::Options options;
  options.staging_bytes = 2000 + 20 * BoundedReceiver::kStagedPacketCost;
  options.staged_posts = 1;
  BoundedReceiver receiver(options);
  Stage(receiver, 5, 1, 2000);  // the operation this rank posts next: fills staging
  Stage(receiver, 6, 1, 500);   // a later one: no room, dropped
  EXPECT_EQ(receiver.counters().staging_overflow_packets, 5u);
  std::vector<char> dst(2000);
  auto rx = receiver.Post(5, {{1, dst.data(), 2000}}, nullptr);
  EXPECT_EQ(rx->Wait(Clock::now() + std::chrono::seconds(1), std::chrono::microseconds(1000), 0),
            PhaseEnd::kComplete);
  EXPECT_EQ(dst[1999], 5);
}

TEST(BoundedReceiverStaging, DataOlderThanTheMaximumAgeMakesRoom) {
  BoundedReceiver::Options options;
  options.staging_bytes = 2000 + 20 * BoundedReceiver::kStagedPacketCost;
  options.staged_posts = 1;
  options.staged_max_age = std::chrono::milliseconds(20);
  BoundedReceiver receiver(options);
  Stage(receiver, 8, 1, 2000);  // never posted here: garbage once old
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  Stage(receiver, 9, 1, 500);
  EXPECT_EQ(receiver.counters().staging_overflow_packets, 20u);  // op 8's packets, evicted
  std::vector<char> dst(500);
  auto rx = receiver.Post(9, {{1, dst.data(), 500}}, nullptr);
  EXPECT_EQ(rx->Wait(Clock::now() + std::chrono::seconds(1), std::chrono::microseconds(1000), 0),
            PhaseEnd::kComplete);
}

size_t RssBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// A peer (buggy or hostile) floods bounded packets of operations this rank never posts:
// empty and 1-byte ones, which a byte-only limit let through at no cost. Staging stays
// within its limit and the counters say what was dropped.
TEST(BoundedReceiverStaging, AFloodOfTinyPacketsStaysWithinTheLimitAndIsCounted) {
  BoundedReceiver::Options options;  // the defaults the transport uses
  BoundedReceiver receiver(options);
  const char byte = 1;
  const size_t rss_before = RssBytes();
  constexpr uint64_t kPackets = 1000000;
  for (uint64_t i = 0; i < kPackets; i++) {
    // Ops spread over many ids (a new op every 64 packets), half of the packets empty.
    receiver.OnData(1000 + i / 64, static_cast<int>(i % 3), i, &byte, i % 2, false);
  }
  const size_t rss_after = RssBytes();
  const BoundedReceiverCounters c = receiver.counters();
  EXPECT_LE(receiver.staged_bytes(), options.staging_bytes);
  EXPECT_LE(receiver.staged_packets(), options.max_staged_packets);
  EXPECT_EQ(c.staged_packets, receiver.staged_packets());
  EXPECT_EQ(c.staged_packets + c.staging_overflow_packets, kPackets);
  EXPECT_GT(c.staging_overflow_packets, 0u);
  EXPECT_LE(c.staging_overflow_bytes, kPackets / 2);
  // Within the staging limit as charged (payload + bookkeeping per packet).
  EXPECT_LT(rss_after, rss_before + options.staging_bytes) << rss_before << " -> " << rss_after;
  // Operations count too: at most max_staged_ops of them hold packets.
  BoundedReceiver::Options few;
  few.max_staged_ops = 4;
  BoundedReceiver small(few);
  for (uint64_t op = 0; op < 10; op++) small.OnData(op, 1, 0, &byte, 0, true);
  EXPECT_EQ(small.staged_packets(), 4u);
  EXPECT_EQ(small.counters().staging_overflow_packets, 6u);
}

// The transport's liveness reports a peer gone: a wait for its data ends at once with
// kPeerFailed and its region says why; the others' data is still applied; receives posted
// later fail at once too, and its late packets are dropped and counted.
TEST(BoundedReceiverFailure, AFailedPeerEndsTheWaitWithItsStatus) {
  BoundedReceiver receiver;
  std::vector<char> a(100), b(100);
  auto rx = receiver.Post(1, {{1, a.data(), 100}, {2, b.data(), 100}}, nullptr);
  const std::vector<char> data(100, 7);
  receiver.OnData(1, 1, 0, data.data(), 100, true);
  std::thread fail([&] { receiver.FailPeer(2, absl::UnavailableError("no heartbeat for 2 s")); });
  EXPECT_EQ(rx->Wait(Clock::now() + std::chrono::seconds(60), std::chrono::hours(1), 0),
            PhaseEnd::kPeerFailed);
  fail.join();
  EXPECT_TRUE(rx->PeerStatus(0).ok());
  EXPECT_EQ(rx->PeerStatus(1).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(rx->Repair(Clock::now() + std::chrono::seconds(60), std::chrono::hours(1)),
            PhaseEnd::kPeerFailed);
  rx.reset();
  auto later = receiver.Post(3, {{2, b.data(), 100}}, nullptr);
  EXPECT_EQ(later->Wait(Clock::now() + std::chrono::seconds(60), std::chrono::hours(1), 0),
            PhaseEnd::kPeerFailed);
  receiver.OnData(3, 2, 0, data.data(), 100, true);
  EXPECT_EQ(receiver.counters().failed_peer_packets, 1u);
}

// Sizes: a payload whose sender's source is not the region posted for it, or whose stated
// allreduce size is not this rank's, is never written; the receive fails at once naming
// both sizes, and the peers are told once.
TEST(BoundedReceiverSizes, AShorterSourceIsRefusedCountedAndEndsTheWaitAtOnce) {
  BoundedReceiver receiver;
  std::vector<char> a(200, 0);
  int notices = 0;
  auto rx = receiver.Post(5, {{1, a.data(), 200}}, nullptr, /*op_bytes=*/400,
                          [&](uint64_t op) {
                            EXPECT_EQ(op, 5u);
                            notices++;
                          });
  const std::vector<char> data(100, 7);
  receiver.OnData(5, 1, 0, data.data(), 100, /*last=*/true, false, /*total=*/100,
                  /*op_bytes=*/0);
  EXPECT_EQ(rx->Wait(Clock::now() + std::chrono::seconds(60), std::chrono::hours(1), 0),
            PhaseEnd::kPeerFailed);
  EXPECT_EQ(a, std::vector<char>(200, 0)) << "a refused payload was written";
  const absl::Status sizes = rx->SizeAgreement();
  EXPECT_EQ(sizes.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sizes.message().find("100"), absl::string_view::npos) << sizes;
  EXPECT_NE(sizes.message().find("200"), absl::string_view::npos) << sizes;
  EXPECT_EQ(rx->Repair(Clock::now() + std::chrono::seconds(60), std::chrono::hours(1)),
            PhaseEnd::kPeerFailed);
  EXPECT_EQ(notices, 1);
  EXPECT_EQ(receiver.counters().size_mismatch_packets, 1u);
  EXPECT_EQ(receiver.counters().applied_packets, 0u);
}

TEST(BoundedReceiverSizes, ANoticeOfAnotherSizeFailsAReceiveWithoutARegionForItsSender) {
  BoundedReceiver receiver;
  std::vector<char> a(100);
  auto rx = receiver.Post(6, {{1, a.data(), 100}}, nullptr, /*op_bytes=*/300);
  // Rank 2 sends this rank nothing in this phase; its notice states its allreduce size.
  receiver.OnData(6, 2, 0, nullptr, 0, false, false, /*total=*/0, /*op_bytes=*/200);
  EXPECT_EQ(rx->Wait(Clock::now() + std::chrono::seconds(60), std::chrono::hours(1), 0),
            PhaseEnd::kPeerFailed);
  const absl::Status sizes = rx->SizeAgreement();
  EXPECT_NE(sizes.message().find("rank 2 allreduces 200 bytes, this rank 300"),
            absl::string_view::npos)
      << sizes;
  EXPECT_EQ(receiver.counters().unknown_peer_packets, 0u);
}

TEST(BoundedReceiverSizes, AgreeingSizesAndNoticesChangeNothing) {
  BoundedReceiver receiver;
  std::vector<char> a(100);
  auto rx = receiver.Post(7, {{1, a.data(), 100}}, nullptr, /*op_bytes=*/300);
  receiver.OnData(7, 2, 0, nullptr, 0, false, false, /*total=*/0, /*op_bytes=*/300);
  const std::vector<char> data(100, 7);
  receiver.OnData(7, 1, 0, data.data(), 100, true, false, /*total=*/100, /*op_bytes=*/300);
  EXPECT_EQ(rx->Wait(Clock::now() + std::chrono::seconds(60), std::chrono::hours(1), 0),
            PhaseEnd::kComplete);
  EXPECT_TRUE(rx->SizeAgreement().ok());
  EXPECT_EQ(a, data);
  EXPECT_EQ(receiver.counters().size_mismatch_packets, 0u);
}

TEST(BoundedReceiverSizes, AStagedPayloadOfAnotherSizeFailsTheReceiveAtItsPost) {
  BoundedReceiver receiver;
  const std::vector<char> data(100, 7);
  receiver.OnData(8, 1, 0, data.data(), 100, true, false, /*total=*/100, /*op_bytes=*/800);
  std::vector<char> a(100, 0);
  auto rx = receiver.Post(8, {{1, a.data(), 100}}, nullptr, /*op_bytes=*/400);
  EXPECT_EQ(rx->SizeAgreement().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rx->Wait(Clock::now() + std::chrono::seconds(60), std::chrono::hours(1), 0),
            PhaseEnd::kPeerFailed);
  EXPECT_EQ(a, std::vector<char>(100, 0));
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
