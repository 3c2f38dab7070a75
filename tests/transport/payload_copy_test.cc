// The engine's payload copies (transport_dpdk/engine/payload_pool.h): the pool's reuse and caps,
// and through the Gloo API that a send copied at send() reuses storage instead of
// faulting in fresh pages every time (minor page faults counted, not timed).
#include <gloo/allreduce_ring_chunked.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <gloo/common/error.h>

#include "tests/transport/two_ranks.h"
#include "transport_dpdk/io/loop/packet_io_loop.h"
#include "transport_dpdk/engine/payload_pool.h"
#include "transport_dpdk/wire/wire_format.h"

namespace optireduce {
namespace {

using transport::PayloadPool;

TEST(PayloadPool, GivenBackStorageIsTakenAgainForTheSameClass) {
  auto pool = PayloadPool::Create(64 << 20);
  const uint8_t* first = nullptr;
  {
    PayloadPool::Bytes b = pool->Take(300 << 10);
    ASSERT_EQ(b.size(), 300u << 10);
    first = b.data();
  }
  EXPECT_EQ(pool->counters().cached_bytes, 512u << 10);  // rounded to its class
  PayloadPool::Bytes again = pool->Take(400 << 10);       // same class (512 KiB)
  EXPECT_EQ(again.data(), first);
  PayloadPool::Bytes other = pool->Take(600 << 10);  // next class: fresh storage
  EXPECT_NE(other.data(), first);
  const auto c = pool->counters();
  EXPECT_EQ(c.taken, 3u);
  EXPECT_EQ(c.reused, 1u);
  EXPECT_EQ(c.cached_bytes, 0u);
}

TEST(PayloadPool, CopyHoldsTheBytesAndZeroIsEmpty) {
  auto pool = PayloadPool::Create(1 << 20);
  std::vector<uint8_t> src(5000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  PayloadPool::Bytes b = pool->Copy(src.data(), src.size());
  ASSERT_EQ(b.size(), src.size());
  EXPECT_EQ(std::memcmp(b.data(), src.data(), src.size()), 0);
  PayloadPool::Bytes none = pool->Take(0);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.data(), nullptr);
  PayloadPool::Bytes moved = std::move(b);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(moved.size(), src.size());
}

TEST(PayloadPool, KeepsAtMostItsCapsAndFreesTheRest) {
  auto pool = PayloadPool::Create(1 << 20);  // 1 MiB of free storage at most
  {
    std::vector<PayloadPool::Bytes> held;
    for (int i = 0; i < 3; ++i) held.push_back(pool->Take(512 << 10));
  }
  auto c = pool->counters();
  EXPECT_EQ(c.cached_bytes, 1u << 20);
  EXPECT_EQ(c.freed, 1u);
  auto roomy = PayloadPool::Create(64 << 20);  // the class cap, not the byte cap
  {
    std::vector<PayloadPool::Bytes> held;
    for (size_t i = 0; i < PayloadPool::kMaxPerClass + 4; ++i) held.push_back(roomy->Take(100));
  }
  c = roomy->counters();
  EXPECT_EQ(c.cached_bytes, PayloadPool::kMaxPerClass * PayloadPool::kMinCapacity);
  EXPECT_EQ(c.freed, 4u);
}

TEST(PayloadPool, StorageOutlivesThePoolsOwner) {
  PayloadPool::Bytes b;
  {
    auto pool = PayloadPool::Create(1 << 20);
    b = pool->Take(10000);
  }
  std::memset(b.data(), 1, b.size());  // still valid (ASan checks)
  b.Release();
  EXPECT_TRUE(b.empty());
}

long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Gloo's algorithm classes send through old-style Buffers, which the device copies at
// send() (as Gloo's TCP pair writes into its socket). AllreduceRingChunked of 1 MiB on two
// ranks sends 256 KiB chunks, two in flight. glibc gives freed pages back to the kernel
// when the heap's top grows past its trim threshold (whether it does depends on the
// heap's layout: in the sweep's processes it did after every allreduce); malloc_trim
// between the runs does it here every time. Copies into malloc'd storage then fault in
// 64 fresh pages each; the engine's reused storage is not malloc's to give back.
TEST(PayloadCopy, RingChunkedAllreduceReusesTheCopiesPages) {
  auto ranks = testing_ranks::Connect(transport::EngineOptions());
  ASSERT_EQ(ranks.size(), 2u);
  constexpr int kCount = 256 << 10;  // floats: 1 MiB
  constexpr int kWarmup = 5, kRuns = 50;
  std::vector<std::vector<float>> data(2, std::vector<float>(kCount));
  std::vector<std::unique_ptr<gloo::AllreduceRingChunked<float>>> algos;
  for (int r = 0; r < 2; ++r) {
    algos.push_back(std::make_unique<gloo::AllreduceRingChunked<float>>(
        ranks[r].context, std::vector<float*>{data[r].data()}, kCount));
  }
  long faults_before = 0;
  auto run = [&](int r) {
    for (int i = 0; i < kWarmup + kRuns; ++i) {
      std::fill(data[r].begin(), data[r].end(), static_cast<float>(r + 1));
      if (r == 0 && i == kWarmup) faults_before = MinorFaults();
      malloc_trim(0);
      algos[r]->run();
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  const long faults = MinorFaults() - faults_before;
  EXPECT_EQ(data[0][kCount - 1], 3.0f);
  EXPECT_EQ(data[1][0], 3.0f);
  // Fresh pages for every copy: 4 chunk sends of 64 pages per run and rank.
  EXPECT_LT(faults, kRuns * 8 * 64 / 10)
      << faults << " minor page faults over " << kRuns << " allreduces of 1 MiB";
  RecordProperty("minor_faults", std::to_string(faults));
}

// A loop endpoint that loses, for good (retransmissions too), every reliable DATA packet it
// receives on slot `slot` at or beyond byte `from` of its message.
class LoseTailIo : public transport::PacketIo {
 public:
  LoseTailIo(uint64_t slot, uint64_t from)
      : inner_(std::make_unique<transport::LoopPacketIo>(2048, 1 << 16)), slot_(slot),
        from_(from) {}
  std::string Describe() const override { return "lose-tail on " + inner_->Describe(); }
  uint32_t MaxDatagram() const override { return inner_->MaxDatagram(); }
  transport::IoAddress LocalAddress() const override { return inner_->LocalAddress(); }
  absl::StatusOr<transport::PeerHandle> ResolvePeer(const transport::IoAddress& a) override {
    return inner_->ResolvePeer(a);
  }
  std::string AddressToString(const transport::IoAddress& a) const override {
    return inner_->AddressToString(a);
  }
  bool ProtectsPayload() const override { return inner_->ProtectsPayload(); }
  size_t TxBurst(const transport::TxDatagram* d, size_t n) override {
    return inner_->TxBurst(d, n);
  }
  size_t RxBurst(transport::RxDatagram* out, size_t max) override {
    const size_t got = inner_->RxBurst(out, max);
    size_t kept = 0;
    for (size_t i = 0; i < got; ++i) {
      transport::WireHeader h;
      const bool lose =
          transport::ParseDatagram(out[i].data, out[i].len, &h, true) ==
              transport::ParseError::kOk &&
          h.type == static_cast<uint8_t>(transport::PacketType::kData) && h.slot == slot_ &&
          h.offset >= from_;
      if (lose) {
        lost_++;
        uint64_t seen = first_lost_.load();
        while (h.offset < seen && !first_lost_.compare_exchange_weak(seen, h.offset)) {
        }
        continue;
      }
      out[kept++] = out[i];
    }
    return kept;
  }
  transport::IoWaits& Waits() override { return inner_->Waits(); }

  uint64_t lost() const { return lost_.load(); }
  // The smallest offset of a lost packet: every byte before it arrived.
  uint64_t first_lost() const { return first_lost_.load(); }

 private:
  std::unique_ptr<transport::PacketIo> inner_;
  const uint64_t slot_, from_;
  std::atomic<uint64_t> lost_{0};
  std::atomic<uint64_t> first_lost_{UINT64_MAX};
};

// An eager message whose first half arrived before its receive was posted (stashed) and
// whose second half never comes: the receive times out, and the caller's buffer holds the
// bytes that arrived and its own bytes elsewhere — not the rest of the engine's stash
// (recycled storage that may hold another message's data).
TEST(PayloadCopy, AFailedReceiveLeavesTheBytesThatNeverArrivedUntouched) {
  constexpr uint64_t kSlot = 77, kDone = 78;
  constexpr size_t kBytes = 16 << 10;  // eager: at most 64 KiB
  transport::EngineOptions o;
  o.linger_quiet = std::chrono::milliseconds(20);
  o.linger_max = std::chrono::milliseconds(100);
  std::vector<std::shared_ptr<transport::Device>> devices;
  LoseTailIo* lossy = nullptr;
  for (int i = 0; i < 2; ++i) {
    std::unique_ptr<transport::PacketIo> io;
    if (i == 1) {
      auto tap = std::make_unique<LoseTailIo>(kSlot, kBytes / 2);
      lossy = tap.get();
      io = std::move(tap);
    } else {
      io = std::make_unique<transport::LoopPacketIo>(2048, 1 << 16);
    }
    auto dev = transport::CreateDeviceOverIo(std::move(io), o, 1 << 22);
    ASSERT_TRUE(dev.ok()) << dev.status();
    devices.push_back(*dev);
  }
  auto ranks = testing_ranks::ConnectDevices(devices);
  ASSERT_EQ(ranks.size(), 2u);

  std::vector<uint8_t> message(kBytes);
  for (size_t i = 0; i < kBytes; ++i) message[i] = static_cast<uint8_t>(1 + i % 13);  // never 0xEE
  uint8_t done = 1;
  auto send = ranks[0].context->createUnboundBuffer(message.data(), kBytes);
  auto send_done = ranks[0].context->createUnboundBuffer(&done, 1);
  send->send(1, kSlot);
  send_done->send(1, kDone);  // sent after the message: once it is in, so is its first half

  uint8_t got_done = 0;
  auto recv_done = ranks[1].context->createUnboundBuffer(&got_done, 1);
  recv_done->recv(0, kDone);
  ASSERT_TRUE(recv_done->waitRecv());
  ASSERT_GT(lossy->lost(), 0u);

  std::vector<uint8_t> target(kBytes, 0xEE);
  auto recv = ranks[1].context->createUnboundBuffer(target.data(), kBytes);
  recv->recv(0, kSlot);
  EXPECT_THROW(recv->waitRecv(nullptr, std::chrono::milliseconds(200)), gloo::IoException);
  const size_t arrived = lossy->first_lost();
  ASSERT_GT(arrived, 0u);
  ASSERT_LT(arrived, kBytes);
  size_t foreign = 0;
  for (size_t i = arrived; i < kBytes; ++i) foreign += target[i] != 0xEE ? 1 : 0;
  EXPECT_EQ(foreign, 0u) << "bytes [" << arrived << ", " << kBytes
                         << ") never arrived, yet the receive wrote " << foreign << " of them";
  EXPECT_EQ(std::memcmp(target.data(), message.data(), arrived), 0)
      << "the bytes that arrived before the receive was posted";
}

}  // namespace
}  // namespace optireduce
