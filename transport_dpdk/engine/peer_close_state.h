// peer_close_state.h — one peer's side of the closing handshake in one context: whether
// the peer's context is closing (its close probe arrived), and, while ours closes, the
// close probes we send it and whether it confirmed that it waits for nothing of ours. No
// I/O, no locks, time passed in; the engine (engine_liveness.cc, engine_receive.cc) sends
// and routes the packets.
#pragma once

#include <chrono>
#include <cstdint>

namespace optireduce {
namespace transport {

class PeerCloseState {
 public:
  using Clock = std::chrono::steady_clock;
  // How often a closing context asks a peer that has not confirmed yet.
  static constexpr std::chrono::microseconds kProbeEvery{1000};

  // The peer sent us a close probe: its context is closing (its user destroyed it).
  // Nothing new comes from it.
  void PeerClosing() { peer_closing_ = true; }
  bool peer_closing() const { return peer_closing_; }

  // The id of the close probe to send at `now` (1, 2, ...), or 0 while the last one is
  // less than kProbeEvery old.
  uint64_t ProbeDue(Clock::time_point now) {
    if (now < next_probe_) return 0;
    next_probe_ = now + kProbeEvery;
    return ++probe_id_;
  }
  // The id of the last close probe sent (0: none).
  uint64_t probe_id() const { return probe_id_; }

  // The peer answered close probe `id`; `settled`: it has nothing of ours to wait for (no
  // packet to us unacknowledged or queued). Probes go out every kProbeEvery, which can be
  // shorter than the round trip, so an answer to any probe sent after the last sequenced
  // packet from the peer counts (ids in (floor, probe_id]); one to an older probe may
  // describe the peer before that packet.
  void Answered(uint64_t id, bool settled) {
    if (settled && id > floor_ && id <= probe_id_) confirmed_ = true;
  }
  // A sequenced packet from the peer arrived: it sent something, so it is asked again
  // once that is acknowledged (answers to the probes sent so far describe it before).
  void SequencedArrival() {
    confirmed_ = false;
    floor_ = probe_id_;
  }
  // The peer confirmed it waits for nothing of ours, with no sequenced packet since.
  bool confirmed() const { return confirmed_; }

 private:
  bool peer_closing_ = false;
  bool confirmed_ = false;
  uint64_t probe_id_ = 0;
  uint64_t floor_ = 0;
  Clock::time_point next_probe_{};
};

}  // namespace transport
}  // namespace optireduce
