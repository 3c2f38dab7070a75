// peer_liveness.h — when to probe a peer and when to declare it gone.
//
// A peer is judged only while something is pending with it (an operation, a
// packet in flight, a posted receive that names it): an idle peer may be busy
// computing for hours. While pending, every validated packet from the peer
// counts as a sign of life. Once the peer has been quiet for a probe interval
// the engine sends a PING, which a live peer's progress thread answers whatever
// its application is doing. After the peer's last data or ack — the quiet right
// after an exchange is when a death is news — the first kShortProbes probes are
// a short interval apart (cadence / 1000, at least 1 ms), then the interval
// doubles with each probe up to cadence / 8 (cadence: the silence bound if one
// is set, else kDefaultCadence); answers to probes do not shorten it again, so a
// live but slow peer costs a dozen PINGs and then one per cadence / 8. On the
// UDP backend a PING to a dead process's port comes back as ICMP port
// unreachable quoting it, so a death in the first few milliseconds of quiet is
// found a short interval after its socket closed (the way Gloo's TCP learns it
// from the closed socket at once), a later one within about twice the quiet
// time.
// A peer is declared gone by proof only: a report that its address is
// unreachable that the engine verified (Unreachable: ICMP port unreachable
// quoting a datagram this side sent it and awaits an answer to, a memif link
// that went down). A report that proves nothing (a forgery, a quote too short)
// only brings the next probe forward (ProbeSoon). Silence alone — a stopped
// process, a paused VM, a host stalled for seconds — is not a death: the waits'
// timeouts decide, as on Gloo's TCP transport, unless a silence bound is set
// (dead_after > 0): then silence for that long while pending declares the peer
// gone. Silence counts from the connect at the earliest (every rank also pings
// each peer when it connects, and a peer answers once its side is connected).
#pragma once

#include <algorithm>
#include <chrono>

namespace optireduce {
namespace transport {

class PeerLiveness {
 public:
  using Clock = std::chrono::steady_clock;
  // Probes sent first_probe apart after the peer last spoke, before the interval grows.
  static constexpr int kShortProbes = 8;
  enum class Verdict {
    kIdle,   // nothing pending: not judged
    kAlive,  // heard recently enough
    kProbe,  // send a PING now
    kDead,   // gone: fail what is pending
  };

  // The probe cadence without a silence bound.
  static constexpr std::chrono::milliseconds kDefaultCadence{1000};

  // dead_after: the silence bound (0: none, silence never declares the peer gone).
  explicit PeerLiveness(std::chrono::milliseconds dead_after = std::chrono::milliseconds(0))
      : dead_after_(dead_after),
        probe_every_(ProbeEvery(Cadence(dead_after))),
        first_probe_(FirstProbe(Cadence(dead_after))),
        interval_(first_probe_) {}

  // What the probe intervals derive from: the silence bound, or kDefaultCadence.
  static std::chrono::milliseconds Cadence(std::chrono::milliseconds dead_after) {
    return dead_after.count() > 0 ? dead_after : kDefaultCadence;
  }
  // The longest quiet interval between probes, and the short one right after the
  // peer last spoke, for a given cadence.
  static Clock::duration ProbeEvery(std::chrono::milliseconds cadence) {
    return std::max<Clock::duration>(std::chrono::milliseconds(1), cadence / 8);
  }
  static Clock::duration FirstProbe(std::chrono::milliseconds cadence) {
    return std::min<Clock::duration>(
        ProbeEvery(cadence),
        std::max<Clock::duration>(std::chrono::milliseconds(1), cadence / 1000));
  }

  // The pair to the peer was connected: it counts as heard then (Gloo connects
  // every pair of a group within moments once all addresses are published, so
  // a live peer answers a probe long before dead_after).
  void Connected(Clock::time_point now) {
    heard_ = true;
    last_heard_ = now;
  }
  // A validated packet from the peer arrived; `probe_answer`: it is the answer
  // to a PING (it proves life but does not restart the short probe interval).
  void Heard(Clock::time_point now, bool probe_answer = false) {
    heard_ = true;
    unreachable_ = false;
    last_heard_ = now;
    if (!probe_answer) {
      interval_ = first_probe_;
      short_left_ = kShortProbes;
    }
  }
  // The peer is provably gone (a verified unreachable report, or its ABORT).
  void Unreachable() { unreachable_ = true; }
  // A report that proves nothing (possibly forged) said the peer is unreachable: probe
  // it at the next check if something is pending, at most one short interval after the
  // last probe, so that a real death is proven by the report the probe draws.
  void ProbeSoon() { probe_soon_ = true; }
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
      probe_soon_ = false;
      return Verdict::kIdle;
    }
    if (!pending_) {
      pending_ = true;
      pending_since_ = now;
    }
    if (unreachable_) return Verdict::kDead;
    if (dead_after_.count() > 0 && heard_ &&
        now - std::max(last_heard_, pending_since_) >= dead_after_) {
      return Verdict::kDead;
    }
    if (now < NextProbe()) return Verdict::kAlive;
    const bool early = probe_soon_ && now < RegularProbe();
    probe_soon_ = false;
    probed_ = true;
    last_probe_ = now;
    if (early) return Verdict::kProbe;  // the regular schedule stays as it was
    if (short_left_ > 0) {
      --short_left_;
    } else {
      interval_ = std::min(2 * interval_, probe_every_);
    }
    return Verdict::kProbe;
  }

  // When Check would next answer kProbe if the peer stays quiet and something
  // stays pending (the engine runs its next check no later than that).
  Clock::time_point NextProbe() const {
    const Clock::time_point regular = RegularProbe();
    if (!probe_soon_) return regular;
    return std::min(regular, probed_ ? last_probe_ + first_probe_ : Clock::time_point{});
  }

  // The silence bound (0: none).
  std::chrono::milliseconds dead_after() const { return dead_after_; }

 private:
  // When the next probe is due by the schedule alone.
  Clock::time_point RegularProbe() const {
    Clock::time_point quiet_since{};
    if (heard_) quiet_since = last_heard_;
    if (probed_) quiet_since = std::max(quiet_since, last_probe_);
    if (!heard_ && !probed_) return Clock::time_point{};
    return quiet_since + interval_;
  }

  std::chrono::milliseconds dead_after_;
  Clock::duration probe_every_;
  Clock::duration first_probe_;
  Clock::duration interval_;  // quiet time before the next probe
  int short_left_ = kShortProbes;  // probes still first_probe_ apart
  bool heard_ = false, unreachable_ = false, pending_ = false, probed_ = false;
  bool probe_soon_ = false;
  Clock::time_point last_heard_{}, pending_since_{}, last_probe_{};
};

}  // namespace transport
}  // namespace optireduce
