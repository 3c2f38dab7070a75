// loss_detector.h — time-based loss detection in the style of RACK
// (RFC 8985): a packet is lost once a packet sent after it was delivered
// and it stayed unacknowledged for the newest delivered packet's RTT plus a
// reordering window. Reordering therefore costs a quarter of a round trip,
// not a retransmission, and a lost retransmission is found the same way as
// a lost original. The reordering window starts at min_rtt / 4 and widens
// by that much each time a retransmission proves spurious (the receiver
// reported a duplicate, or the ack came back faster than any round trip);
// it decays back after 16 loss episodes without such evidence.
#pragma once

#include <chrono>
#include <cstdint>

#include "transport_dpdk/reliable/send_scoreboard.h"

namespace optireduce {
namespace transport {

class LossDetector {
 public:
  using Time = SendScoreboard::Time;
  using us = std::chrono::microseconds;

  enum class Sample {
    kValid,      // the ack is for this transmission
    kAmbiguous,  // retransmitted, and acked sooner than min_rtt: the ack
                 // is for an earlier copy (the retransmission was spurious);
                 // RACK uses the first transmission's time
  };

  // A packet the scoreboard reports delivered (before it is forgotten).
  Sample OnDelivered(uint64_t seq, const SendScoreboard::Segment& s, Time now);

  // Marks the packets RACK finds lost; returns how many. Afterwards
  // reorder_deadline() says when packets not yet lost will be judged again.
  uint64_t DetectLosses(SendScoreboard& sb, Time now, us srtt);
  Time reorder_deadline() const { return reorder_deadline_; }

  // Evidence that a retransmission was not needed.
  void OnSpurious();
  // A loss-recovery episode ended.
  void OnEpisodeEnd();

  us reo_wnd(us srtt) const;
  us min_rtt() const { return min_rtt_; }
  bool reordering_seen() const { return reordering_seen_; }
  int reo_wnd_mult() const { return mult_; }

 private:
  bool have_ = false;
  Time rack_xmit_{};          // send time of the newest delivered packet
  uint64_t rack_seq_ = 0;     // its seq (ties)
  us rack_rtt_{0};            // its RTT
  us min_rtt_ = us::max();
  uint64_t fack_ = 0;         // highest delivered seq + 1
  bool reordering_seen_ = false;
  int mult_ = 1;
  int episodes_ = 0;          // since the window last widened
  Time reorder_deadline_ = Time::max();
};

}  // namespace transport
}  // namespace optireduce
