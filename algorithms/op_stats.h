// Statistics of OptiReduce-mode operations: one record per allreduce, cumulative counters,
// and an optional JSON-lines log (OPTIREDUCE_STATS_FILE) a training loop or plot can read.
#pragma once

#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "algorithms/bounded_channel.h"
#include "common/counter_list.h"

namespace optireduce {

// How an operation ran.
enum class OpMode {
  kNone,         // no operation recorded (a default OpStats)
  kCalibration,  // ran reliably to calibrate the bound
  kBounded,      // OptiReduce mode
  kReliable,     // bounded mode not available on this transport or not for this type/op
};
// The name statistics print ("calibration", "bounded", "reliable"; "" for kNone): the
// "mode" of OpStats::ToJson and of the JSON-lines log.
const char* OpModeName(OpMode mode);
// Prints OpModeName (test failure messages).
std::ostream& operator<<(std::ostream& os, OpMode mode);

struct PhaseStats {
  uint64_t bytes_expected = 0;
  uint64_t bytes_received = 0;  // when the phase ended, before repairs
  // Of the bytes missing then, those below the furthest byte that arrived from the same
  // peer: lost on the way (what the incast control reacts to).
  uint64_t bytes_in_holes = 0;
  PhaseEnd end = PhaseEnd::kComplete;
  bool repaired = false;  // a repair round ran in this phase
  double ms = 0;
  std::vector<int> late_peers;  // peers whose data was incomplete when the phase ended
  // Peers that marked what they sent as an estimate (phase 2: owners whose phase-1 shard
  // stayed incomplete beyond the loss limit, so every rank's result carries their damage).
  std::vector<int> estimated_peers;
};

struct OpStats {
  uint64_t op = 0;
  uint32_t tag = 0;
  uint64_t bytes = 0;
  int rank = 0;
  int size = 0;
  // The group size of the two-level TAR this operation ran, exact or in OptiReduce mode
  // (0: flat TAR or recursive doubling).
  int group_size = 0;
  OpMode mode = OpMode::kNone;
  double bound_ms = 0;
  bool bound_capped = false;
  // The Hadamard signs' seed (0: no transform): the same on every rank, new every operation.
  uint64_t hadamard_seed = 0;
  // This rank was to calibrate the operation but found a peer running it bounded (ranks
  // that counted two concurrent operations of one size in opposite orders): it joined
  // them instead of waiting for a reliable exchange that never comes.
  bool joined_bounded = false;
  PhaseStats phase[2];
  // How late (from this rank's start) the latest peer's first phase-1 packet came, or when
  // a peer that had not started was given up (`start_lag_gave_up`); -1: not measured. The
  // start grace in effect: how long a peer that had not started was waited for.
  double start_lag_ms = -1;
  bool start_lag_gave_up = false;
  double start_grace_ms = 0;
  // The rank whose decision the operation followed — its leader, or the leader's deputy
  // when the leader had not begun it by the deputy's start grace (`deputy_decided`) — and
  // the ranks that decision left out (bounded_agreement.h): their contributions, and the
  // shards they own, are deferred to the next operation on the same buffer. The same on
  // every rank.
  int leader = -1;
  bool deputy_decided = false;
  std::vector<int> deferred_ranks;
  // On the leader: ranks it waited for however late because they were left out of more
  // than half of the recent operations (slow every time, not now and then; see
  // BoundedContextState::MustWait). Empty on the other ranks.
  std::vector<int> slow_ranks;
  // Share of the (element, contribution) pairs of the exact sum that this result does not
  // hold yet (deferred, carried into the next operation on the buffer); the same on every
  // rank. loss_pct is the same number (the name older consumers read).
  double deferred_pct = 0;
  double loss_pct = 0;
  // The result is not the exact sum of this operation's inputs (a part is deferred); the
  // same on every rank.
  bool damaged = false;
  // This operation's result includes a part deferred by the last operation on the same
  // buffer; the same on every rank.
  bool carried_in = false;
  // Carried contributions of other buffers dropped to keep the carry within its memory
  // budget when this operation's own was stored (BoundedContextState::kCarryBudgetBytes).
  uint64_t carry_dropped = 0;
  double duration_ms = 0;
  std::string ToJson() const;
  // Lateness the sending pace may cause (incast control's other input besides loss):
  // phase 1's transfer — from the latest peer's first packet to the phase's end, so that
  // ranks starting apart do not count — took more than 3/4 of its half of the bound, and
  // no peer was late. (Phase 2 waits for the owners' own phase 1: skew, not the network.)
  bool RanLate() const {
    const PhaseStats& p = phase[0];
    if (start_lag_ms < 0 || start_lag_gave_up || !p.late_peers.empty()) return false;
    return p.ms - start_lag_ms > 0.75 * bound_ms / 2;
  }
};

// CumulativeStats' counters, by name (see common/counter_list.h): ToJson exports
// them under these names.
#define OPTIREDUCE_CUMULATIVE_STATS(X)                                         \
  X(ops) X(calibration_ops) X(bounded_ops) X(reliable_ops)                     \
  X(complete_phases) X(early_timeout_phases) X(deadline_phases)                \
  X(peer_timeout_phases) X(repaired_ops) X(damaged_ops)                        \
  X(stragglers_given_up) /* ops that stopped waiting for a peer to start */    \
  X(carried_in_ops) X(carry_dropped) /* carries dropped over the memory budget */ \
  X(bytes_expected) X(bytes_received)

struct CumulativeStats {
  OPTIREDUCE_CUMULATIVE_STATS(OPTIREDUCE_COUNTER_FIELD)
  std::string ToJson() const;
};

// Process-wide registry. Thread-safe.
class StatsRegistry {
 public:
  static StatsRegistry& Get();
  void Record(const OpStats& stats);
  OpStats Last() const;
  CumulativeStats Cumulative() const;
  void Reset();
  // Appends every record as a JSON line to `path` ("" = no log).
  void SetLogPath(const std::string& path);

 private:
  StatsRegistry();
  mutable std::mutex mu_;
  OpStats last_;
  CumulativeStats total_;
  std::string path_;  // JSON-lines log, empty: none
};

}  // namespace optireduce
