// fault_injector.h — a seeded drop/duplicate/reorder/delay/corrupt wrapper
// around any PacketIo, for tests and the cloud lab.
//
// Faults are applied on the receive path (each rank injects into what it
// receives, so both directions of every pair see them), which lets the
// injector work on backend-owned buffers without touching user memory;
// tx_partial acts on the transmit path.
//
// Spec: comma-separated key=value, e.g.
//   "drop=0.01,dup=0.001,reorder=0.02,delay_us=50,corrupt=0.001,seed=7"
//   drop, dup, reorder, corrupt: probabilities in [0, 1]
//   delay_us: every datagram is delayed uniformly in [0, delay_us]
//   burst_loss, burst_len: Gilbert-Elliott loss — a two-state chain whose
//         bad state drops everything, entered so that burst_loss of all
//         datagrams are lost on average, in bursts of burst_len (mean,
//         geometric; default 8) datagrams
//   ack_drop: probability that a reliable ACK is dropped (acks only)
//   tail: the last `tail` packets of every reliable message are dropped,
//         once each (retransmissions pass)
//   tx_partial: probability that a TxBurst call accepts only a random
//         prefix (possibly none) of its datagrams (local backpressure)
//   seed: RNG seed (default 1); the same seed gives the same decisions for
//         the same input sequence.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "transport_dpdk/io/packet_io.h"

namespace optireduce {
namespace transport {

struct FaultSpec {
  double drop = 0, dup = 0, reorder = 0, corrupt = 0;
  uint64_t delay_us = 0;
  double burst_loss = 0, burst_len = 8;
  double ack_drop = 0;
  uint64_t tail = 0;
  double tx_partial = 0;
  uint64_t seed = 1;
  bool Any() const {
    return drop > 0 || dup > 0 || reorder > 0 || corrupt > 0 || delay_us > 0 ||
           burst_loss > 0 || ack_drop > 0 || tail > 0 || tx_partial > 0;
  }
};

// Parses a spec; errors name the offending key or value.
absl::StatusOr<FaultSpec> ParseFaultSpec(const std::string& spec);

struct FaultCounters {
  std::atomic<uint64_t> seen{0}, dropped{0}, duplicated{0}, reordered{0},
      delayed{0}, corrupted{0};
  std::atomic<uint64_t> burst_dropped{0}, bursts{0}, acks_dropped{0},
      tail_dropped{0};
  std::atomic<uint64_t> tx_offered{0}, tx_refused{0};  // datagrams
  // Payload bytes of reliable data packets dropped on receive (any rule): what
  // the senders' retransmitted bytes are compared with.
  std::atomic<uint64_t> data_bytes_dropped{0};
  // Payload bytes of bounded (unreliable) data packets dropped on receive: each is a hole
  // in the receiving rank's operation unless repaired (OpStats counts it as lost).
  std::atomic<uint64_t> bounded_bytes_dropped{0};
};

class FaultInjector : public PacketIo, public IoWaits {
 public:
  FaultInjector(std::unique_ptr<PacketIo> inner, const FaultSpec& spec);

  std::string Describe() const override;
  uint32_t MaxDatagram() const override { return inner_->MaxDatagram(); }
  IoAddress LocalAddress() const override { return inner_->LocalAddress(); }
  absl::StatusOr<PeerHandle> ResolvePeer(const IoAddress& a) override {
    return inner_->ResolvePeer(a);
  }
  std::string AddressToString(const IoAddress& a) const override {
    return inner_->AddressToString(a);
  }
  size_t TxBurst(const TxDatagram* d, size_t n) override;
  size_t RxBurst(RxDatagram* out, size_t max) override;
  // Held (delayed or reordered) datagrams bound every wait to their release.
  IoWaits& Waits() override { return *this; }
  void WaitForInput(std::chrono::microseconds timeout) override;
  void WaitForWake(std::chrono::microseconds timeout) override;
  void WaitAsWaiter(std::chrono::microseconds timeout) override;
  void Wake() override { inner_->Waits().Wake(); }
  void WakeWaiter() override { inner_->Waits().WakeWaiter(); }
  bool WakesOnInput() const override { return inner_->Waits().WakesOnInput(); }
  size_t TakeUnreachable(UnreachableReport* out, size_t max) override {
    return inner_->TakeUnreachable(out, max);
  }
  std::string UnreachableCause() const override { return inner_->UnreachableCause(); }
  bool LinkComingUp(PeerHandle peer) const override { return inner_->LinkComingUp(peer); }
  // Injected corruption is what the engine's payload checksum must catch.
  bool ProtectsPayload() const override {
    return spec_.corrupt == 0 && inner_->ProtectsPayload();
  }

  const FaultCounters& counters() const { return counters_; }
  // Datagrams held back (reordered or delayed) and not yet delivered.
  size_t held() const { return held_.size(); }
  PacketIo* inner() { return inner_.get(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Held {
    std::vector<uint8_t> bytes;
    Clock::time_point release;
    bool after_next_burst;  // reorder: released only on a later burst
  };
  static constexpr int64_t kNoRelease = INT64_MAX;
  // RxBurst's work; RxBurst then publishes the earliest release (next_release_).
  size_t ReceiveAndHold(RxDatagram* out, size_t max);
  std::chrono::microseconds BoundByHeld(std::chrono::microseconds timeout) const;
  bool Chance(double p);
  void Emit(RxDatagram* out, size_t* n, std::vector<uint8_t> bytes);
  // One step of the Gilbert-Elliott chain: is this datagram lost?
  bool BurstLoss();
  // Is d a reliable ACK / among the last `tail` packets of a reliable
  // message, seen for the first time?
  bool IsAck(const RxDatagram& d) const;
  bool TailDrop(const RxDatagram& d);
  // Counts a dropped datagram's payload if it is a reliable data packet.
  void CountDropped(const RxDatagram& d);

  std::unique_ptr<PacketIo> inner_;
  const FaultSpec spec_;
  std::mt19937_64 rng_;
  std::mt19937_64 tx_rng_;
  bool bad_ = false;  // Gilbert-Elliott state
  // Packets the tail rule already dropped once (FIFO-bounded).
  std::set<std::array<uint64_t, 4>> tail_seen_;
  std::deque<std::array<uint64_t, 4>> tail_order_;
  std::deque<Held> held_;
  // The earliest release among held_ (steady_clock ticks; 0: at the next burst;
  // kNoRelease: none), written by RxBurst and read by the waits on other threads.
  std::atomic<int64_t> next_release_{kNoRelease};
  std::vector<std::vector<uint8_t>> emitted_;  // owned copies returned last
  std::vector<RxDatagram> scratch_;
  FaultCounters counters_;
};

// Wraps io in a FaultInjector if spec (EngineOptions::faults) asks for faults;
// returns io unchanged otherwise.
absl::StatusOr<std::unique_ptr<PacketIo>> MaybeInjectFaults(
    std::unique_ptr<PacketIo> io, const std::string& spec);

}  // namespace transport
}  // namespace optireduce
