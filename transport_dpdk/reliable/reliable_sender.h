// reliable_sender.h — loss recovery and congestion response of one peer's
// reliable packet stream. The engine owns the packets (headers, payload
// sources); this class decides what goes on the wire when:
//
//  - Acks (cumulative point + selective bitmap + a reported duplicate) are
//    applied through SendScoreboard at a cost independent of the window.
//  - Loss: RACK (LossDetector) after every ack and when its reorder timer
//    fires; a tail-loss probe once the newest transmission is unacked for
//    min(2 srtt, srtt + max(4 rttvar, min_pto)) + max ack delay (at least
//    min_pto; new data if the engine has any, else the newest packet again)
//    so a lost tail is found by the probe's ack in about a round trip
//    (also in recovery once every lost packet is resent; never later than the
//    RTO, which restarts from the probe); on an RTO (rtt_estimator.h;
//    exponential backoff, restarted by
//    every ack that delivers something) every packet in flight is marked
//    lost and resent as the congestion window allows. A thin flight (fewer
//    than kThinFlight packets on the wire: a short message, or the one
//    packet an RTO's window resends) gets at most a few acks per RTO, so a
//    loss burst of a few datagrams swallows several RTOs in a row: the first
//    kLinearRtos RTOs of a thin flight do not back off (as Linux's
//    tcp_thin_linear_timeouts); each sends one packet, so the backoff's
//    purpose, not adding to a congested path, holds without it. An RTO is spurious
//    (F-RTO style) when the first ack after it delivers a packet sent before
//    it that was not resent: the acks were only late (a descheduled peer),
//    so the packets it marked go back in flight and the window is restored.
//  - Packets the device did not accept (local backpressure) are lost at
//    once, with no congestion response.
//  - Congestion: CongestionWindow reduces once per episode; an episode
//    whose every retransmission proves spurious (reported duplicates, or
//    acks sooner than min_rtt) is undone, so late acks from a descheduled
//    peer cost a few packets, not a window resent.
//  - Pacing: a token bucket at 1.25 cwnd / min_rtt with a cwnd / 8 burst.
//
// No threads, no clock: every call takes the current time.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "transport_dpdk/reliable/congestion_window.h"
#include "transport_dpdk/reliable/loss_detector.h"
#include "transport_dpdk/reliable/pacer.h"
#include "transport_dpdk/reliable/rtt_estimator.h"
#include "transport_dpdk/reliable/send_scoreboard.h"

namespace optireduce {
namespace transport {

class ReliableSender {
 public:
  using Time = SendScoreboard::Time;
  using us = std::chrono::microseconds;
  static constexpr uint64_t kNone = SendScoreboard::kNone;

  struct Options {
    us initial_rto{20000}, min_rto{4000}, max_rto{200000};
    us max_ack_delay{100};  // the receiver's AckScheduler bound
    us min_pto{1000};       // tail-loss probe floor
    uint32_t mss = 1400;    // payload bytes of a full packet
    uint64_t window = 1 << 20;  // the receiver's byte window (cwnd cap)
    bool pacing = true;
  };
  struct Counters {
    uint64_t rto_events = 0;
    uint64_t tlp_probes = 0;
    uint64_t rack_lost = 0;        // packets RACK marked lost
    uint64_t rto_lost = 0;         // packets an RTO marked lost
    uint64_t local_drops = 0;      // not accepted by the device
    uint64_t retransmits = 0;
    uint64_t retransmitted_bytes = 0;
    uint64_t spurious = 0;         // retransmissions proven unneeded
    uint64_t undos = 0;            // congestion reductions undone
    uint64_t spurious_rtos = 0;    // RTOs undone by the next ack
    // Acks that delivered something after a silence of at least min_rto
    // with packets outstanding, and the summed length of those silences:
    // the time the sender spent waiting for a timer instead of the ack clock.
    uint64_t long_silences = 0;
    uint64_t long_silence_us = 0;
  };

  static constexpr uint64_t kThinFlight = 4;
  static constexpr int kLinearRtos = 6;

  explicit ReliableSender(const Options& o);

  // ---- sending ----
  // May a new packet of `bytes` leave now (congestion window, pacing)?
  bool CanSendNew(uint32_t bytes, Time now);
  void OnSendNew(uint64_t seq, uint32_t bytes, Time now);
  // The next lost packet the window and pacing allow to resend now (and
  // forgets it: the caller resends it and calls OnRetransmit), or kNone.
  uint64_t NextRetransmit(Time now);
  void OnRetransmit(uint64_t seq, Time now);
  // The device did not accept this transmission of seq.
  void OnLocalDrop(uint64_t seq);

  // ---- acks ----
  // Applies an ack; dsack: the duplicate seq the receiver reports, or
  // kNone. delivered(seq) is called for each newly acknowledged packet.
  // Returns false when the ack is invalid (acks what was never sent).
  bool OnAck(uint64_t cum, const uint8_t* sack, size_t sack_bytes, uint64_t dsack,
             Time now, absl::FunctionRef<void(uint64_t)> delivered);

  // ---- timers ----
  // Runs what is due: RACK's reorder timer, the tail-loss probe, the RTO.
  void OnTimer(Time now);
  // A probe is due: send one new packet or resend ProbeSeq() (with
  // OnRetransmit), then OnProbeSent(its seq).
  bool probe_pending() const { return probe_pending_; }
  uint64_t ProbeSeq() const;
  void OnProbeSent(uint64_t seq);
  // Earliest time OnTimer or a paced send has work (Time::max(): none).
  Time Deadline(Time now);

  const SendScoreboard& scoreboard() const { return sb_; }
  const CongestionWindow& cwnd() const { return cwnd_; }
  const RttEstimator& rtt() const { return rtt_; }
  const LossDetector& detector() const { return rack_; }
  const Counters& counters() const { return counters_; }
  void SetWindow(uint64_t window) { cwnd_.SetCap(window); }

 private:
  bool WindowAllows(uint32_t bytes) const;
  Time RtoDeadline() const;
  Time ProbeDeadline() const;
  void StartEpisode();
  void UpdatePacing();
  void OnSpurious(bool probe);

  Options opts_;
  SendScoreboard sb_;
  LossDetector rack_;
  RttEstimator rtt_;
  CongestionWindow cwnd_;
  Pacer pacer_;
  Counters counters_;
  Time last_progress_{};   // last ack that delivered something
  Time last_probe_{};      // the RTO restarts from a probe
  int consecutive_rtos_ = 0;  // since the last ack that delivered something
  Time busy_since_{};      // when the scoreboard last became non-empty
  // After an RTO until the next ack that delivers something: its time.
  bool rto_pending_check_ = false;
  Time rto_time_{};
  std::vector<std::pair<uint64_t, SendScoreboard::Segment>> acked_;  // one ack's
  bool probe_pending_ = false, probe_outstanding_ = false;
  uint64_t probe_seq_ = kNone;
  // Current loss episode: retransmissions not yet proven spurious.
  bool episode_ = false, undo_possible_ = false;
  uint64_t episode_end_ = 0;      // ends once cum passes this
  uint64_t episode_retrans_ = 0;  // retransmissions in it
  uint64_t episode_spurious_ = 0;
};

}  // namespace transport
}  // namespace optireduce
