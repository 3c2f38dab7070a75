// The engine's bounded service against its device and its peers: packets the device
// refuses are sent again (not lost), repeated repair requests are merged into one queued
// job, and a packet of an earlier run is dropped even when the session token is fixed.
// Two engines over the loop backend, with a tap between each engine and its device.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport_dpdk/engine/engine.h"
#include "transport_dpdk/io/loop/packet_io_loop.h"
#include "transport_dpdk/wire/wire_format.h"

namespace optireduce {
namespace transport {
namespace {

using Clock = std::chrono::steady_clock;

// Forwards to a loop endpoint. Can refuse half of every other TX burst (backpressure),
// keeps a copy of the bounded DATA datagrams sent, and can inject datagrams on receive.
class TapIo : public PacketIo, public IoWaits {
 public:
  TapIo() : inner_(std::make_unique<LoopPacketIo>(9000, 1 << 16)) {}
  std::string Describe() const override { return "tap on " + inner_->Describe(); }
  uint32_t MaxDatagram() const override { return inner_->MaxDatagram(); }
  IoAddress LocalAddress() const override { return inner_->LocalAddress(); }
  absl::StatusOr<PeerHandle> ResolvePeer(const IoAddress& a) override {
    return inner_->ResolvePeer(a);
  }
  std::string AddressToString(const IoAddress& a) const override {
    return inner_->AddressToString(a);
  }
  bool ProtectsPayload() const override { return inner_->ProtectsPayload(); }
  size_t TxBurst(const TxDatagram* d, size_t n) override {
    size_t take = n;
    if (refuse_ && (++bursts_ % 2 == 0)) take = n / 2;
    const size_t sent = inner_->TxBurst(d, take);
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < sent; ++i) {
      std::vector<uint8_t> bytes(d[i].head_len + d[i].body_len);
      std::memcpy(bytes.data(), d[i].head, d[i].head_len);
      if (d[i].body_len) std::memcpy(bytes.data() + d[i].head_len, d[i].body, d[i].body_len);
      WireHeader h;
      if (ParseDatagram(bytes.data(), static_cast<uint32_t>(bytes.size()), &h, true) ==
              ParseError::kOk &&
          (h.flags & kFlagUnreliable) && h.type == static_cast<uint8_t>(PacketType::kData) &&
          captured_.size() < 4) {
        captured_.push_back(std::move(bytes));
      }
    }
    return sent;
  }
  size_t RxBurst(RxDatagram* out, size_t max) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!inject_.empty()) {
        held_ = std::move(inject_.front());
        inject_.pop_front();
        out[0] = {held_.data(), static_cast<uint32_t>(held_.size())};
        return 1;
      }
    }
    return inner_->RxBurst(out, max);
  }
  IoWaits& Waits() override { return *this; }
  void WaitForInput(std::chrono::microseconds t) override { inner_->Waits().WaitForInput(t); }
  void Wake() override { inner_->Waits().Wake(); }

  void set_refuse(bool refuse) { refuse_ = refuse; }
  std::vector<std::vector<uint8_t>> captured() {
    std::lock_guard<std::mutex> lock(mu_);
    return captured_;
  }
  void Inject(std::vector<uint8_t> datagram) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      inject_.push_back(std::move(datagram));
    }
    Wake();
  }

 private:
  std::unique_ptr<PacketIo> inner_;
  std::atomic<bool> refuse_{false};
  uint64_t bursts_ = 0;  // progress thread only
  std::mutex mu_;
  std::vector<std::vector<uint8_t>> captured_;
  std::deque<std::vector<uint8_t>> inject_;
  std::vector<uint8_t> held_;
};

// What rank 1 received of bounded operations, by op.
class Sink {
 public:
  void OnData(uint64_t op, uint64_t offset, const uint8_t* data, size_t len) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& got = bytes_[op];
    if (got.size() < offset + len) got.resize(offset + len);
    std::memcpy(got.data() + offset, data, len);
    received_[op] += len;
    cv_.notify_all();
  }
  // Waits until `bytes` arrived for `op` (or 20 s, then false).
  bool WaitFor(uint64_t op, size_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return received_[op] >= bytes; });
  }
  size_t received(uint64_t op) {
    std::lock_guard<std::mutex> lock(mu_);
    return received_[op];
  }
  std::vector<uint8_t> bytes(uint64_t op) {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_[op];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::vector<uint8_t>> bytes_;
  std::map<uint64_t, size_t> received_;
};

// Two engines (ranks 0 and 1 of one context), the session token fixed to `token`.
struct Pair {
  TapIo* tap0 = nullptr;
  TapIo* tap1 = nullptr;
  std::shared_ptr<Engine> e0, e1;
  uint32_t c0 = 0, c1 = 0;
  std::vector<char> source;
  std::atomic<bool> hold{false};  // rank 0's sources are "busy": its jobs stay queued
  Sink sink;

  explicit Pair(uint64_t token, size_t source_bytes = 256 * 1024) : source(source_bytes) {
    for (size_t i = 0; i < source.size(); i++) source[i] = static_cast<char>(i * 7 + 3);
    EngineOptions o;
    o.bounded_payload = 1024;
    o.linger_quiet = std::chrono::milliseconds(20);  // quick teardown
    o.linger_max = std::chrono::milliseconds(100);
    auto io0 = std::make_unique<TapIo>();
    auto io1 = std::make_unique<TapIo>();
    tap0 = io0.get();
    tap1 = io1.get();
    e0 = *Engine::Create(std::move(io0), o, 1 << 24);
    e1 = *Engine::Create(std::move(io1), o, 1 << 24);
    c0 = e0->RegisterContext(0, 2, token);
    c1 = e1->RegisterContext(1, 2, token);
    EXPECT_TRUE(e0->ConnectPeer(c0, 1, e1->LocalAddress(), c1, token, e1->MaxDatagram()).ok());
    EXPECT_TRUE(e1->ConnectPeer(c1, 0, e0->LocalAddress(), c0, token, e0->MaxDatagram()).ok());
    BoundedHooks h0;
    h0.read_source = [this](uint64_t, int, const std::function<void(const char*, size_t, bool)>& fn) {
      if (hold) return SourceAccess::kBusy;
      fn(source.data(), source.size(), false);
      return SourceAccess::kDone;
    };
    e0->SetBoundedHooks(c0, std::move(h0));
    BoundedHooks h1;
    h1.on_data = [this](int, uint64_t op, uint64_t offset, const uint8_t* data, size_t len, bool,
                        bool, uint64_t, uint64_t) { sink.OnData(op, offset, data, len); };
    e1->SetBoundedHooks(c1, std::move(h1));
  }
  ~Pair() {
    e0->SetBoundedHooks(c0, BoundedHooks());
    e1->SetBoundedHooks(c1, BoundedHooks());
    e0->UnregisterContext(c0);
    e1->UnregisterContext(c1);
  }
};

// Waits until `pred` holds (polling the engine's counters), or 20 s.
template <typename Pred>
bool Eventually(Pred pred) {
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  while (!pred()) {
    if (Clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(BoundedEngine, PacketsTheDeviceRefusesAreSentAgainNotLost) {
  Pair pair(/*token=*/0x5eed);
  pair.tap0->set_refuse(true);
  ASSERT_TRUE(pair.e0->SendBounded(pair.c0, 1, 42, pair.source.size()).ok());
  ASSERT_TRUE(pair.sink.WaitFor(42, pair.source.size()))
      << "received " << pair.sink.received(42) << " of " << pair.source.size() << "; "
      << pair.e0->GetStats().ToString();
  const std::vector<uint8_t> got = pair.sink.bytes(42);
  ASSERT_EQ(got.size(), pair.source.size());
  EXPECT_EQ(std::memcmp(got.data(), pair.source.data(), got.size()), 0);
  // The receiver can hold the last burst before the sender's thread, back from the
  // device's TxBurst, has counted it: wait for the count to settle, then check it.
  const uint64_t packets = pair.source.size() / 1024;
  Eventually([&] { return pair.e0->GetStats().bounded_tx_packets >= packets; });
  const Stats s = pair.e0->GetStats();
  EXPECT_GT(s.bounded_tx_deferred, 0u) << s.ToString();
  EXPECT_EQ(s.bounded_tx_packets, packets) << "each packet counted once, when sent";
}

TEST(BoundedEngine, RepeatedRepairRequestsAreMergedAndTheQueueIsBounded) {
  Pair pair(/*token=*/0x5eed);
  pair.hold = true;  // rank 0 cannot send yet: every request stays queued
  const size_t kOps = 100;
  for (int i = 0; i < 50; i++) {
    // Op 7 asked again and again, for overlapping and new ranges.
    const uint64_t b = static_cast<uint64_t>(i) * 1024;
    ASSERT_TRUE(pair.e1->RequestRepair(pair.c1, 0, 7, {{b, b + 2048}}).ok());
  }
  for (uint64_t op = 1000; op < 1000 + kOps; op++) {
    ASSERT_TRUE(pair.e1->RequestRepair(pair.c1, 0, op, {{0, 1024}}).ok());
  }
  ASSERT_TRUE(Eventually([&] { return pair.e0->GetStats().repair_requests_received >= 50 + kOps; }))
      << pair.e0->GetStats().ToString();
  Stats s = pair.e0->GetStats();
  EXPECT_EQ(s.repair_requests_merged, 49u) << s.ToString();
  EXPECT_EQ(s.repair_requests_dropped, kOps - 63) << "64 operations queued at most";
  EXPECT_LE(pair.e0->BoundedPending(pair.c0), 64u);
  pair.hold = false;
  // The merged job sends the union once: bytes [0, 51 KiB) of op 7.
  ASSERT_TRUE(pair.sink.WaitFor(7, 51 * 1024)) << pair.sink.received(7);
  EXPECT_TRUE(Eventually([&] { return pair.e0->BoundedPending(pair.c0) == 0; }));
  EXPECT_EQ(pair.sink.received(7), 51u * 1024) << "no range sent twice";
}

// One request may carry up to 4096 ranges, overlapping, repeated or past the source's end
// (a confused or hostile peer): the job it queues sends every byte of the source at most
// once, whether the request is queued behind a busy source or served at once.
TEST(BoundedEngine, ARequestOfRepeatedRangesSendsEachByteOnce) {
  constexpr size_t kSource = 16 << 10;
  Pair pair(/*token=*/0x5eed, kSource);
  std::vector<std::pair<uint64_t, uint64_t>> repeated(400, {0, kSource});  // one packet
  repeated.push_back({1000, 5000});
  repeated.push_back({8192, uint64_t{1} << 40});
  pair.hold = true;  // queued first: nothing can be sent yet
  ASSERT_TRUE(pair.e1->RequestRepair(pair.c1, 0, 9, repeated).ok());
  ASSERT_TRUE(Eventually([&] { return pair.e0->GetStats().repair_requests_received >= 1; }));
  pair.hold = false;
  ASSERT_TRUE(pair.sink.WaitFor(9, kSource)) << pair.sink.received(9);
  ASSERT_TRUE(Eventually([&] { return pair.e0->BoundedPending(pair.c0) == 0; }));
  EXPECT_EQ(pair.sink.received(9), kSource) << "bytes sent for one request";

  std::vector<std::pair<uint64_t, uint64_t>> huge(400, {0, uint64_t{1} << 40});  // served at once
  ASSERT_TRUE(pair.e1->RequestRepair(pair.c1, 0, 10, huge).ok());
  ASSERT_TRUE(pair.sink.WaitFor(10, kSource)) << pair.sink.received(10);
  ASSERT_TRUE(Eventually([&] { return pair.e0->BoundedPending(pair.c0) == 0; }));
  EXPECT_EQ(pair.sink.received(10), kSource) << "bytes sent for one request";
  const uint64_t packets = 2 * kSource / 1024;
  Eventually([&] { return pair.e0->GetStats().bounded_tx_packets >= packets; });
  EXPECT_EQ(pair.e0->GetStats().bounded_tx_packets, packets);
}

// OPTIREDUCE_SESSION_TOKEN fixes the token, so two runs of a job share it, and operation
// ids restart at the same values. A packet of the first run that arrives during the second
// (a delayed datagram, or a replay) addresses a context id of the first run: dropped.
TEST(BoundedEngine, AStalePacketOfAnEarlierRunWithTheSameTokenIsDropped) {
  constexpr uint64_t kToken = 0x0123456789abcdefULL;
  std::vector<uint8_t> stale;
  uint32_t first_run_ctx = 0;
  {
    Pair run1(kToken, 4096);
    first_run_ctx = run1.c1;
    ASSERT_TRUE(run1.e0->SendBounded(run1.c0, 1, 42, 4096).ok());
    ASSERT_TRUE(run1.sink.WaitFor(42, 4096));
    ASSERT_FALSE(run1.tap0->captured().empty());
    stale = run1.tap0->captured().front();
  }
  Pair run2(kToken, 4096);
  EXPECT_NE(run2.c1, first_run_ctx) << "context ids start at a random epoch per engine";
  const uint64_t before = run2.e1->GetStats().bad_context;
  run2.tap1->Inject(stale);
  ASSERT_TRUE(Eventually([&] { return run2.e1->GetStats().bad_context > before; }))
      << run2.e1->GetStats().ToString();
  EXPECT_EQ(run2.sink.received(42), 0u) << "the stale packet was taken for this run's op";
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
