// The waiting rule of OptiReduce mode (BoundedContextState::MustWait), driven by scripted
// decisions, and the decision's wire form.
#include "algorithms/bounded_agreement.h"

#include <vector>

#include "gtest/gtest.h"

namespace optireduce {
namespace {

constexpr int kRanks = 4;
constexpr size_t kInARow = BoundedContextState::kMaxLeftOutInARow;

Decision LeavingOut(std::vector<int> left_out, uint64_t op = 0) {
  Decision d;
  d.op = op;
  d.counted.assign(kRanks, true);
  for (int r : left_out) d.counted[r] = false;
  return d;
}

TEST(BoundedWaitRule, ARankLeftOutCatchesUpUntilItsRunReachesTheLimit) {
  BoundedContextState state;
  for (size_t i = 0; i + 1 < kInARow; i++) {
    state.NoteDecision(LeavingOut({3}), /*leader=*/0);
    EXPECT_FALSE(state.MustWait(kRanks, kInARow).must_wait[3]) << "after " << i + 1;
  }
  state.NoteDecision(LeavingOut({3}), 0);
  const auto rule = state.MustWait(kRanks, kInARow);
  EXPECT_TRUE(rule.must_wait[3]);
  EXPECT_FALSE(rule.slow[3]);
  for (int r = 0; r < 3; r++) EXPECT_FALSE(rule.must_wait[r]) << r;
  // Counted by another rank's decision: it has caught up.
  state.NoteDecision(LeavingOut({}), 1);
  EXPECT_FALSE(state.MustWait(kRanks, kInARow).must_wait[3]);
}

TEST(BoundedWaitRule, ADecisionTheLaggingRankMadeAsLeaderDoesNotEndItsRun) {
  BoundedContextState state;
  for (size_t i = 0; i + 1 < kInARow; i++) state.NoteDecision(LeavingOut({2}), 0);
  state.NoteDecision(LeavingOut({}), /*leader=*/2);  // a leader always counts itself
  EXPECT_FALSE(state.MustWait(kRanks, kInARow).must_wait[2]);
  state.NoteDecision(LeavingOut({2}), 0);
  EXPECT_TRUE(state.MustWait(kRanks, kInARow).must_wait[2]);
}

TEST(BoundedWaitRule, TheLimitComesFromTheCaller) {
  BoundedContextState state;
  state.NoteDecision(LeavingOut({1}), 0);
  EXPECT_TRUE(state.MustWait(kRanks, 1).must_wait[1]);
  EXPECT_FALSE(state.MustWait(kRanks, 2).must_wait[1]);
  EXPECT_TRUE(state.MustWait(kRanks, 0).must_wait[1]) << "a limit of 0 means 1";
}

TEST(BoundedWaitRule, ARankSlowEveryTimeIsWaitedForAndNamed) {
  BoundedContextState state;
  // Left out of two operations in every three: never kInARow in a row, but most of them.
  const size_t window = BoundedContextState::kWindow;
  size_t left_out = 0;
  for (size_t i = 0; i < window; i++) {
    const bool out = i % 3 != 2;
    state.NoteDecision(out ? LeavingOut({3}) : LeavingOut({}), 0);
    left_out += out;
    const auto rule = state.MustWait(kRanks, kInARow);
    EXPECT_EQ(rule.slow[3], left_out > BoundedContextState::kMaxLeftOutInWindow) << i;
    EXPECT_EQ(rule.must_wait[3], rule.slow[3]) << i;
  }
  EXPECT_GT(left_out, BoundedContextState::kMaxLeftOutInWindow);
  // Counted from then on: once no more than half of the window left it out, it is not.
  // The window then holds the last 32 - i scripted decisions and i counted ones.
  size_t i = 0;
  while (state.MustWait(kRanks, kInARow).slow[3]) {
    state.NoteDecision(LeavingOut({}), 0);
    ASSERT_LT(++i, window);
  }
  size_t still_out = 0;
  for (size_t j = i; j < window; j++) still_out += j % 3 != 2;
  EXPECT_EQ(still_out, BoundedContextState::kMaxLeftOutInWindow);
}

TEST(BoundedWaitRule, LargerShardsGetAShorterRun) {
  // The run is sized by what a peer keeps for the left-out rank per operation: a shard.
  EXPECT_EQ(BoundedContextState::MaxLeftOutInARow(0, 4), kInARow);
  EXPECT_EQ(BoundedContextState::MaxLeftOutInARow(2 << 20, 1), kInARow);
  EXPECT_EQ(BoundedContextState::MaxLeftOutInARow(8 << 20, 1), 4u);
  EXPECT_EQ(BoundedContextState::MaxLeftOutInARow(25 << 20, 1), 1u);
  EXPECT_EQ(BoundedContextState::MaxLeftOutInARow(size_t{1} << 32, 4), 1u);
  // 16 MiB buckets on 4 ranks keep 4 MiB per operation: a rank two spikes behind is not
  // waited for after two operations (each costs its peers the whole catch-up).
  EXPECT_EQ(BoundedContextState::MaxLeftOutInARow(16 << 20, 4), kInARow);
  EXPECT_EQ(BoundedContextState::MaxLeftOutInARow(32 << 20, 4), 4u);
  EXPECT_EQ(BoundedContextState::MaxLeftOutInARow(64 << 20, 4), 2u);
  // Zero ranks are taken as one.
  EXPECT_EQ(BoundedContextState::MaxLeftOutInARow(8 << 20, 0), 4u);
}

TEST(BoundedCarry, CarriesAddUpAndTheirMemoryIsReused) {
  BoundedContextState state;
  std::vector<float> out(1000, 0.0f);
  const BoundedContextState::CarryKey key{reinterpret_cast<uintptr_t>(out.data()), out.size(),
                                         DataType::kFloat32};
  // A carry of v·i over `ranges`, written into a spare whose other values are garbage.
  auto carry_of = [&](float v, std::vector<std::pair<size_t, size_t>> ranges) {
    Carry c = state.SpareCarry(out.size() * sizeof(float));
    EXPECT_TRUE(c.empty());
    c.values.resize(out.size() * sizeof(float));
    float* f = reinterpret_cast<float*>(c.values.data());
    for (size_t i = 0; i < out.size(); i++) f[i] = 1e9f;  // outside the ranges: not carried
    for (const auto& [b, e] : ranges) {
      for (size_t i = b; i < e; i++) f[i] = v * i;
    }
    c.ranges = std::move(ranges);
    return c;
  };
  EXPECT_EQ(state.AddCarry(key, carry_of(1.0f, {{0, 1000}})), 0u);
  EXPECT_EQ(state.AddCarry(key, carry_of(2.0f, {{0, 1000}})), 0u);  // adds to the one held
  EXPECT_EQ(state.carry_bytes(), out.size() * sizeof(float));
  ASSERT_TRUE(state.TakeCarry(key, out.data()));
  for (size_t i = 0; i < out.size(); i++) ASSERT_EQ(out[i], 3.0f * i) << i;
  EXPECT_EQ(state.carry_bytes(), 0u);
  EXPECT_FALSE(state.TakeCarry(key, out.data())) << "a carry is applied once";
  // Ranges: [100, 300) and [500, 600), then [200, 550) and [900, 1000) added to them; the
  // applied memory's old values (outside every range) reach nothing.
  std::fill(out.begin(), out.end(), 0.0f);
  EXPECT_EQ(state.AddCarry(key, carry_of(1.0f, {{100, 300}, {500, 600}})), 0u);
  EXPECT_EQ(state.AddCarry(key, carry_of(2.0f, {{200, 550}, {900, 1000}})), 0u);
  ASSERT_TRUE(state.TakeCarry(key, out.data()));
  for (size_t i = 0; i < out.size(); i++) {
    const float once = (i >= 100 && i < 300) || (i >= 500 && i < 600) ? 1.0f : 0.0f;
    const float twice = (i >= 200 && i < 550) || i >= 900 ? 2.0f : 0.0f;
    ASSERT_EQ(out[i], (once + twice) * i) << i;
  }
  // The applied carries' memory serves the next ones.
  Carry spare = state.SpareCarry(out.size() * sizeof(float));
  EXPECT_GE(spare.values.capacity(), out.size() * sizeof(float));
  EXPECT_TRUE(spare.empty());
  EXPECT_EQ(state.SpareCarry(1).values.capacity(), spare.values.capacity())
      << "two spares: both were kept";
  EXPECT_EQ(state.SpareCarry(1).values.capacity(), 0u) << "no third spare";
}

TEST(BoundedDecision, RoundTripsAndRefusesAnotherOperation) {
  Decision d = LeavingOut({0, 3}, /*op=*/42);
  const std::vector<uint64_t> words = d.Encode();
  ASSERT_EQ(words.size(), Decision::WireWords(kRanks));
  absl::StatusOr<Decision> back = Decision::Decode(words, kRanks, 42);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->counted, d.counted);
  absl::StatusOr<Decision> other = Decision::Decode(words, kRanks, 43);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("expected 43"), std::string::npos) << other.status();
}

}  // namespace
}  // namespace optireduce
