#include "transport_dpdk/io/fault_injector.h"
#include "transport_dpdk/wire/wire_format.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <thread>

namespace optireduce {
namespace transport {
namespace {

// A PacketIo that yields datagrams 0..total-1 (4-byte counters), `per_burst`
// at a time.
class CountingIo : public PacketIo, public IoWaits {
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
  IoWaits& Waits() override { return *this; }
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

TEST(FaultSpec, ParsesLossPatterns) {
  auto s = ParseFaultSpec("burst_loss=0.01,burst_len=8,ack_drop=0.05,tail=8,tx_partial=0.3");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->burst_loss, 0.01);
  EXPECT_DOUBLE_EQ(s->burst_len, 8);
  EXPECT_DOUBLE_EQ(s->ack_drop, 0.05);
  EXPECT_EQ(s->tail, 8u);
  EXPECT_DOUBLE_EQ(s->tx_partial, 0.3);
  EXPECT_TRUE(s->Any());
  auto bad_len = ParseFaultSpec("burst_loss=0.01,burst_len=0.5");
  ASSERT_FALSE(bad_len.ok());
  EXPECT_NE(bad_len.status().message().find("burst_len=0.5"), std::string::npos);
  EXPECT_FALSE(ParseFaultSpec("burst_loss=1").ok());
  EXPECT_FALSE(ParseFaultSpec("tail=-1").ok());
  EXPECT_FALSE(ParseFaultSpec("tx_partial=1.5").ok());
}

TEST(FaultInjector, BurstLossHasConfiguredRateAndBurstLength) {
  FaultSpec s;
  s.burst_loss = 0.01;
  s.burst_len = 8;
  s.seed = 4;
  const uint32_t total = 400000;
  auto* inner = new CountingIo(total, 32);
  FaultInjector fi(std::unique_ptr<PacketIo>(inner), s);
  auto seen = Drain(fi, inner);
  const double rate = 1.0 - seen.size() / static_cast<double>(total);
  EXPECT_NEAR(rate, 0.01, 0.003);
  // Runs of consecutive lost datagrams.
  uint64_t runs = 0, lost = 0;
  uint32_t expect = 0;
  for (uint32_t v : seen) {
    if (v != expect) {
      ++runs;
      lost += v - expect;
    }
    expect = v + 1;
  }
  ASSERT_GT(runs, 100u);
  EXPECT_NEAR(static_cast<double>(lost) / runs, 8.0, 1.5);
  EXPECT_EQ(fi.counters().burst_dropped.load(), total - seen.size());
}

// A PacketIo that yields encoded optireduce datagrams from a list, once.
class WireIo : public PacketIo, public IoWaits {
 public:
  explicit WireIo(std::vector<std::vector<uint8_t>> d) : d_(std::move(d)) {}
  std::string Describe() const override { return "wire"; }
  uint32_t MaxDatagram() const override { return 65000; }
  IoAddress LocalAddress() const override { return {}; }
  absl::StatusOr<PeerHandle> ResolvePeer(const IoAddress&) override { return 0; }
  std::string AddressToString(const IoAddress&) const override { return ""; }
  size_t TxBurst(const TxDatagram*, size_t n) override {
    tx_calls_.push_back(n);
    return n;
  }
  size_t RxBurst(RxDatagram* out, size_t max) override {
    size_t n = 0;
    while (n < max && next_ < d_.size()) {
      out[n++] = {d_[next_].data(), static_cast<uint32_t>(d_[next_].size())};
      ++next_;
    }
    return n;
  }
  IoWaits& Waits() override { return *this; }
  void WaitForInput(std::chrono::microseconds) override {}
  void Wake() override {}
  std::vector<size_t> tx_calls_;

 private:
  std::vector<std::vector<uint8_t>> d_;
  size_t next_ = 0;
};

std::vector<uint8_t> Datagram(PacketType type, uint64_t msg, uint64_t offset, uint32_t len,
                              uint64_t total) {
  WireHeader h;
  h.type = static_cast<uint8_t>(type);
  h.session_token = 42;
  h.src_rank = 1;
  h.dst_context = 3;
  h.message_id = msg;
  h.offset = offset;
  h.total_length = total;
  h.payload_length = len;
  std::vector<uint8_t> d(kHeaderBytes + len, 7);
  EncodeHeader(h, d.data() + kHeaderBytes, len, d.data());
  return d;
}

// Received (type, offset) pairs.
std::vector<std::pair<int, uint64_t>> Receive(FaultInjector& fi) {
  std::vector<std::pair<int, uint64_t>> got;
  RxDatagram out[64];
  for (size_t n; (n = fi.RxBurst(out, 64)) > 0;) {
    for (size_t i = 0; i < n; ++i) {
      WireHeader h;
      EXPECT_EQ(ParseDatagram(out[i].data, out[i].len, &h), ParseError::kOk);
      got.emplace_back(h.type, h.offset);
    }
  }
  return got;
}

TEST(FaultInjector, AckDropLosesAcksOnly) {
  std::vector<std::vector<uint8_t>> d;
  for (int i = 0; i < 4000; ++i) {
    d.push_back(Datagram(PacketType::kData, 0, 100 * i, 100, 400000));
    d.push_back(Datagram(PacketType::kAck, 0, 0, 0, 0));
  }
  FaultSpec s;
  s.ack_drop = 0.25;
  s.seed = 9;
  FaultInjector fi(std::make_unique<WireIo>(d), s);
  int data = 0, acks = 0;
  for (auto& [type, off] : Receive(fi)) {
    (type == static_cast<int>(PacketType::kData) ? data : acks)++;
  }
  EXPECT_EQ(data, 4000);
  EXPECT_NEAR(acks, 3000, 150);
  EXPECT_EQ(fi.counters().acks_dropped.load(), 4000u - acks);
}

TEST(FaultInjector, TailLossDropsTheLastPacketsOfEachMessageOnce) {
  // Two messages of 20 packets (100 bytes, the last 50), each sent twice
  // (the second copy: the sender's retransmissions).
  std::vector<std::vector<uint8_t>> d;
  for (int copy = 0; copy < 2; ++copy) {
    for (uint64_t msg = 0; msg < 2; ++msg) {
      for (int i = 0; i < 20; ++i) {
        d.push_back(Datagram(PacketType::kData, msg, 100 * i, i == 19 ? 50 : 100, 1950));
      }
    }
  }
  d.push_back(Datagram(PacketType::kAck, 0, 0, 0, 0));
  FaultSpec s;
  s.tail = 8;
  FaultInjector fi(std::make_unique<WireIo>(d), s);
  auto got = Receive(fi);
  ASSERT_EQ(got.size(), 4u * 20 - 2 * 8 + 1);
  for (int k = 0; k < 12; ++k) EXPECT_EQ(got[k].second, 100u * k);
  EXPECT_EQ(got[12].second, 0u);  // message 1 starts: message 0's tail was lost
  // The second copies all pass.
  for (int k = 0; k < 40; ++k) EXPECT_EQ(got[24 + k].second, 100u * (k % 20));
  EXPECT_EQ(fi.counters().tail_dropped.load(), 16u);
}

TEST(FaultInjector, PartialTxAcceptsAPrefix) {
  FaultSpec s;
  s.tx_partial = 0.3;
  s.seed = 2;
  auto* inner = new WireIo({});
  FaultInjector fi(std::unique_ptr<PacketIo>(inner), s);
  TxDatagram batch[16] = {};
  int partial = 0;
  size_t accepted = 0;
  for (int i = 0; i < 2000; ++i) {
    const size_t n = fi.TxBurst(batch, 16);
    ASSERT_LE(n, 16u);
    if (n < 16) ++partial;
    accepted += n;
  }
  EXPECT_NEAR(partial, 600, 80);
  EXPECT_EQ(fi.counters().tx_offered.load(), 2000u * 16);
  EXPECT_EQ(fi.counters().tx_refused.load(), 2000u * 16 - accepted);
  // The inner device only saw what was accepted (a prefix of each batch).
  size_t inner_total = 0;
  for (size_t n : inner->tx_calls_) inner_total += n;
  EXPECT_EQ(inner_total, accepted);
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
