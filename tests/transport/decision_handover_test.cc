// DecisionHandover: exactly one of a leader and its deputy decides an operation.
#include "transport_dpdk/bounded/decision_handover.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace optireduce {
namespace transport {
namespace {

constexpr uint64_t kOp = 0x1234;  // a phase-1 id (even); kOp + 1 is its phase 2

TEST(DecisionHandover, ALeaderThatHasNotBegunCedesAndFindsItCededWhenItBegins) {
  DecisionHandover h;
  EXPECT_TRUE(h.OnAsk(kOp));
  EXPECT_TRUE(h.OnAsk(kOp)) << "a repeated ask (the answer was lost) gets the same answer";
  h.Begin(kOp);
  EXPECT_TRUE(h.Ceded(kOp));
  EXPECT_TRUE(h.Ceded(kOp + 1)) << "both phase ids name the operation";
  EXPECT_TRUE(h.OnAsk(kOp)) << "after it began, a repeated ask still finds it ceded";
  EXPECT_FALSE(h.Ceded(kOp + 2)) << "another operation";
}

TEST(DecisionHandover, ALeaderThatHasBegunRefuses) {
  DecisionHandover h;
  h.Begin(kOp);
  EXPECT_FALSE(h.OnAsk(kOp));
  EXPECT_FALSE(h.OnAsk(kOp + 1));
  EXPECT_FALSE(h.Ceded(kOp));
}

TEST(DecisionHandover, BeginAndAskRacingLeaveExactlyOneDecider) {
  // Whatever the order, the leader decides (not ceded) exactly when the deputy was refused.
  for (int round = 0; round < 2000; round++) {
    DecisionHandover h;
    const uint64_t op = 2 * static_cast<uint64_t>(round);
    std::atomic<bool> go{false};
    bool asked_ceded = false;
    std::thread deputy([&] {
      while (!go.load()) std::this_thread::yield();
      asked_ceded = h.OnAsk(op);
    });
    go = true;
    h.Begin(op);
    deputy.join();
    EXPECT_EQ(h.Ceded(op), asked_ceded) << round;
  }
}

TEST(DecisionHandover, OldOperationsAreForgottenBeyondTheBound) {
  DecisionHandover h;
  for (uint64_t i = 0; i <= DecisionHandover::kRemembered; i++) h.Begin(2 * i);
  EXPECT_TRUE(h.OnAsk(0)) << "the oldest begun operation is no longer remembered";
  EXPECT_FALSE(h.OnAsk(2 * DecisionHandover::kRemembered));
}

TEST(DecisionHandover, TheDeputyTakesTheAnswerOfItsLeaderOnly) {
  DecisionHandover h;
  const auto soon = BoundedClock::now() + std::chrono::milliseconds(1);
  EXPECT_FALSE(h.WaitAnswer(3, kOp, soon).has_value()) << "no answer yet: the wait ends";
  h.OnAnswer(2, kOp, true);
  EXPECT_FALSE(h.WaitAnswer(3, kOp, soon).has_value()) << "an answer from another rank";
  h.OnAnswer(3, kOp + 1, false);
  const auto later = BoundedClock::now() + std::chrono::seconds(10);
  EXPECT_EQ(h.WaitAnswer(3, kOp, later), std::optional<bool>(false));
  EXPECT_FALSE(h.WaitAnswer(3, kOp, soon).has_value()) << "an answer is taken once";
}

TEST(DecisionHandover, AWaitingDeputyWakesOnTheAnswer) {
  DecisionHandover h;
  std::thread leader([&] { h.OnAnswer(1, kOp, true); });
  // Without the answer this wait would end only after a minute.
  EXPECT_EQ(h.WaitAnswer(1, kOp, BoundedClock::now() + std::chrono::minutes(1)),
            std::optional<bool>(true));
  leader.join();
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
