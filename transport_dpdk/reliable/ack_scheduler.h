// ack_scheduler.h — when a receiver acknowledges: at once for anything the
// sender needs to act on (a gap, a duplicate, a message's last packet or a
// control packet), otherwise every `every_packets` packets or
// `every_bytes` bytes, and at the latest `max_delay` after the first
// packet not yet acknowledged. A busy receiver thus sends one ack per batch
// instead of one per packet, and a quiet one never holds an ack long.
#pragma once

#include <chrono>
#include <cstdint>

namespace optireduce {
namespace transport {

class AckScheduler {
 public:
  using Time = std::chrono::steady_clock::time_point;

  AckScheduler(uint32_t every_packets, uint64_t every_bytes,
               std::chrono::microseconds max_delay)
      : every_packets_(every_packets), every_bytes_(every_bytes), max_delay_(max_delay) {}

  // A sequenced packet of `bytes` arrived (or was a duplicate: urgent).
  void OnArrival(Time now, uint32_t bytes, bool urgent) {
    if (packets_ == 0 && !urgent_) first_ = now;
    ++packets_;
    bytes_ += bytes;
    urgent_ = urgent_ || urgent;
  }
  bool Pending() const { return packets_ > 0 || urgent_; }
  bool Due(Time now) const {
    if (!Pending()) return false;
    return urgent_ || packets_ >= every_packets_ || bytes_ >= every_bytes_ ||
           now - first_ >= max_delay_;
  }
  // When a pending ack becomes due (Time::max() when none is pending).
  Time Deadline() const {
    if (!Pending()) return Time::max();
    return urgent_ ? first_ : first_ + max_delay_;
  }
  void OnAckSent() {
    packets_ = 0;
    bytes_ = 0;
    urgent_ = false;
  }
  std::chrono::microseconds max_delay() const { return max_delay_; }

 private:
  uint32_t every_packets_;
  uint64_t every_bytes_;
  std::chrono::microseconds max_delay_;
  uint32_t packets_ = 0;
  uint64_t bytes_ = 0;
  bool urgent_ = false;
  Time first_{};
};

}  // namespace transport
}  // namespace optireduce
