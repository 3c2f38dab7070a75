// pacer.h — spreads a window's worth of packets over a round trip: a token
// bucket whose rate the sender derives from its congestion window and RTT.
#pragma once

#include <algorithm>
#include <chrono>

namespace optireduce {
namespace transport {

class Pacer {
 public:
  using Time = std::chrono::steady_clock::time_point;

  // bytes_per_second <= 0: unpaced. burst: bytes that may leave at once.
  void SetRate(double bytes_per_second, double burst) {
    rate_ = bytes_per_second;
    burst_ = std::max(burst, 1.0);
    tokens_ = std::min(tokens_, burst_);
  }
  double rate() const { return rate_; }

  // May a packet leave now? (The bucket may go negative by one packet.)
  bool CanSend(Time now) {
    if (rate_ <= 0) return true;
    Refill(now);
    return tokens_ > 0;
  }
  void OnSend(uint32_t bytes) {
    if (rate_ > 0) tokens_ -= bytes;
  }
  // When CanSend will next be true (now if it is).
  Time NextSend(Time now) {
    if (!CanSend(now)) {
      const std::chrono::duration<double> wait(-tokens_ / rate_ + 1e-6);
      return now + std::chrono::duration_cast<Time::duration>(wait);
    }
    return now;
  }

 private:
  void Refill(Time now) {
    if (last_ == Time{}) {
      last_ = now;
      tokens_ = burst_;
      return;
    }
    const double dt = std::chrono::duration<double>(now - last_).count();
    if (dt > 0) {
      tokens_ = std::min(burst_, tokens_ + dt * rate_);
      last_ = now;
    }
  }
  double rate_ = 0, burst_ = 1, tokens_ = 0;
  Time last_{};
};

}  // namespace transport
}  // namespace optireduce
