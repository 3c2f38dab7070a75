#include "transport_dpdk/fault_injector.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <thread>

namespace optireduce {
namespace transport {
namespace {

// A PacketIo that yields datagrams 0..total-1 (4-byte counters), `per_burst`
// at a time.
class CountingIo : public PacketIo {
 public:
  CountingIo(uint32_t total, size_t per_burst) : total_(total), per_burst_(per_burst) {}
  std::string Describe() const override { return "counting"; }
  uint32_t MaxDatagram() const override { return 1500; }
  IoAddress LocalAddress() const override { return {}; }
  absl::StatusOr<PeerHandle> ResolvePeer(const IoAddress&) override { return 0; }
  std::string AddressToString(const IoAddress&) const override { return ""; }
  size_t TxBurst(const TxDatagram*, size_t n) override { return n; }
  size_t RxBurst(RxDatagram* out, size_t max) override {
    size_t n = 0;
    bufs_.clear();
    while (n < max && n < per_burst_ && next_ < total_) {
      bufs_.emplace_back(4);
      std::memcpy(bufs_.back().data(), &next_, 4);
      ++next_;
      ++n;
    }
    for (size_t i = 0; i < n; ++i) out[i] = {bufs_[i].data(), 4};
    return n;
  }
  void WaitForInput(std::chrono::microseconds t) override {
    std::this_thread::sleep_for(t);
  }
  void Wake() override {}
  bool done() const { return next_ >= total_; }

 private:
  uint32_t total_, next_ = 0;
  size_t per_burst_;
  std::deque<std::vector<uint8_t>> bufs_;
};

std::vector<uint32_t> Drain(FaultInjector& fi, CountingIo* inner) {
  std::vector<uint32_t> seen;
  RxDatagram out[64];
  int idle = 0;
  while (idle < 50) {
    size_t n = fi.RxBurst(out, 64);
    for (size_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, out[i].data, 4);
      seen.push_back(v);
    }
    if (n == 0 && inner->done() && fi.held() == 0) {
      ++idle;
      fi.WaitForInput(std::chrono::microseconds(100));
    }
  }
  return seen;
}

TEST(FaultSpec, Parses) {
  auto s = ParseFaultSpec("drop=0.01,dup=0.001,reorder=0.02,delay_us=50,corrupt=0.001,seed=7");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->drop, 0.01);
  EXPECT_DOUBLE_EQ(s->dup, 0.001);
  EXPECT_DOUBLE_EQ(s->reorder, 0.02);
  EXPECT_EQ(s->delay_us, 50u);
  EXPECT_DOUBLE_EQ(s->corrupt, 0.001);
  EXPECT_EQ(s->seed, 7u);
  EXPECT_TRUE(ParseFaultSpec("").ok());
}

TEST(FaultSpec, ErrorsNameKeyAndValue) {
  auto bad_key = ParseFaultSpec("drop=0.1,lose=0.2");
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find("lose"), std::string::npos);
  auto bad_value = ParseFaultSpec("reorder=abc");
  ASSERT_FALSE(bad_value.ok());
  EXPECT_NE(bad_value.status().message().find("reorder=abc"), std::string::npos);
  auto out_of_range = ParseFaultSpec("dup=2");
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find("dup=2"), std::string::npos);
  EXPECT_FALSE(ParseFaultSpec("drop").ok());
  EXPECT_FALSE(ParseFaultSpec("delay_us=-5").ok());
}

TEST(FaultInjector, DeterministicGivenSeed) {
  FaultSpec spec;
  spec.drop = 0.05;
  spec.dup = 0.02;
  spec.reorder = 0.05;
  spec.seed = 99;
  auto run = [&](uint64_t seed) {
    FaultSpec s = spec;
    s.seed = seed;
    auto* inner = new CountingIo(20000, 17);
    FaultInjector fi(std::unique_ptr<PacketIo>(inner), s);
    return Drain(fi, inner);
  };
  auto a = run(99), b = run(99), c = run(100);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(FaultInjector, DropRateCloseToConfigured) {
  for (double p : {0.01, 0.1, 0.3}) {
    FaultSpec s;
    s.drop = p;
    s.seed = 5;
    auto* inner = new CountingIo(100000, 32);
    FaultInjector fi(std::unique_ptr<PacketIo>(inner), s);
    auto seen = Drain(fi, inner);
    const double rate = 1.0 - seen.size() / 100000.0;
    EXPECT_NEAR(rate, p, 0.01 + p * 0.1) << "drop=" << p;
    EXPECT_EQ(fi.counters().dropped.load(), 100000 - seen.size());
  }
}

TEST(FaultInjector, ReorderAndDupKeepEverything) {
  FaultSpec s;
  s.dup = 0.1;
  s.reorder = 0.2;
  s.delay_us = 30;
  s.seed = 3;
  auto* inner = new CountingIo(5000, 20);
  FaultInjector fi(std::unique_ptr<PacketIo>(inner), s);
  auto seen = Drain(fi, inner);
  std::vector<int> count(5000, 0);
  bool reordered = false;
  for (size_t i = 0; i < seen.size(); ++i) {
    ASSERT_LT(seen[i], 5000u);
    ++count[seen[i]];
    if (i > 0 && seen[i] < seen[i - 1]) reordered = true;
  }
  for (int c : count) EXPECT_GE(c, 1);
  EXPECT_GT(seen.size(), 5000u);  // duplicates
  EXPECT_TRUE(reordered);
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
