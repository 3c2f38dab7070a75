#include "transport_dpdk/reliable/loss_detector.h"

#include <algorithm>

namespace optireduce {
namespace transport {

LossDetector::Sample LossDetector::OnDelivered(uint64_t seq,
                                               const SendScoreboard::Segment& s,
                                               Time now) {
  Sample result = Sample::kValid;
  Time sent = s.sent;
  us rtt = std::chrono::duration_cast<us>(now - sent);
  if (s.transmissions > 1 && min_rtt_ != us::max() && rtt < min_rtt_) {
    // Judge from the first transmission instead: later packets are marked
    // lost only if they were sent before that one.
    result = Sample::kAmbiguous;
    sent = s.first_sent;
    rtt = std::chrono::duration_cast<us>(now - sent);
  }
  if (s.transmissions == 1) min_rtt_ = std::min(min_rtt_, std::max(rtt, us(1)));
  if (seq + 1 < fack_ && s.transmissions == 1) reordering_seen_ = true;
  fack_ = std::max(fack_, seq + 1);
  if (!have_ || sent > rack_xmit_ || (sent == rack_xmit_ && seq > rack_seq_)) {
    have_ = true;
    rack_xmit_ = sent;
    rack_seq_ = seq;
    rack_rtt_ = rtt;
  }
  return result;
}

LossDetector::us LossDetector::reo_wnd(us srtt) const {
  if (min_rtt_ == us::max()) return us(0);
  us w = min_rtt_ / 4 * mult_;
  if (srtt.count() > 0) w = std::min(w, srtt);
  return std::max(w, us(1));
}

uint64_t LossDetector::DetectLosses(SendScoreboard& sb, Time now, us srtt) {
  reorder_deadline_ = Time::max();
  if (!have_) return 0;
  const us wnd = reo_wnd(srtt);
  uint64_t lost = 0;
  for (uint64_t seq = sb.OldestInFlight(); seq != SendScoreboard::kNone;) {
    const SendScoreboard::Segment& s = sb.Get(seq);
    // Only packets sent before the newest delivered one can be judged.
    if (s.sent > rack_xmit_ || (s.sent == rack_xmit_ && seq > rack_seq_)) break;
    const Time due = s.sent + rack_rtt_ + wnd;
    if (due > now) {
      reorder_deadline_ = due;  // the list is in send order: the rest later
      break;
    }
    const uint64_t next = sb.NextInFlight(seq);
    sb.MarkLost(seq);
    ++lost;
    seq = next;
  }
  return lost;
}

void LossDetector::OnSpurious() {
  if (mult_ < 64) ++mult_;
  episodes_ = 0;
}

void LossDetector::OnEpisodeEnd() {
  if (++episodes_ >= 16) {
    mult_ = 1;
    episodes_ = 0;
  }
}

}  // namespace transport
}  // namespace optireduce
