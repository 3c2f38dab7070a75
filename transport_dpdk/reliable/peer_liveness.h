// peer_liveness.h — when to probe a peer and when to declare it gone.
//
// A peer is judged only while something is pending with it (an operation, a
// packet in flight, a posted receive that names it): an idle peer may be busy
// computing for hours. While pending, every validated packet from the peer
// counts as a sign of life; after a quiet probe interval (dead_after / 8) the
// engine sends a PING, which a live peer's progress thread answers whatever its
// application is doing. Silence for dead_after while pending declares the
// peer gone. Silence counts from the
// connect at the earliest (every rank also pings each peer when it connects,
// and a peer answers once its side is connected); a network report that its address is unreachable
// (ICMP port unreachable: its socket is closed) declares it gone at once.
#pragma once

#include <algorithm>
#include <chrono>

namespace optireduce {
namespace transport {

class PeerLiveness {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Verdict {
    kIdle,   // nothing pending: not judged
    kAlive,  // heard recently enough
    kProbe,  // send a PING now
    kDead,   // gone: fail what is pending
  };

  explicit PeerLiveness(std::chrono::milliseconds dead_after = std::chrono::milliseconds(1000))
      : dead_after_(dead_after),
        probe_every_(std::max<Clock::duration>(std::chrono::milliseconds(1), dead_after / 8)) {}

  // The pair to the peer was connected: it counts as heard then (Gloo connects
  // every pair of a group within moments once all addresses are published, so
  // a live peer answers a probe long before dead_after).
  void Connected(Clock::time_point now) {
    heard_ = true;
    last_heard_ = now;
  }
  // A validated packet from the peer arrived.
  void Heard(Clock::time_point now) {
    heard_ = true;
    unreachable_ = false;
    last_heard_ = now;
  }
  // The network reported the peer's address unreachable.
  void Unreachable() { unreachable_ = true; }
  bool unreachable() const { return unreachable_; }
  bool heard() const { return heard_; }
  Clock::time_point last_heard() const { return last_heard_; }

  // This rank's own progress thread did not run for a while (descheduled): its
  // silence says nothing about the peer, so a pending peer gets a fresh window.
  void Restart(Clock::time_point now) {
    if (pending_) pending_since_ = now;
  }

  // Judges the peer at `now`; `pending`: something is outstanding with it.
  Verdict Check(Clock::time_point now, bool pending) {
    if (!pending) {
      pending_ = false;
      return Verdict::kIdle;
    }
    if (!pending_) {
      pending_ = true;
      pending_since_ = now;
    }
    if (unreachable_) return Verdict::kDead;
    if (heard_ && now - std::max(last_heard_, pending_since_) >= dead_after_) {
      return Verdict::kDead;
    }
    if (probed_ && now - last_probe_ < probe_every_) return Verdict::kAlive;
    if (heard_ && now - last_heard_ < probe_every_) return Verdict::kAlive;
    probed_ = true;
    last_probe_ = now;
    return Verdict::kProbe;
  }

  std::chrono::milliseconds dead_after() const { return dead_after_; }

 private:
  std::chrono::milliseconds dead_after_;
  Clock::duration probe_every_;
  bool heard_ = false, unreachable_ = false, pending_ = false, probed_ = false;
  Clock::time_point last_heard_{}, pending_since_{}, last_probe_{};
};

}  // namespace transport
}  // namespace optireduce
