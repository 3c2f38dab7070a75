#include "transport_dpdk/reliable/reliable_sender.h"

#include <algorithm>

namespace optireduce {
namespace transport {

ReliableSender::ReliableSender(const Options& o)
    : opts_(o),
      rtt_(o.initial_rto, o.min_rto, o.max_rto),
      cwnd_(o.mss, o.window) {}

bool ReliableSender::WindowAllows(uint32_t bytes) const {
  const uint64_t pipe = sb_.pipe_bytes();
  return pipe == 0 || pipe + bytes <= cwnd_.cwnd();
}

bool ReliableSender::CanSendNew(uint32_t bytes, Time now) {
  if (!WindowAllows(bytes)) return false;
  return !opts_.pacing || pacer_.CanSend(now);
}

void ReliableSender::OnSendNew(uint64_t seq, uint32_t bytes, Time now) {
  if (sb_.empty()) busy_since_ = now;
  sb_.OnSend(seq, bytes, now);
  pacer_.OnSend(bytes);
}

uint64_t ReliableSender::NextRetransmit(Time now) {
  const uint64_t seq = sb_.PeekLost();
  if (seq == kNone) return kNone;
  if (!WindowAllows(sb_.Get(seq).bytes)) return kNone;
  if (opts_.pacing && !pacer_.CanSend(now)) return kNone;
  return sb_.PopLost();
}

void ReliableSender::OnRetransmit(uint64_t seq, Time now) {
  if (!sb_.Tracks(seq)) return;
  const uint32_t bytes = sb_.Get(seq).bytes;
  sb_.OnRetransmit(seq, now);
  pacer_.OnSend(bytes);
  ++counters_.retransmits;
  counters_.retransmitted_bytes += bytes;
  if (episode_) ++episode_retrans_;
}

void ReliableSender::OnLocalDrop(uint64_t seq) {
  if (!sb_.Tracks(seq)) return;
  ++counters_.local_drops;
  sb_.MarkLost(seq);
}

void ReliableSender::StartEpisode() {
  if (!episode_) {
    episode_ = true;
    undo_possible_ = true;
    episode_retrans_ = 0;
    episode_spurious_ = 0;
  }
  episode_end_ = sb_.next_seq();
}

void ReliableSender::OnSpurious(bool probe) {
  ++counters_.spurious;
  if (!probe) rack_.OnSpurious();
  // The duplicates may come after the episode ended (the late acks that
  // ended it came first): the reduction stays undoable until the next one.
  if (!undo_possible_) return;
  ++episode_spurious_;
  if (episode_retrans_ > 0 && episode_spurious_ >= episode_retrans_) {
    cwnd_.Undo();
    rtt_.ResetBackoff();
    ++counters_.undos;
    episode_ = undo_possible_ = false;
  }
}

bool ReliableSender::OnAck(uint64_t cum, const uint8_t* sack, size_t sack_bytes,
                           uint64_t dsack, Time now,
                           absl::FunctionRef<void(uint64_t)> delivered) {
  if (cum > sb_.next_seq()) return false;
  // A reported duplicate: spurious if we sent that packet more than once
  // (a packet already forgotten was acknowledged, so it was resent).
  if (dsack != kNone && dsack < sb_.next_seq()) {
    if (!sb_.Tracks(dsack) || sb_.Get(dsack).transmissions > 1) {
      OnSpurious(dsack == probe_seq_);
    }
  }
  uint64_t bytes = 0, packets = 0;
  bool sent_before_rto = false;
  acked_.clear();
  sb_.OnAck(cum, sack, sack_bytes, [&](uint64_t seq, const SendScoreboard::Segment& s) {
    if (s.sent < rto_time_) sent_before_rto = true;
    acked_.push_back({seq, s});
  });
  const bool spurious_rto = rto_pending_check_ && !acked_.empty() && sent_before_rto;
  if (!acked_.empty()) rto_pending_check_ = false;
  if (spurious_rto) {
    // What the RTO marked lost is on its way after all.
    sb_.RestoreLost();
    cwnd_.Undo();
    ++counters_.spurious_rtos;
    ++counters_.undos;
    episode_ = undo_possible_ = false;
  }
  for (auto& [seq, seg] : acked_) {
    SendScoreboard::Segment s = seg;
    // After a spurious RTO an acked retransmission is its original's ack:
    // judging RACK by the resend time would mark everything sent before
    // the RTO lost.
    if (spurious_rto && s.transmissions > 1) s.sent = s.first_sent;
    const LossDetector::Sample sample = rack_.OnDelivered(seq, s, now);
    if (sample == LossDetector::Sample::kValid && s.transmissions == 1) {
      rtt_.Sample(std::chrono::duration_cast<us>(now - s.sent));  // Karn's rule
    }
    bytes += s.bytes;
    ++packets;
    delivered(seq);
  }
  if (packets > 0) {
    const Time since = std::max(last_progress_, busy_since_);
    if (now - since >= opts_.min_rto) {
      ++counters_.long_silences;
      counters_.long_silence_us += std::chrono::duration_cast<us>(now - since).count();
    }
    last_progress_ = now;
    consecutive_rtos_ = 0;
    rtt_.ResetBackoff();
    probe_pending_ = probe_outstanding_ = false;
  }
  cwnd_.OnAck(bytes, sb_.base());
  if (episode_ && sb_.base() >= episode_end_) {
    episode_ = false;
    rack_.OnEpisodeEnd();
  }
  const uint64_t lost = rack_.DetectLosses(sb_, now, rtt_.srtt());
  if (lost > 0) {
    counters_.rack_lost += lost;
    StartEpisode();
    cwnd_.OnLoss(sb_.next_seq());
  }
  UpdatePacing();
  return true;
}

ReliableSender::Time ReliableSender::RtoDeadline() const {
  const uint64_t head = sb_.OldestInFlight();
  if (head == kNone) return Time::max();
  return std::max({sb_.Get(head).sent, last_progress_, last_probe_}) + rtt_.rto();
}

ReliableSender::Time ReliableSender::ProbeDeadline() const {
  // In recovery too, once every lost packet is resent: when the tail of the
  // flight (retransmissions included) is lost, nothing sent later comes back
  // for RACK to judge it by.
  if (probe_outstanding_ || sb_.in_flight_packets() == 0 || sb_.lost_packets() > 0) {
    return Time::max();
  }
  // 2 srtt (RFC 8985), or sooner when the RTT is steady: srtt + max(4 rttvar,
  // min_pto). A long srtt here is mostly the sender's own queue, which is
  // steady; doubling it only delays finding a lost tail, and a needless probe
  // costs one packet.
  us pto = rtt_.rto();
  if (rtt_.srtt().count() > 0) {
    pto = std::min(2 * rtt_.srtt(), rtt_.srtt() + std::max(4 * rtt_.rttvar(), opts_.min_pto)) +
          opts_.max_ack_delay;
  }
  pto = std::max(pto, opts_.min_pto);
  // Never after the RTO: the probe takes its place (RFC 8985 §7.2) and the
  // RTO restarts from the probe.
  // From the newest transmission: its ack is the one a lost tail withholds,
  // and acks of older packets do not postpone it.
  return std::min(sb_.Get(sb_.NewestInFlight()).sent + pto, RtoDeadline());
}

void ReliableSender::OnTimer(Time now) {
  if (now >= rack_.reorder_deadline()) {
    const uint64_t lost = rack_.DetectLosses(sb_, now, rtt_.srtt());
    if (lost > 0) {
      counters_.rack_lost += lost;
      StartEpisode();
      cwnd_.OnLoss(sb_.next_seq());
    }
  }
  if (now >= ProbeDeadline()) {
    probe_pending_ = probe_outstanding_ = true;
    last_probe_ = now;
  } else if (now >= RtoDeadline()) {
    ++counters_.rto_events;
    counters_.rto_lost += sb_.in_flight_packets();
    // A thin flight's RTOs stay linear for the first few (see the header).
    if (sb_.in_flight_packets() >= kThinFlight ||
        consecutive_rtos_ >= kLinearRtos) {
      rtt_.Backoff();
    }
    ++consecutive_rtos_;
    StartEpisode();
    cwnd_.OnRto(sb_.next_seq());
    sb_.MarkAllLost();
    probe_pending_ = probe_outstanding_ = false;
    rto_pending_check_ = true;
    rto_time_ = now;
  }
  UpdatePacing();
}

uint64_t ReliableSender::ProbeSeq() const { return sb_.NewestInFlight(); }

void ReliableSender::OnProbeSent(uint64_t seq) {
  probe_pending_ = false;
  probe_seq_ = seq;
  ++counters_.tlp_probes;
}

ReliableSender::Time ReliableSender::Deadline(Time now) {
  Time t = std::min({rack_.reorder_deadline(), RtoDeadline(), ProbeDeadline()});
  if (probe_pending_) t = now;
  if (opts_.pacing && pacer_.rate() > 0 && !pacer_.CanSend(now)) {
    t = std::min(t, pacer_.NextSend(now));
  }
  return t;
}

void ReliableSender::UpdatePacing() {
  if (!opts_.pacing || rack_.min_rtt() == us::max()) {
    pacer_.SetRate(0, 1);
    return;
  }
  const double cwnd = static_cast<double>(cwnd_.cwnd());
  const double rtt = std::chrono::duration<double>(rack_.min_rtt()).count();
  pacer_.SetRate(1.25 * cwnd / rtt, std::max(cwnd / 8, 4.0 * opts_.mss));
}

}  // namespace transport
}  // namespace optireduce
