// The progress thread's wake-ups and teardown, through the Gloo API on our udp device (two
// ranks as threads): a datagram that arrives while the thread sleeps ends the sleep (not
// the timer); a thread blocked in waitRecv takes its datagrams in itself; an idle
// connected device stays under 5% of a core; destroyed contexts are released by the
// closing handshake, not by the quiet linger. Counters and CPU time only.
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/two_ranks.h"
#include "transport_dpdk/device.h"
#include "transport_dpdk/engine/engine.h"

namespace optireduce {
namespace {

using Clock = std::chrono::steady_clock;
using testing_ranks::Barrier;
using testing_ranks::Connect;
using testing_ranks::PrepostedPingPong;
using testing_ranks::Rank;

// Long timer sleeps: a message that waited for the timer would show up in late_inputs.
TEST(ProgressWakeup, ArrivalEndsTheSleepNotTheTimer) {
  transport::EngineOptions engine;
  engine.max_sleep = std::chrono::milliseconds(200);
  engine.input_spin = std::chrono::microseconds(0);  // every wait is a sleep
  // Liveness checks are timers too (a posted receive's source is first judged
  // dead_after / 1000 later): with a 60 s bound they come 50 ms apart, so the sleeps
  // measured here end by an arrival or not at all.
  engine.peer_dead = std::chrono::seconds(60);
  auto ranks = Connect(engine);
  ASSERT_EQ(ranks.size(), 2u);
  const auto before = ranks[1].device->stats();
  constexpr int kMessages = 200;
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto& ctx = ranks[i].context;
      int value = 0;
      auto buf = ctx->createUnboundBuffer(&value, sizeof(value));
      for (int m = 0; m < kMessages; ++m) {
        if (i == 0) {
          value = m;
          buf->send(1, 7);
          buf->waitSend();
          buf->recv(1, 8);
          buf->waitRecv();
          EXPECT_EQ(value, m + 1);
        } else {
          buf->recv(0, 7);
          buf->waitRecv();
          ++value;
          buf->send(0, 8);
          buf->waitSend();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto after = ranks[1].device->stats();
  const uint64_t woken = after.sleeps_woken_by_input - before.sleeps_woken_by_input;
  const uint64_t late = after.late_inputs - before.late_inputs;
  // Rank 1's progress thread has nothing to do between messages: it sleeps, and most
  // messages find it asleep. Each must end the sleep. A sleep that ended at a timer and
  // then found a datagram counts as late: a message that waited for the 200 ms timer, or
  // one that landed as a short timer fired (the liveness probe of a peer something is
  // pending with is due 1 ms after the last exchange, so in a ping-pong such timers fire
  // between messages: 6-9% of them here). If messages waited for the timer, nearly all
  // would be late.
  EXPECT_GE(woken, static_cast<uint64_t>(kMessages / 4)) << after.ToString();
  EXPECT_LE(late, static_cast<uint64_t>(kMessages / 5)) << after.ToString();
}

// Each message's ack rides on the CREDIT that answers it (the receiver took it; this
// completes the send), so a message costs its DATA, the CREDIT and about half an ACK
// instead of an ACK for each of the two — counters, not timings.
TEST(ProgressWakeup, AnswersCarryTheAck) {
  auto ranks = Connect(transport::EngineOptions());
  ASSERT_EQ(ranks.size(), 2u);
  constexpr int kMessages = 300;
  const transport::Stats d = PrepostedPingPong(ranks, kMessages);
  const uint64_t messages = 2 * kMessages;
  EXPECT_GE(d.acks_piggybacked, messages / 2) << d.ToString();
  EXPECT_LT(d.acks_sent, messages) << d.ToString();
}

// After work the progress thread spins input_spin before it sleeps, and each empty poll
// of the spin yields the core (the peer rank, on a host with fewer cores than busy
// threads, is what it waits for); with no spin it neither spins nor yields.
TEST(ProgressWakeup, SpinYieldsTheCoreOnEveryEmptyPoll) {
  {
    auto ranks = Connect(transport::EngineOptions());
    ASSERT_EQ(ranks.size(), 2u);
    const transport::Stats d = PrepostedPingPong(ranks, 200);
    EXPECT_GT(d.progress_yields, 0u) << d.ToString();
  }
  transport::EngineOptions no_spin;
  no_spin.input_spin = std::chrono::microseconds(0);
  auto ranks = Connect(no_spin);
  ASSERT_EQ(ranks.size(), 2u);
  const transport::Stats d = PrepostedPingPong(ranks, 200);
  EXPECT_EQ(d.progress_yields, 0u) << d.ToString();
}

// A thread blocked in waitRecv polls the device itself (waiter-driven receive): the
// datagrams that complete its receives are taken in by that thread, with no hand-off from
// the progress thread to it.
TEST(ProgressWakeup, WaitingThreadReceivesItself) {
  auto ranks = Connect(transport::EngineOptions());
  ASSERT_EQ(ranks.size(), 2u);
  const transport::Stats d = PrepostedPingPong(ranks, 200);
  EXPECT_GT(d.waiter_polls, 0u) << d.ToString();
  EXPECT_GT(d.rx_by_waiter, 0u) << d.ToString();
}

TEST(ProgressWakeup, IdleConnectedDeviceUsesUnderFivePercentOfACore) {
  auto ranks = Connect(transport::EngineOptions());
  ASSERT_EQ(ranks.size(), 2u);
  std::thread other([&] { Barrier(ranks[1].context); });
  Barrier(ranks[0].context);
  other.join();
  const double before = ranks[0].device->engine()->ProgressThreadCpuSeconds();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // idle: what is measured
  const double used = ranks[0].device->engine()->ProgressThreadCpuSeconds() - before;
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(used / wall, 0.05) << "idle connected progress thread used " << 100 * used / wall
                               << "% of a core";
  RecordProperty("idle_cpu_percent", std::to_string(100 * used / wall));
}

// Waits (bounded) until `engine` has released `n` destroyed contexts either way.
bool WaitReleased(const std::shared_ptr<transport::Engine>& engine, uint64_t n) {
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < until) {
    const auto s = engine->GetStats();
    if (s.closes_confirmed + s.closes_lingered >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// Both ranks pass a barrier, then rank 0 destroys its context first (rank 1's open context
// answers its probe), then rank 1 (rank 0's engine answers for the released context); each
// engine released its context either way. The two engines' counters after that.
std::vector<transport::Stats> DestroyInTurn(std::vector<Rank>& ranks) {
  std::thread other([&] { Barrier(ranks[1].context); });
  Barrier(ranks[0].context);
  other.join();
  auto e0 = ranks[0].device->engine();
  auto e1 = ranks[1].device->engine();
  ranks[0].context.reset();
  EXPECT_TRUE(WaitReleased(e0, 1));
  ranks[1].context.reset();
  EXPECT_TRUE(WaitReleased(e1, 1));
  return {e0->GetStats(), e1->GetStats()};
}

// Neither rank waits for the quiet linger.
TEST(ProgressWakeup, DestroyedContextsAreReleasedByTheClosingHandshake) {
  auto ranks = Connect(transport::EngineOptions());
  ASSERT_EQ(ranks.size(), 2u);
  for (const transport::Stats& s : DestroyInTurn(ranks)) {
    EXPECT_EQ(s.closes_confirmed, 1u) << s.ToString();
    EXPECT_EQ(s.closes_lingered, 0u) << s.ToString();
  }
}

// Every datagram is delayed up to 50 ms each way, so a close probe's answer comes many
// probe intervals later: the answer to any probe sent since the peer last sent data
// confirms the close (an engine that took only its latest probe's answer sent probes
// until one came back within an interval: hundreds, then lingered).
TEST(ProgressWakeup, CloseIsConfirmedWhenTheRoundTripExceedsTheProbeInterval) {
  auto ranks = Connect(transport::EngineOptions(), "delay_us=50000,seed=3");
  ASSERT_EQ(ranks.size(), 2u);
  for (const transport::Stats& s : DestroyInTurn(ranks)) {
    EXPECT_EQ(s.closes_confirmed, 1u) << s.ToString();
    EXPECT_EQ(s.closes_lingered, 0u) << s.ToString();
    // One probe per millisecond until an answer is back: at most two 50 ms delays.
    EXPECT_LT(s.close_probes_sent, 150u) << s.ToString();
  }
}

}  // namespace
}  // namespace optireduce
