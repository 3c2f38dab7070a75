// What the ranks of one Gloo context agree on about each allreduce without a message.
//
// Every rank calls the operations of a context in the same order per tag (Gloo's rule:
// operations that may run at once use different tags), so state advanced only by those
// calls is the same on every rank. The ledger of a context keeps that state:
//   - per tag, how many operations ran with it: the operation's sequence number. With the
//     tag it seeds the Hadamard signs and names the bounded operation, so consecutive
//     operations get different signs whether a caller reuses one tag (the C++ API's
//     default 0) or gives every call a new one (PyTorch's ProcessGroupGloo). The counters
//     live in a fixed table of kTagSlots entries indexed by tag: a tag that meets another
//     tag's entry replaces it and starts again at 0 — on every rank alike, since a tag's
//     operations are ordered — so memory stays flat however many tags a job uses.
//   - per operation size, how many operations of that size the context started: the first
//     `calibration_ops` of each size calibrate (exact TAR), the later ones run bounded. A
//     second context of the same process (another process group), or a rank restarted into
//     a new job, starts from its own counts, as its peers do. At most kMaxSizes sizes are
//     counted; operations of further sizes calibrate (run exact) always.
//   - per operation size, the bound of its bounded operations, agreed at calibration: every
//     calibrating operation's agreement exchange (allreduce.cc) carries each rank's proposed
//     bound (its TimeoutPolicy's bound from its own history, 0 while it has none) and hard
//     cap, so every rank that completes the exchange holds the same proposals. An exchange
//     settles to min(largest proposal, smallest cap), or to the smallest cap when a rank had
//     no history yet; of all settled exchanges of a size, the one with the largest
//     (calibration index, value) decides, where an exchange's index is the largest index
//     any rank gave it. An exchange completes on every rank or on none (a rank that leaves
//     it joins peers that never entered it), so every rank picks the same one whatever order
//     its threads settled them in. A bounded operation reads the bound only when no
//     calibrating operation of its size is still running on its rank (AgreedBound): a
//     calibration still under way on one rank may have settled on another.
// Ranks agree on the mode of an operation as long as they start the operations of one size
// in the same order. Two operations of one size started at once from two threads
// (ProcessGroupGloo's workers) while that size's calibration ends can be counted in
// opposite orders on two ranks; the rank that calibrates then finds its peer's bounded
// data for the operation and joins it (allreduce.cc, OpStats::joined_bounded).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "algorithms/bounded_agreement.h"

namespace gloo {
class Context;
}

namespace optireduce {

class OperationLedger {
 public:
  struct Operation {
    uint64_t sequence = 0;  // operations with this tag on this context before this one
    uint64_t key = 0;       // (tag, sequence) in one word: seeds signs, names bounded ops
    bool calibrate = false;
    // Calibrating operations of a counted size: the how-manieth of its size on this rank
    // (0-based); -1 otherwise. Each such operation must be settled exactly once (Settle).
    int64_t calibration_index = -1;
  };

  // What one completed agreement exchange of a calibrating operation settled to (the same
  // on every rank that completed it; see the top of this file).
  struct Agreement {
    uint64_t index = 0;  // the largest calibration index any rank gave the operation
    std::chrono::microseconds bound{0};
    bool capped = false;  // the smallest cap decided it
  };

  static constexpr size_t kTagSlots = 1024;
  static constexpr size_t kMaxSizes = 256;

  OperationLedger();

  // The ledger of `context`, created at its first operation and dropped with the context
  // (a context created later at the same address starts a new one).
  static std::shared_ptr<OperationLedger> Of(const std::shared_ptr<gloo::Context>& context);
  // Ledgers alive (tests: none may accumulate).
  static size_t Live();

  // Advances the ledger for one operation of `bytes` with `tag`; `calibration_ops` <= 0:
  // an operation that never calibrates (reliable TAR), sizes are not counted.
  Operation Next(uint32_t tag, size_t bytes, int calibration_ops);

  // Ends a calibrating operation of `bytes` (`op.calibration_index` >= 0; others are
  // ignored): `agreement` when its exchange completed, nullopt when it did not (it joined
  // bounded peers, or failed).
  void Settle(size_t bytes, const Operation& op, const std::optional<Agreement>& agreement);

  // The agreed bound of bounded operations of `bytes`, once no calibrating operation of
  // that size is unsettled on this rank (waits for them until `until`; false in `*settled`
  // when they were still running then). nullopt: no exchange of that size completed (the
  // context never calibrated it): there is no shared state, each rank uses its own bound.
  std::optional<Agreement> AgreedBound(
      size_t bytes, std::chrono::steady_clock::time_point until, bool* settled);

  // The key of the `sequence`-th operation with `tag`.
  static uint64_t Key(uint32_t tag, uint64_t sequence);

  // OptiReduce mode's carried contributions and last decision on this context
  // (bounded_agreement.h).
  BoundedContextState& bounded_state() { return bounded_state_; }

 private:
  struct TagSlot {
    uint32_t tag = 0;
    bool used = false;
    uint64_t next = 0;
  };
  struct SizeState {
    int started = 0;  // capped at calibration_ops
    int unsettled = 0;  // calibrating operations not yet settled
    std::optional<Agreement> agreed;
  };
  std::mutex mu_;
  std::condition_variable settled_;
  std::vector<TagSlot> tags_;
  absl::flat_hash_map<size_t, SizeState> by_size_;
  BoundedContextState bounded_state_;
};

}  // namespace optireduce
