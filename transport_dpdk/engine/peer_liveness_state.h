// peer_liveness_state.h — what the engine knows about one peer's liveness in one context:
// the probe schedule and verdict (PeerLiveness, reliable/peer_liveness.h), the ids of the
// PINGs sent to it, and why it is gone when something said so (its ABORT, or another peer
// that went before it). No I/O, no locks, time passed in; the engine
// (engine_liveness.cc) routes packets and reports to it and acts on its verdicts.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "transport_dpdk/reliable/peer_liveness.h"

namespace optireduce {
namespace transport {

class PeerLivenessState {
 public:
  using Clock = PeerLiveness::Clock;
  using Verdict = PeerLiveness::Verdict;
  // An ICMP report quoting one of the last this many PINGs sent to the peer counts as
  // quoting a PING in flight (PingInFlight).
  static constexpr uint64_t kPingsInFlight = 64;

  // rank: the peer's rank; dead_after: the silence bound (0: none).
  explicit PeerLivenessState(int rank = -1,
                             std::chrono::milliseconds dead_after = std::chrono::milliseconds(0))
      : rank_(rank), schedule_(dead_after) {}

  int rank() const { return rank_; }

  // The pair to the peer was connected: it counts as heard then.
  void Connected(Clock::time_point now) { schedule_.Connected(now); }
  // A validated packet from the peer arrived (`probe_answer`: a PONG). It is alive: a
  // reason someone gave for it being gone is dropped.
  void Heard(Clock::time_point now, bool probe_answer);
  // This rank's own thread stalled, or the path is still coming up: a fresh window.
  void Restart(Clock::time_point now) { schedule_.Restart(now); }
  // A report that proves nothing said the peer is unreachable: probe it soon.
  void ProbeSoon() { schedule_.ProbeSoon(); }
  // The peer is proven gone by a verified unreachable report about it.
  void Unreachable() { schedule_.Unreachable(); }

  // Judges the peer at `now` (`pending`: something is outstanding with it).
  Verdict Check(Clock::time_point now, bool pending) { return schedule_.Check(now, pending); }
  Clock::time_point NextProbe() const { return schedule_.NextProbe(); }

  // The id of the next liveness PING to send (1, 2, ...).
  uint64_t NextPingId() { return ++pings_; }
  uint64_t pings() const { return pings_; }
  // Whether `id` names one of the last kPingsInFlight PINGs sent.
  bool PingInFlight(uint64_t id) const { return InFlight(id, pings_); }
  // The same for a counter of other probes (the closing handshake's, PeerCloseState).
  static bool InFlight(uint64_t id, uint64_t last) {
    return id <= last && last - id < kPingsInFlight;
  }

  // The peer's ABORT arrived: its context failed. `blamed` is the rank its ABORT names (or
  // -1), `self` this rank. The peer is gone; the reason names the rank to blame: the
  // blamed one when it is a third rank, else the peer.
  void Aborted(int self, int blamed);
  // The peer that `other` describes went down blaming this peer (other.blame() ==
  // rank()): unless this one has a reason already, it takes other's and is proven gone.
  void GoneWith(const PeerLivenessState& other);
  // This peer was proven unreachable while `earlier`, gone on its own before, is the
  // likely cause (a survivor that failed on it exited too): the reason names `earlier`,
  // unless this peer has one already. `cause`: what the backend's report means. The
  // caller marks the peer Unreachable itself.
  void ExplainedBy(const PeerLivenessState& earlier, absl::string_view cause);
  // Proven gone with no other rank to blame (an unreachable report about it alone).
  bool GoneOnItsOwn() const { return unreachable() && blame_ < 0; }

  // Why the peer is gone, once Check said kDead (`cause`: what the backend's unreachable
  // report means), and the rank a failure of the context blames.
  std::string DeathReason(absl::string_view cause) const;
  int BlamedRank() const { return blame_ >= 0 ? blame_ : rank_; }

  bool unreachable() const { return schedule_.unreachable(); }
  bool heard() const { return schedule_.heard(); }
  Clock::time_point last_heard() const { return schedule_.last_heard(); }
  std::chrono::milliseconds dead_after() const { return schedule_.dead_after(); }
  const std::string& reason() const { return reason_; }
  int blame() const { return blame_; }

 private:
  int rank_;
  PeerLiveness schedule_;
  uint64_t pings_ = 0;
  // Set by the peer's ABORT (or another's naming it): why it is gone, and the rank the
  // failure blames; cleared when the peer speaks again.
  std::string reason_;
  int blame_ = -1;
};

}  // namespace transport
}  // namespace optireduce
