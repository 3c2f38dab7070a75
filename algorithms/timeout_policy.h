// Per-bucket-size time bounds for OptiReduce mode.
//
// The first `calibration_ops` operations of each size run reliably (exact TAR) and their
// durations calibrate the bound: the P95 of that window times a margin (the paper's
// start-up calibration). Later bounded operations keep updating a moving history, so
// BoundFor follows the network. An operation that a deadline cut short only shows that it
// needed at least the bound: it is recorded as the bound and, when it decides the
// percentile, the bound stays (no margin on top), so operations cut by their own bound
// never ratchet it up; repaired operations record their real duration, so a network that
// really got slower raises it. A hard cap (OPTIREDUCE_TIMEOUT_MS) limits every bound. Ranks
// hold different histories (and may be configured with different caps), so OptiReduce mode
// does not run on each rank's own bound: the ranks of a context agree on one per size at
// calibration (Proposal, BoundWith; operation_ledger.h) and keep it; later operations'
// history feeds the start grace. Each phase of TAR gets half of the bound; the early timeout fires once every peer's last
// packets arrived and the input stayed quiet for `early_quiet_fraction` of the bound
// (at most `max_quiet`).
//
// The start grace: how long after an operation's start a peer that has not started it
// yet is still waited for. Ranks call an allreduce some time apart (a rank descheduled on
// a loaded host, a slower data loader): that is normal and waited out. A straggler is a
// peer later than that. Each bounded operation records how late its latest peer started
// (its first packet); the grace is a percentile x margin of that history (censored samples:
// the operation gave the peer up at that time). Until
// `start_history_min` samples exist — and unless `learn_start_grace` — a late peer keeps
// the whole repair budget.
//
// Histories are kept for at most kMaxSizes sizes (as many as an OperationLedger counts per
// context): recording a size beyond them forgets the size used longest ago, so a job with
// dynamic shapes keeps bounded memory while the sizes it reuses keep their history.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

#include "absl/container/flat_hash_map.h"

namespace optireduce {

struct TimeoutOptions {
  int calibration_ops = 20;
  double percentile = 0.95;
  double margin = 1.25;
  size_t history = 64;
  double early_quiet_fraction = 0.1;
  // Once every peer's last packets are in, only reordered stragglers of the same burst are
  // still to come: they take microseconds on a LAN, so the quiet period is capped.
  std::chrono::microseconds max_quiet{5000};
  std::chrono::microseconds min_bound{2000};
  std::chrono::microseconds hard_cap{std::chrono::seconds(5)};
  // Adaptive peer timeout: once half of a phase's peers are done, the others get this many
  // times their median transfer time (0: off; phases end at the early timeout or bound).
  double peer_timeout_factor = 2.0;
  // Extra time (as a fraction of the bound) to repair an operation above the loss limit.
  double repair_budget_fraction = 1.0;
  // Start lags recorded before the start grace is learned from them (see above), and the
  // percentile of them that is waited for (x margin). Lower than the bound's: ranks that
  // are descheduled for a moment are frequent and short, a straggler is rare and long, and
  // at the 95th percentile a straggler in one operation of twenty already set the grace
  // (measured: 4 ranks, 16 MiB, a 2 x p50 delay in 5% of the iterations was always waited
  // out at 0.95).
  // Off here (the repair budget, for callers that want no rank left out for lateness);
  // the library turns it on (gloo_ext/config.h, OPTIREDUCE_START_GRACE): a straggler is
  // then left out and its contribution carried.
  bool learn_start_grace = false;
  size_t start_history_min = 16;
  double start_percentile = 0.9;
};

struct TimeBound {
  std::chrono::microseconds bound;  // whole operation (both phases)
  std::chrono::microseconds quiet;  // early-timeout quiet period
  std::chrono::microseconds repair_budget;
  // From the operation's start: until then a peer that has not started is waited for (at
  // most half the bound + the repair budget: the end of phase 1's repairs).
  std::chrono::microseconds start_grace{0};
  bool start_grace_learned = false;  // false: not enough history, the conservative maximum
  double peer_factor = 0;  // adaptive peer timeout (BoundedReceive::Wait); 0: off
  bool capped = false;  // the hard cap decided the bound
};

class TimeoutPolicy {
 public:
  static constexpr size_t kMaxSizes = 256;

  explicit TimeoutPolicy(const TimeoutOptions& options = TimeoutOptions()) : options_(options) {}

  // True while operations of this size still calibrate (run reliably).
  bool Calibrating(size_t bytes) const;
  // `cut_at`: the operation ended at a phase deadline without a complete repair, i.e. it
  // took at least the bound in effect; that bound is recorded (a censored sample).
  void Record(size_t bytes, std::chrono::microseconds duration);
  void RecordCut(size_t bytes, std::chrono::microseconds bound_in_effect);
  // How long after the start of a bounded operation its latest peer's first packet came;
  // `gave_up`: a peer had not started when the operation stopped waiting at `lag`.
  void RecordStartLag(size_t bytes, std::chrono::microseconds lag, bool gave_up);
  TimeBound BoundFor(size_t bytes) const;
  // The bound of an operation whose ranks agreed on `agreed` (operation_ledger.h): the
  // quiet period, repair budget and start grace follow from it as in BoundFor, the start
  // grace from this rank's own history of start lags; `capped` as agreed.
  TimeBound BoundWith(size_t bytes, std::chrono::microseconds agreed, bool capped) const;
  // What this rank proposes as the bound of `bytes` when its ranks agree on one: BoundFor's
  // bound; nullopt while no operation of that size was recorded.
  std::optional<std::chrono::microseconds> Proposal(size_t bytes) const;
  TimeoutOptions options() const;
  // Replaces the options and forgets every history (start-up configuration).
  void Configure(const TimeoutOptions& options);
  // Sizes with a history (at most kMaxSizes).
  size_t Sizes() const;

 private:
  struct History {
    int calibration_seen = 0;
    struct Sample {
      int64_t us;
      bool cut;  // censored: the operation needed at least this long
    };
    std::deque<Sample> samples;
    std::deque<Sample> start_lags;  // `cut`: the peer was given up at that lag
    uint64_t last_used = 0;  // `uses_` when it was last recorded
  };
  void Add(size_t bytes, int64_t us, bool cut);
  // The history of `bytes`, made (forgetting the least recently recorded size when
  // kMaxSizes are held) if it has none. Called with mu_ held.
  History& Recorded(size_t bytes);
  TimeBound Bound(size_t bytes, std::optional<std::chrono::microseconds> agreed,
                  bool agreed_capped) const;

  TimeoutOptions options_;
  mutable std::mutex mu_;
  absl::flat_hash_map<size_t, History> by_size_;
  uint64_t uses_ = 0;
};

}  // namespace optireduce
