// The bounded service's send side: per context, the queue of whole-source sends and
// repairs for each peer, incast control (only the oldest `senders` sends are active at a
// time; repairs always go), and the device's token bucket that paces them. It reads the
// sources and hands finished datagrams to the engine through `BoundedPort`, a port
// declared here and implemented by the engine; it knows no header, socket or lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "transport_dpdk/bounded/source_access.h"

namespace optireduce {
namespace transport {

// One bounded DATA datagram, ready for the engine to address and encode.
struct BoundedPacket {
  uint64_t op = 0;
  uint64_t offset = 0;
  uint64_t total = 0;     // the length of the sender's whole source
  uint64_t op_bytes = 0;  // the sender's whole allreduce (0: not stated, as in repairs)
  const char* data = nullptr;
  uint32_t len = 0;
  bool last = false;       // among the last packets of the source
  bool estimated = false;  // the source is an estimate
};

// What the sender needs of the engine for one context. Called from the sender's Pump
// only, with the engine's lock held.
class BoundedPort {
 public:
  virtual ~BoundedPort() = default;
  // Whether `peer` is connected (only connected peers are sent to).
  virtual bool Connected(int peer) const = 0;
  // Payload bytes per bounded datagram to `peer`.
  virtual uint32_t Payload(int peer) const = 0;
  // Calls fn(bytes, size, estimated) with the source of `op` sent to `peer` while it is
  // valid (kDone); otherwise says why it did not. Never blocks.
  virtual SourceAccess ReadSource(uint64_t op, int peer,
                                  const std::function<void(const char*, size_t, bool)>& fn) = 0;
  // Hands the device what the engine holds batched from other senders.
  virtual void Flush() = 0;
  // The device refused datagrams in this progress iteration (TX backpressure).
  virtual bool Blocked() const = 0;
  // Hands the device packets[0, n) to `peer` at once (n <= BoundedSender::kMaxBurst),
  // before the source they point into is let go; returns how many it took (a prefix).
  // Fewer than n: Blocked() holds from then on.
  virtual size_t Transmit(int peer, const BoundedPacket* packets, size_t n) = 0;
};

// The device's token bucket of bytes for bounded sends (no acks clock them), shared by
// its contexts. The burst allows a millisecond at the rate, so the progress thread wakes
// at most about once per millisecond to pace instead of spinning between packets.
class BoundedPacer {
 public:
  using Clock = std::chrono::steady_clock;

  BoundedPacer() = default;
  // rate: bytes per second (0 or less: unpaced); payload: the device's bounded payload
  // per datagram; overhead: bytes each datagram costs beyond its payload (the header).
  BoundedPacer(double rate, uint32_t payload, size_t overhead);

  // Adds the tokens earned since the last refill (capped at the burst).
  void Refill(Clock::time_point now);
  // Whether a packet may go now (tokens left, or unpaced).
  bool MaySend() const { return rate_ <= 0 || tokens_ > 0; }
  // When tokens are back (MaySend false).
  Clock::time_point Due(Clock::time_point now) const;
  void Spend(uint64_t len) { tokens_ -= static_cast<double>(len + overhead_); }
  void GiveBack(uint64_t len) { tokens_ += static_cast<double>(len + overhead_); }
  double tokens() const { return tokens_; }
  double burst() const { return burst_; }

 private:
  double rate_ = 0;
  double burst_ = 0;
  size_t overhead_ = 0;
  double tokens_ = 0;
  Clock::time_point refill_{};
};

// Unreliable bytes of one bounded operation still to send to a peer: the whole source at
// first, or the ranges a repair request asked for.
struct BoundedJob {
  using Range = std::pair<uint64_t, uint64_t>;  // [begin, end)
  // The whole source of `op` (`total` bytes), the `order`-th send of its context;
  // packets at or after `last_from` carry the "last" flag.
  static BoundedJob Send(uint64_t op, uint64_t total, uint64_t last_from, uint64_t order,
                         uint64_t op_bytes = 0);
  // The ranges of `op` a repair request asked for (served before every send).
  static BoundedJob Repair(uint64_t op, std::vector<Range> ranges);
  bool is_repair() const { return order == 0; }

  uint64_t op = 0;
  uint64_t total = 0;
  uint64_t op_bytes = 0;  // the sender's whole allreduce, stated in every packet (0: repairs)
  std::vector<Range> ranges;
  size_t range = 0;    // current range
  uint64_t next = 0;   // next offset within it
  uint64_t last_from = UINT64_MAX;  // packets at or after this carry the "last" flag
  // Submission order within the context (0: a repair, served first). Only the oldest
  // `senders` sends are active at a time (BoundedSender::Pump).
  uint64_t order = 0;
};

// One context's bounded sends. Not thread-safe: the engine calls it under its lock.
class BoundedSender {
 public:
  using Clock = std::chrono::steady_clock;
  using Range = BoundedJob::Range;

  // Packets handed to the device at once at most.
  static constexpr size_t kMaxBurst = 64;
  // Packets sent to one peer per Pump (fairness among peers).
  static constexpr int kPeerBudget = 64;
  // How long the sender waits before sending again what the device refused.
  static constexpr std::chrono::microseconds kTxRetry{20};
  // Repair jobs (distinct operations) queued per peer at most; more requests are dropped
  // and asked again by the requester's next round.
  static constexpr size_t kMaxQueuedRepairs = 64;
  // Ranges one repair job holds at most (as many as one request carries).
  static constexpr size_t kMaxRepairRanges = 4096;

  BoundedSender() = default;
  // `size` ranks; `senders` peers sent to at once (clamped to [1, size - 1]).
  BoundedSender(int size, int senders);

  // Queues the whole source of `op` (`total` bytes) for `peer`, sent in packets of
  // `payload` bytes; the last 1% of them (at least four) carry the "last" flag.
  void QueueSend(int peer, uint64_t op, uint64_t total, uint32_t payload, uint64_t op_bytes);

  // What became of a repair request.
  enum class RepairQueued { kQueued, kMerged, kDropped, kNothing };
  // Queues the ranges of `op` that `peer` asked for, clipped to the source's
  // `source_bytes` and merged (a byte at most once); a request for an operation whose
  // repair is still queued is merged into it (kMerged), beyond kMaxQueuedRepairs it is
  // dropped (kDropped); kNothing: no byte of the source asked.
  RepairQueued QueueRepair(int peer, uint64_t op, std::vector<Range> asked,
                           uint64_t source_bytes);

  // Sends what pacing, incast control and the device allow now; brings `*deadline`
  // forward to when it should be called again (`spin`: how long the caller's loop spins
  // without sleeping).
  void Pump(BoundedPort& port, BoundedPacer& pacer, Clock::time_point now,
            Clock::duration spin, Clock::time_point* deadline);

  // Drops every queued job (the context failed, or lost its sources).
  void Clear();
  // Jobs queued, and sends (not repairs) of `op` queued.
  size_t Pending() const;
  size_t QueuedSends(uint64_t op) const;
  void SetSenders(int senders);
  int senders() const { return senders_; }

 private:
  void PumpPeer(BoundedPort& port, BoundedPacer& pacer, int peer, Clock::time_point now,
                Clock::duration spin, Clock::time_point* deadline);
  // Sends from job j's current range of the source (src, n); false: the range lies past
  // the source's end.
  bool SendFrom(BoundedPort& port, BoundedPacer& pacer, int peer, BoundedJob& j,
                const char* src, size_t n, bool est, int* budget);

  int size_ = 0;
  std::vector<std::deque<BoundedJob>> queues_;  // by peer rank
  uint64_t next_order_ = 1;
  int senders_ = 1;
};

}  // namespace transport
}  // namespace optireduce
