// A failed context, as Gloo's TCP transport has it (signalException): a wait that times
// out fails the whole context — every pending and later operation raises
// gloo::IoException, a late message never lands in the buffer given up on, the peer
// learns of it (its operations raise too, naming this rank) — and nothing of it carries
// over to the next context on the same devices. Ranks are threads with loop devices.
#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "algorithms/bounded_channel.h"
#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/device.h"
#include "transport_dpdk/reliable/peer_liveness.h"

namespace optireduce {
namespace testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

void SumFn(void* c, const void* a, const void* b, size_t n) { gloo::sum<int32_t>(c, a, b, n); }

std::string Allreduce(const std::shared_ptr<gloo::Context>& ctx) {
  std::vector<int32_t> v(1000, ctx->rank + 1);
  gloo::AllreduceOptions o(ctx);
  o.setOutput(v.data(), v.size());
  o.setReduceFunction(&SumFn);
  gloo::allreduce(o);
  const int32_t want = ctx->size * (ctx->size + 1) / 2;
  return std::all_of(v.begin(), v.end(), [&](int32_t x) { return x == want; })
             ? "" : "allreduce on the next context gave a wrong sum";
}

TEST(ContextFailure, TimeoutFailsTheContextLateDataNeverLandsNextContextWorks) {
  gloo::rendezvous::HashStore base;
  gloo::rendezvous::PrefixStore first("first", base), second("second", base);
  std::promise<void> gave_up, peer_raised;
  std::shared_future<void> gave_up_f = gave_up.get_future().share();
  std::shared_future<void> peer_raised_f = peer_raised.get_future().share();
  std::string errors[2];
  auto rank0 = [&] {
    auto dev = transport::loop::CreateDevice({});
    auto ctx = ConnectContext(first, dev, 0, 2, std::chrono::seconds(30));
    std::vector<uint8_t> buf(4096, 0xAA);
    auto ub = ctx->createUnboundBuffer(buf.data(), buf.size());
    ub->recv(1, 5);
    try {
      ub->waitRecv(nullptr, milliseconds(100));
      errors[0] = "waitRecv did not time out";
    } catch (const gloo::IoException&) {
    }
    gave_up.set_value();
    peer_raised_f.wait();  // rank 1 sent on slot 5 and learned that this context failed
    auto* tdev = dynamic_cast<transport::Device*>(dev.get());
    // Its message arrived and was dropped, not written.
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (tdev->stats().failed_context == 0 && Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    if (tdev->stats().failed_context == 0) errors[0] += " the late message never arrived;";
    if (std::any_of(buf.begin(), buf.end(), [](uint8_t b) { return b != 0xAA; })) {
      errors[0] += " a late message landed in the buffer given up on;";
    }
    // A later recv on the same slot, and a send, raise at once (no misdelivery).
    ub->recv(1, 5);
    try {
      ub->waitRecv(nullptr, std::chrono::seconds(20));
      errors[0] += " a recv after the timeout completed;";
    } catch (const gloo::IoException& e) {
      if (std::string(e.what()).find("timed out") == std::string::npos) {
        errors[0] += std::string(" unexpected reason: ") + e.what() + ";";
      }
    }
    ub->send(1, 6);
    try {
      ub->waitSend(nullptr, std::chrono::seconds(20));
      errors[0] += " a send after the timeout completed;";
    } catch (const gloo::IoException&) {
    }
    auto next = ConnectContext(second, dev, 0, 2, std::chrono::seconds(30));
    errors[0] += Allreduce(next);
  };
  auto rank1 = [&] {
    auto dev = transport::loop::CreateDevice({});
    auto ctx = ConnectContext(first, dev, 1, 2, std::chrono::seconds(30));
    gave_up_f.wait();
    std::vector<uint8_t> late(4096, 0x11);
    auto ub = ctx->createUnboundBuffer(late.data(), late.size());
    ub->send(0, 5);
    try {
      ub->waitSend(nullptr, std::chrono::seconds(60));
      errors[1] = "a send to a failed context completed";
    } catch (const gloo::IoException& e) {
      if (std::string(e.what()).find("peer rank 0") == std::string::npos) {
        errors[1] = std::string("the error does not name rank 0: ") + e.what();
      }
    }
    peer_raised.set_value();
    auto next = ConnectContext(second, dev, 1, 2, std::chrono::seconds(30));
    errors[1] += Allreduce(next);
  };
  auto guarded = [&](int r, const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      errors[r] += std::string(" exception: ") + e.what();
    }
  };
  std::thread t0([&] { guarded(0, rank0); }), t1([&] { guarded(1, rank1); });
  t0.join();
  t1.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// A context that fails on one peer fails every bounded wait of the context, not only the
// waits for that peer's data: a failed context applies nothing more from any peer, so a
// bounded receive still waiting for a live peer's data would otherwise wait out its whole
// deadline and then blame the live peer. Rank 2's wait times out, its context fails and
// closes its connection; rank 0, waiting in a bounded receive for rank 1's data (rank 1 is
// alive and silent) with a Gloo recv from rank 2 pending, fails on rank 2: its bounded
// wait ends before its deadline with the failure that names rank 2.
TEST(ContextFailure, AFailureOnOnePeerEndsTheBoundedWaitsForEveryPeer) {
  gloo::rendezvous::HashStore store;
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_done_f = rank0_done.get_future().share();
  std::string errors[3];
  constexpr uint64_t kOp = 0x2000;  // even: phase 1 (BoundedOpId)
  auto rank0 = [&](const std::shared_ptr<gloo::Context>& ctx) {
    BoundedChannel* channel = BoundedChannelOf(*ctx);
    if (channel == nullptr) {
      errors[0] = "the loop device offers no bounded channel";
      return;
    }
    std::vector<uint8_t> from1(4096, 0), from2(64, 0);
    auto ub = ctx->createUnboundBuffer(from2.data(), from2.size());
    ub->recv(2, 7);  // pending with rank 2: its closing is judged at once
    channel->BeginOperation(kOp, from1.size());
    auto rx = channel->PostReceive(kOp, {BoundedRegion{1, from1.data(), from1.size()}});
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    const PhaseEnd end = rx->Wait(deadline, std::chrono::microseconds(0), 0);
    if (Clock::now() >= deadline) errors[0] += " the bounded wait ran to its deadline;";
    if (end != PhaseEnd::kPeerFailed) {
      errors[0] += std::string(" the wait ended ") + PhaseEndName(end) + ", not peer-failed;";
    }
    const absl::Status status = rx->PeerStatus(0);
    if (status.ok()) {
      errors[0] += " rank 1's region is not failed;";
    } else if (status.message().find("rank 2") == absl::string_view::npos) {
      errors[0] += " the failure does not name rank 2: " + status.ToString() + ";";
    }
    rx.reset();
    channel->Release(kOp);
    rank0_done.set_value();
  };
  auto rank1 = [&](const std::shared_ptr<gloo::Context>&) { rank0_done_f.wait(); };
  auto rank2 = [&](const std::shared_ptr<gloo::Context>& ctx) {
    std::vector<uint8_t> buf(64, 0);
    auto ub = ctx->createUnboundBuffer(buf.data(), buf.size());
    ub->recv(1, 8);  // rank 1 never sends: the wait times out and fails the context
    try {
      ub->waitRecv(nullptr, milliseconds(100));
      errors[2] = "waitRecv did not time out";
    } catch (const gloo::IoException&) {
    }
    rank0_done_f.wait();
  };
  const std::function<void(const std::shared_ptr<gloo::Context>&)> bodies[3] = {rank0, rank1,
                                                                                   rank2};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; r++) {
    threads.emplace_back([&, r] {
      try {
        auto dev = transport::loop::CreateDevice({});
        auto ctx = ConnectContext(store, dev, r, 3, std::chrono::seconds(30));
        bodies[r](ctx);
      } catch (const std::exception& e) {
        errors[r] += std::string(" exception: ") + e.what();
      }
      if (r == 0 && rank0_done_f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        rank0_done.set_value();  // rank 0 failed before its end: do not leave the others waiting
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; r++) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The liveness rule itself (reliable/peer_liveness.h), on a synthetic clock.
TEST(PeerLiveness, ProbesThenDeclaresASilentPendingPeerGoneAndNeverAnIdleOne) {
  using V = transport::PeerLiveness::Verdict;
  transport::PeerLiveness l(milliseconds(1000));
  const auto t0 = Clock::time_point() + std::chrono::hours(1);
  l.Connected(t0);
  EXPECT_EQ(l.Check(t0 + std::chrono::seconds(100), false), V::kIdle);  // idle for long: fine
  const auto busy = t0 + std::chrono::seconds(100);
  EXPECT_EQ(l.Check(busy, true), V::kProbe);  // silent since long ago: probe at once
  // Quiet after that probe: 8 more probes 1 ms apart (dead_after / 1000), then 2, 4, 8,
  // ... ms apart, never more than 125 ms (dead_after / 8).
  auto t = busy;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(l.Check(t + std::chrono::microseconds(999), true), V::kAlive) << i;
    t += milliseconds(1);
    EXPECT_EQ(l.Check(t, true), V::kProbe) << i;
  }
  for (int ms : {2, 4, 8, 16, 32, 64, 125, 125}) {
    EXPECT_EQ(l.NextProbe(), t + milliseconds(ms));
    EXPECT_EQ(l.Check(t + milliseconds(ms - 1), true), V::kAlive) << ms;
    t += milliseconds(ms);
    EXPECT_EQ(l.Check(t, true), V::kProbe) << ms;
  }
  // Answers to probes prove life but keep the long interval: no PING storm for a live,
  // slow peer.
  l.Heard(t, /*probe_answer=*/true);
  EXPECT_EQ(l.NextProbe(), t + milliseconds(125));
  EXPECT_EQ(l.Check(t + milliseconds(124), true), V::kAlive);
  // Data restarts the short interval: the quiet right after an exchange is probed soon.
  l.Heard(t + milliseconds(130));
  EXPECT_EQ(l.Check(t + milliseconds(130), true), V::kAlive);
  EXPECT_EQ(l.Check(t + milliseconds(131), true), V::kProbe);
  // Silence for dead_after (1 s) while pending: gone.
  EXPECT_EQ(l.Check(t + milliseconds(1129), true), V::kProbe);
  EXPECT_EQ(l.Check(t + milliseconds(1130), true), V::kDead);
  // A stall of this rank's own progress thread gives a fresh window.
  transport::PeerLiveness s(milliseconds(1000));
  s.Connected(t0);
  EXPECT_EQ(s.Check(t0, true), V::kAlive);
  s.Restart(t0 + milliseconds(5000));
  EXPECT_NE(s.Check(t0 + milliseconds(5500), true), V::kDead);
  EXPECT_EQ(s.Check(t0 + milliseconds(6000), true), V::kDead);
  // The network saying the address is unreachable: gone at once, once something is pending.
  transport::PeerLiveness u(milliseconds(1000));
  u.Connected(t0);
  u.Unreachable();
  EXPECT_EQ(u.Check(t0, false), V::kIdle);
  EXPECT_EQ(u.Check(t0 + milliseconds(1), true), V::kDead);
}

// A report that proves nothing (ProbeSoon: a forged or unverifiable ICMP) brings the next
// probe forward — at most one short interval after the last one — and never declares the
// peer gone; the regular schedule goes on as before.
TEST(PeerLiveness, AnUnprovenReportOnlyBringsTheNextProbeForward) {
  using V = transport::PeerLiveness::Verdict;
  transport::PeerLiveness l;  // no silence bound: probes 1 ms, then up to 125 ms apart
  const auto t0 = Clock::time_point() + std::chrono::hours(1);
  l.Connected(t0);
  l.Heard(t0);
  EXPECT_EQ(l.Check(t0, true), V::kAlive);
  // Well into the long intervals: the next regular probe is 125 ms after the last.
  auto t = t0;
  for (int i = 0; i < 40; ++i) {
    t = l.NextProbe();
    ASSERT_EQ(l.Check(t, true), V::kProbe) << i;
  }
  ASSERT_EQ(l.NextProbe(), t + milliseconds(125));
  l.ProbeSoon();
  EXPECT_EQ(l.NextProbe(), t + milliseconds(1));
  EXPECT_EQ(l.Check(t + std::chrono::microseconds(999), true), V::kAlive);
  EXPECT_EQ(l.Check(t + milliseconds(1), true), V::kProbe);  // the early probe
  EXPECT_EQ(l.NextProbe(), t + milliseconds(126));          // then the schedule as before
  EXPECT_EQ(l.Check(t + milliseconds(2), true), V::kAlive);
  EXPECT_FALSE(l.unreachable());
  // Nothing pending: no probe, and the request does not outlive it.
  l.ProbeSoon();
  EXPECT_EQ(l.Check(t + milliseconds(3), false), V::kIdle);
  EXPECT_EQ(l.Check(t + milliseconds(4), true), V::kAlive);
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
