// What keeps OptiReduce mode's results bit-identical on every rank, and nothing lost.
//
// One rank per operation, the *leader* (LeaderOf: a function of the operation's key, so
// every rank names the same one without a message), decides once which ranks' phase-1
// contributions count: every rank whose data reached it by the start grace. It sends that
// set (a Decision) to every peer on a slot of the operation; every rank waits for it.
// A leader that has not begun the operation by the start grace of its deputy (DeputyOf)
// hands the decision over: its transport answers the deputy's request at once
// (BoundedChannel::AskToCede), and the deputy decides instead. Then:
//  - every owner sums exactly the counted contributions, repaired until complete, and
//    sends its reduced shard only if it is counted itself;
//  - every rank receives the reduced shard of every counted owner, repaired until
//    complete; the shard of an owner that is not counted is zero on every rank;
//  - each rank keeps what of its own contribution was not applied — all of it when it is
//    not counted, else its values in the shards of owners that are not counted — and adds
//    it to its next contribution to the same buffer (Carry): late, never lost.
// The result is then a function of the decision and of bytes every rank received whole,
// so it is the same on every rank. What was deferred is reported identically everywhere
// (OpStats::deferred_pct).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "algorithms/types.h"

namespace optireduce {

// The leader of the operation with this ledger key among `ranks` ranks.
int LeaderOf(uint64_t op_key, int ranks);
// Its deputy: the rank that decides instead when the leader has not begun the operation
// by the deputy's start grace (BoundedChannel::AskToCede).
inline int DeputyOf(int leader, int ranks) { return (leader + 1) % ranks; }

// The leader's decision for one operation: which ranks' contributions count.
struct Decision {
  uint64_t op = 0;               // the bounded operation id (phase 1)
  std::vector<bool> counted;     // one per rank
  int decider = -1;              // the leader, or its deputy (not on the wire: the sender)
  // Wire form: a header word (magic, version, rank count), the op id, then the set as bits.
  std::vector<uint64_t> Encode() const;
  // Checks magic, version, rank count and op id against what this rank expects.
  static absl::StatusOr<Decision> Decode(const std::vector<uint64_t>& words, int ranks,
                                         uint64_t op);
  static size_t WireWords(int ranks) { return 2 + (static_cast<size_t>(ranks) + 63) / 64; }
};

// What of a rank's contribution to one buffer an operation did not apply: values where
// `ranges` say (element ranges [begin, end), sorted, disjoint); elsewhere the carry is
// zero whatever `values` holds there. A counted rank carries only the shards of owners
// left out (1/N of the buffer each): neither filling nor adding the rest costs anything.
struct Carry {
  std::vector<char> values;  // the buffer's element count, or more (then unused)
  std::vector<std::pair<size_t, size_t>> ranges;
  bool empty() const { return ranges.empty(); }
};

// Per-context state of OptiReduce mode that outlives one operation: the deferred
// contributions (carry) and which ranks the last decision seen here left out.
class BoundedContextState {
 public:
  // A carried contribution belongs to one buffer: the output pointer, its element count
  // and type (PyTorch's DDP reuses each bucket's flat buffer for every step). Distinct
  // buffers never mix.
  struct CarryKey {
    uintptr_t ptr = 0;
    size_t elements = 0;
    DataType type = DataType::kFloat32;
    bool operator==(const CarryKey& o) const {
      return ptr == o.ptr && elements == o.elements && type == o.type;
    }
    template <typename H>
    friend H AbslHashValue(H h, const CarryKey& k) {
      return H::combine(std::move(h), k.ptr, k.elements, static_cast<int>(k.type));
    }
  };

  // Memory for carried contributions; above it the oldest carry is dropped and counted.
  static constexpr size_t kCarryBudgetBytes = size_t{2} << 30;

  // Adds `values` (a carry of `key.elements` float32 or float64 values as `key.type`) to
  // the carry of `key`, taking its memory (no copy). Returns how many carries were dropped
  // to stay within the budget.
  size_t AddCarry(const CarryKey& key, Carry&& values);
  // Adds the carry of `key` into `data` (its ranges only) and forgets it; false when there
  // was none.
  bool TakeCarry(const CarryKey& key, void* data);
  // A carry with no ranges for the next operation: memory of a carry already applied when
  // there is one of at least `bytes` (its pages are touched: a fresh multi-MiB carry costs
  // page faults inside the operation; its old values stay, outside any range), else a new
  // one. At most kSpareCarries are kept.
  static constexpr size_t kSpareCarries = 2;
  // Spares are memory beyond kCarryBudgetBytes (at most kSpareCarries buffers).
  Carry SpareCarry(size_t bytes);
  // Gives back a carry SpareCarry returned that no range was written into.
  void ReturnSpareCarry(Carry&& v);
  size_t carry_bytes() const;

  // Which buffers' next operation returns a deferred part. Every rank marks the buffer
  // when a decision defers something (the decision is the same on every rank, the carry
  // is only on the ranks whose part it is), so the flag `OpStats::carried_in` of the next
  // operation on it is the same on every rank. At most kMaxDeferredMarks buffers are
  // remembered (the oldest mark is forgotten first).
  static constexpr size_t kMaxDeferredMarks = size_t{1} << 16;
  void MarkDeferred(const CarryKey& key);
  // True (and forgets the mark) when the last operation on `key` deferred a part.
  bool TakeDeferredMark(const CarryKey& key);

  // Which ranks a leader waits for however late they are. A rank that has not started by
  // the start grace is left out and catches up on its own: the operations it is left out
  // of cost it no waiting (the counted data is already there when it starts them), so it
  // gains on its peers while they run on. Two limits keep that bounded:
  // - in a row: a rank left out of each of the last `max_in_a_row` decisions is waited
  //   for, so its peers run at most that many operations ahead of it (their repair copies
  //   and its staging area must still hold what it has not received: the caller sizes
  //   the limit by bytes). A decision a rank made as leader does not end its run: a
  //   leader always counts itself, whatever its lag.
  // - in a window: a rank left out of more than kMaxLeftOutInWindow of the last
  //   kWindow decisions is slow every time, not now and then: it is waited for (and
  //   counted) until it is left out less often, rather than silently left out of most
  //   steps; `waited_for_slow` says so in the stats.
  // Several threads run operations of one context at once (PyTorch's two workers);
  // decisions are noted in the order this rank sees them.
  static constexpr size_t kMaxLeftOutInARow = 8;
  static constexpr size_t kWindow = 32;
  static constexpr size_t kMaxLeftOutInWindow = kWindow / 2;
  struct WaitRule {
    std::vector<bool> must_wait;  // per rank
    std::vector<bool> slow;       // per rank: waited for by the window rule
    std::vector<bool> catching_up;  // per rank: left out of the last decision seen
  };
  WaitRule MustWait(int ranks, size_t max_in_a_row) const;
  // The in-a-row limit for operations of `op_bytes` on `ranks` ranks: a left-out rank's
  // peers keep a repair copy of what each operation's phase 2 sent it — a reduced shard,
  // about op_bytes / ranks (the two-level path's too) — within the transport's budget
  // (64 MiB by default); half of it bounds the operations they run ahead (two threads'
  // operations share it), at most kMaxLeftOutInARow, at least 1. The same on every rank.
  static constexpr size_t kCatchUpBytes = size_t{32} << 20;
  static size_t MaxLeftOutInARow(size_t op_bytes, int ranks);
  void NoteDecision(const Decision& d, int leader);

 private:
  mutable std::mutex mu_;
  struct Entry {
    Carry carry;
    std::list<CarryKey>::iterator age;
  };
  absl::flat_hash_map<CarryKey, Entry> carry_;
  std::list<CarryKey> oldest_first_;
  absl::flat_hash_map<CarryKey, uint64_t> deferred_marks_;  // key -> when marked
  std::deque<std::pair<CarryKey, uint64_t>> marks_oldest_first_;  // also marks since taken
  uint64_t marks_made_ = 0;
  size_t carry_bytes_ = 0;
  std::vector<std::vector<char>> spare_carries_;
  void RecycleLocked(std::vector<char>&& v);
  std::deque<std::vector<bool>> recent_left_out_;  // the last kWindow decisions, newest last
  std::vector<size_t> left_out_in_a_row_;          // per rank
};

}  // namespace optireduce
