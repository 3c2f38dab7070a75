// PollBackoff: what a polling thread does after each poll, with made-up times (no clock).
#include "transport_dpdk/engine/poll_backoff.h"

#include <gtest/gtest.h>

#include <vector>

namespace optireduce {
namespace transport {
namespace {

using Clock = PollBackoff::Clock;
using us = PollBackoff::us;
using Next = PollBackoff::Next;

constexpr std::chrono::milliseconds kLiveness{50};
const Clock::time_point kT0{};

EngineOptions Options() {
  EngineOptions o;
  o.spin = us(100);
  o.input_spin = us(50);
  o.max_sleep = us(1000);
  o.idle_sleep = us(4000);
  return o;
}

// The sleeps of empty polls, each at `at` after the last work, with the next timer far off.
std::vector<int64_t> Sleeps(PollBackoff& b, const std::vector<us>& at) {
  std::vector<int64_t> out;
  for (us t : at) {
    us wait{0};
    EXPECT_EQ(b.After(kT0 + t, false, kT0 + std::chrono::seconds(10), &wait), Next::kSleep);
    out.push_back(wait.count());
  }
  return out;
}

TEST(PollBackoff, WorkPollsAgainThenTheSpinYields) {
  PollBackoff b(Options(), /*wakes_on_input=*/false, kLiveness, kT0);
  us wait{0};
  EXPECT_EQ(b.After(kT0 + us(10), true, kT0 + std::chrono::seconds(1), &wait), Next::kPollNow);
  EXPECT_EQ(b.After(kT0 + us(60), false, kT0 + std::chrono::seconds(1), &wait), Next::kYield);
  EXPECT_EQ(b.After(kT0 + us(109), false, kT0 + std::chrono::seconds(1), &wait), Next::kYield);
  EXPECT_EQ(b.After(kT0 + us(110), false, kT0 + std::chrono::seconds(1), &wait), Next::kSleep);
}

TEST(PollBackoff, TimerOnlySleepsDoubleUpToMaxSleepThenIdleSleep) {
  PollBackoff b(Options(), /*wakes_on_input=*/false, kLiveness, kT0);
  EXPECT_EQ(Sleeps(b, {us(200), us(300), us(400), us(500), us(600), us(700), us(800), us(900)}),
            (std::vector<int64_t>{16, 32, 64, 128, 256, 512, 1000, 1000}));
  // Idle (100 ms without work): idle_sleep (the doubling went on under the max_sleep cap).
  EXPECT_EQ(Sleeps(b, {us(99000), us(100000), us(110000)}),
            (std::vector<int64_t>{1000, 4000, 4000}));
  // Work starts the backoff over.
  us wait{0};
  EXPECT_EQ(b.After(kT0 + us(200000), true, kT0 + std::chrono::seconds(10), &wait),
            Next::kPollNow);
  EXPECT_EQ(Sleeps(b, {us(200200)}), (std::vector<int64_t>{16}));
}

TEST(PollBackoff, InputWakingSleepsUntilTheTimerAtMostMaxSleepOrLivenessOnceIdle) {
  PollBackoff b(Options(), /*wakes_on_input=*/true, kLiveness, kT0);
  us wait{0};
  EXPECT_EQ(b.After(kT0 + us(40), false, kT0 + std::chrono::seconds(1), &wait), Next::kYield);
  EXPECT_EQ(Sleeps(b, {us(60), us(70)}), (std::vector<int64_t>{1000, 1000}));
  EXPECT_EQ(Sleeps(b, {us(100000)}), (std::vector<int64_t>{50000}));
  // A timer due sooner bounds the sleep (1 µs past it); one due now is polled at once.
  EXPECT_EQ(b.After(kT0 + us(100000), false, kT0 + us(100300), &wait), Next::kSleep);
  EXPECT_EQ(wait.count(), 301);
  EXPECT_EQ(b.After(kT0 + us(100000), false, kT0 + us(100000), &wait), Next::kPollNow);
}

TEST(PollBackoff, RestartSpinsAgain) {
  PollBackoff b(Options(), /*wakes_on_input=*/false, kLiveness, kT0);
  EXPECT_EQ(Sleeps(b, {us(500)}), (std::vector<int64_t>{16}));
  b.Restart(kT0 + us(600));
  us wait{0};
  EXPECT_EQ(b.After(kT0 + us(650), false, kT0 + std::chrono::seconds(1), &wait), Next::kYield);
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
