// congestion_window.h — how many bytes the sender may have in flight to one
// peer, beside the receiver's byte window (NewReno-like, CUBIC's backoff).
//
// It starts at the receiver's window (a datacenter path has no unknown
// bottleneck to probe at first). A loss episode multiplies it by kBeta once
// (one reduction per window: until the ack point passes what was sent when
// the loss was found); an RTO drops it to one packet and slow start climbs
// back to the reduced threshold. Growth: slow start below the threshold,
// then one packet per window of acknowledged bytes; never above the cap.
// A reduction found spurious (the retransmitted packets had arrived) is
// undone.
#pragma once

#include <algorithm>
#include <cstdint>

namespace optireduce {
namespace transport {

class CongestionWindow {
 public:
  static constexpr double kBeta = 0.7;

  CongestionWindow(uint32_t mss, uint64_t cap) : mss_(mss) { SetCap(cap); cwnd_ = cap_; }

  uint64_t cwnd() const { return cwnd_; }
  uint64_t ssthresh() const { return ssthresh_; }
  bool in_recovery() const { return in_recovery_; }
  uint32_t mss() const { return mss_; }
  bool in_slow_start() const { return cwnd_ < ssthresh_; }

  // The receiver's window changed: the window never exceeds it.
  void SetCap(uint64_t cap) {
    cap_ = std::max<uint64_t>(cap, 2ull * mss_);
    cwnd_ = std::min(cwnd_ == 0 ? cap_ : cwnd_, cap_);
    ssthresh_ = std::min(ssthresh_ == 0 ? cap_ : ssthresh_, cap_);
  }

  // `bytes` newly acknowledged; `cum`: the new cumulative ack point.
  void OnAck(uint64_t bytes, uint64_t cum) {
    if (in_recovery_ && cum >= recovery_point_) in_recovery_ = rto_ = false;
    // Fast recovery holds the window; after an RTO it slow-starts.
    if ((in_recovery_ && !rto_) || bytes == 0) return;
    if (cwnd_ < ssthresh_) {
      cwnd_ = std::min(cwnd_ + bytes, ssthresh_);
    } else {
      acc_ += bytes;
      if (acc_ >= cwnd_) {
        acc_ -= cwnd_;
        cwnd_ += mss_;
      }
    }
    cwnd_ = std::min(cwnd_, cap_);
  }

  // Loss found by the ack clock; next_seq: the next sequence number to be
  // sent (the episode ends once everything before it is acknowledged).
  void OnLoss(uint64_t next_seq) {
    if (in_recovery_) return;
    Save();
    in_recovery_ = true;
    recovery_point_ = next_seq;
    ssthresh_ = std::max<uint64_t>(static_cast<uint64_t>(cwnd_ * kBeta), 2ull * mss_);
    cwnd_ = ssthresh_;
    acc_ = 0;
  }

  // Retransmission timeout: one packet, slow start to the reduced threshold.
  void OnRto(uint64_t next_seq) {
    if (!in_recovery_) {
      Save();
      ssthresh_ = std::max<uint64_t>(static_cast<uint64_t>(cwnd_ * kBeta), 2ull * mss_);
    }
    in_recovery_ = true;
    rto_ = true;
    recovery_point_ = next_seq;
    cwnd_ = mss_;
    acc_ = 0;
  }

  // The last reduction was spurious: restore the window from before it.
  void Undo() {
    if (!saved_) return;
    cwnd_ = std::max(cwnd_, saved_cwnd_);
    ssthresh_ = std::max(ssthresh_, saved_ssthresh_);
    in_recovery_ = false;
    rto_ = false;
    saved_ = false;
  }

 private:
  void Save() {
    saved_ = true;
    saved_cwnd_ = cwnd_;
    saved_ssthresh_ = ssthresh_;
  }
  const uint32_t mss_;
  uint64_t cap_ = 0, cwnd_ = 0, ssthresh_ = 0, acc_ = 0;
  bool in_recovery_ = false, rto_ = false, saved_ = false;
  uint64_t recovery_point_ = 0;
  uint64_t saved_cwnd_ = 0, saved_ssthresh_ = 0;
};

}  // namespace transport
}  // namespace optireduce
