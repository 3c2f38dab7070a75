// send_scoreboard.h — the sender's record of every reliable packet to one
// peer that is not yet cumulatively acknowledged: in flight, marked lost
// (waiting for a retransmission) or selectively acknowledged.
//
// Packets in flight are kept in a list ordered by their last transmission
// time (a retransmission moves a packet to the newest end), which is what
// time-based loss detection walks (loss_detector.h); lost packets wait in a
// FIFO. Applying an ack costs O(newly delivered packets + ranges in its
// bitmap + bitmap words), never a scan of every packet in flight:
// selectively acknowledged ranges are merged into an interval set, so bits
// an earlier ack already reported are skipped a range at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>

#include "absl/functional/function_ref.h"

namespace optireduce {
namespace transport {

class SendScoreboard {
 public:
  using Time = std::chrono::steady_clock::time_point;
  static constexpr uint64_t kNone = UINT64_MAX;

  enum class State : uint8_t { kInFlight, kLost, kSacked };
  struct Segment {
    Time sent{};                 // last transmission
    Time first_sent{};           // first transmission
    uint32_t bytes = 0;
    uint32_t transmissions = 0;  // 1 + retransmissions
    State state = State::kInFlight;
    bool lost_queued = false;    // an entry in the lost FIFO refers to it
    uint64_t prev = kNone, next = kNone;  // in-flight list (by send time)
  };

  // Lowest seq not cumulatively acknowledged / next seq to be sent.
  uint64_t base() const { return base_; }
  uint64_t next_seq() const { return next_; }
  bool empty() const { return base_ == next_; }
  uint64_t outstanding() const { return next_ - base_; }
  // Bytes of packets in flight (not acknowledged, not marked lost).
  uint64_t pipe_bytes() const { return pipe_; }
  uint64_t in_flight_packets() const { return in_flight_; }
  // Has seq been sent and not yet cumulatively acknowledged?
  bool Tracks(uint64_t seq) const { return seq >= base_ && seq < next_; }
  const Segment& Get(uint64_t seq) const { return segs_[seq - base_]; }

  // A first transmission; seq must be next_seq().
  void OnSend(uint64_t seq, uint32_t bytes, Time now);
  // A retransmission of a tracked, unacknowledged packet.
  void OnRetransmit(uint64_t seq, Time now);

  // Applies an ack: every seq < cum arrived, and bit i of sack (LSB first)
  // says seq cum + 1 + i arrived. Calls delivered(seq, segment) once for
  // each packet this ack newly reports, in no particular order. Returns
  // false (and changes nothing) when cum is beyond next_seq().
  bool OnAck(uint64_t cum, const uint8_t* sack, size_t sack_bytes,
             absl::FunctionRef<void(uint64_t, const Segment&)> delivered);

  // In flight -> lost (queued for retransmission). No-op otherwise.
  void MarkLost(uint64_t seq);
  // Every packet in flight -> lost, oldest transmission first.
  void MarkAllLost();
  // Every packet marked lost and not resent since -> in flight again, ahead
  // of (as sent before) everything now in flight. For an RTO found to be
  // spurious: the packets it marked are on their way after all.
  void RestoreLost();

  // In-flight list: oldest / newest transmission, and the one after seq.
  uint64_t OldestInFlight() const { return head_; }
  uint64_t NewestInFlight() const { return tail_; }
  uint64_t NextInFlight(uint64_t seq) const { return Get(seq).next; }

  // The oldest-marked lost packet still waiting (kNone if none); PopLost
  // removes it from the FIFO (the caller retransmits it).
  uint64_t PeekLost();
  uint64_t PopLost();
  uint64_t lost_packets() const { return lost_; }
  // Highest seq (+1) selectively or cumulatively acknowledged so far.
  uint64_t highest_delivered() const { return highest_; }

 private:
  Segment& At(uint64_t seq) { return segs_[seq - base_]; }
  void Link(uint64_t seq);    // append to the in-flight list
  void Unlink(uint64_t seq);  // remove from it
  // Marks the not-yet-sacked part of [b, e) sacked.
  void SackRange(uint64_t b, uint64_t e,
                 absl::FunctionRef<void(uint64_t, const Segment&)> delivered);
  void Deliver(uint64_t seq,
               absl::FunctionRef<void(uint64_t, const Segment&)> delivered);

  uint64_t base_ = 0, next_ = 0;
  std::deque<Segment> segs_;  // segs_[i] <-> seq base_ + i
  uint64_t head_ = kNone, tail_ = kNone;
  uint64_t pipe_ = 0, in_flight_ = 0, lost_ = 0, highest_ = 0;
  std::deque<uint64_t> lost_fifo_;
  std::map<uint64_t, uint64_t> sacked_;  // disjoint [begin, end) above base_
};

}  // namespace transport
}  // namespace optireduce
