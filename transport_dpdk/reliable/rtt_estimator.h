// rtt_estimator.h — smoothed RTT and retransmission timeout (RFC 6298 style).
//
// RTO = srtt + max(4 rttvar, min_rto), within [min_rto, max_rto]: the floor is a
// margin above the smoothed RTT, as Linux's rto_min is, not an absolute value. A
// long but steady round trip (a queue: rttvar near zero) would otherwise put the
// RTO a fraction of a round trip above srtt — below the tail-loss probe's
// 2 srtt — and a little jitter or one descheduled tick would fire it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>

namespace optireduce {
namespace transport {

class RttEstimator {
 public:
  using us = std::chrono::microseconds;
  RttEstimator(us initial_rto, us min_rto, us max_rto)
      : rto_(initial_rto), min_(min_rto), max_(max_rto) {}

  // A sample from a packet that was sent exactly once (Karn's rule).
  void Sample(us rtt) {
    const double s = static_cast<double>(rtt.count());
    if (!have_) {
      srtt_ = s;
      rttvar_ = s / 2;
      have_ = true;
    } else {
      rttvar_ = 0.75 * rttvar_ + 0.25 * std::fabs(srtt_ - s);
      srtt_ = 0.875 * srtt_ + 0.125 * s;
    }
    Recompute();
  }
  // An RTO fired: back off exponentially until the next new ack.
  void Backoff() { rto_ = std::min(max_, rto_ * 2); }
  // New data was acknowledged: drop the backoff.
  void ResetBackoff() {
    if (have_) Recompute();
  }
  us rto() const { return rto_; }
  us srtt() const { return us(static_cast<long>(have_ ? srtt_ : 0)); }
  us rttvar() const { return us(static_cast<long>(have_ ? rttvar_ : 0)); }

 private:
  void Recompute() {
    const us margin = std::max(us(static_cast<long>(4 * rttvar_)), min_);
    rto_ = std::clamp(us(static_cast<long>(srtt_)) + margin, min_, max_);
  }
  bool have_ = false;
  double srtt_ = 0, rttvar_ = 0;
  us rto_, min_, max_;
};

}  // namespace transport
}  // namespace optireduce
