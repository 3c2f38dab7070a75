// The hand-over of a late leader's decision to its deputy (OptiReduce mode,
// algorithms/README.md, "Who decides when the leader is late"), one rank's side of it.
//
// A leader's transport answers a deputy's request for operation `op` at once, on the
// progress thread: the decision is handed over (ceded) when this rank has not begun `op`,
// and kept when it has. Begin and the answer take one lock, so exactly one of the two
// ranks decides: a leader that begins `op` after ceding it finds it ceded (Ceded) and
// waits for the deputy's decision; a deputy refused waits for the leader's.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "algorithms/bounded_channel.h"

namespace optireduce {
namespace transport {

class DecisionHandover {
 public:
  // Operations remembered as begun and as ceded (each): peers run at most a few
  // operations apart (BoundedContextState::MustWait), far fewer than this.
  static constexpr size_t kRemembered = 4096;
  // Answers that arrived and were not taken yet (a deputy that gave up waiting).
  static constexpr size_t kAnswersKept = 64;

  // This rank begins `op` (either phase id): a later request for it is refused.
  void Begin(uint64_t op);
  // A deputy asks for the decision of `op`: true (ceded) when this rank has not begun it.
  bool OnAsk(uint64_t op);
  // True when this rank ceded `op` before it began it: its deputy decides.
  bool Ceded(uint64_t op) const;

  // The deputy's side: `leader` answered the request for `op`.
  void OnAnswer(int leader, uint64_t op, bool ceded);
  // Waits until `leader`'s answer for `op` arrives (and takes it), or until `deadline`.
  std::optional<bool> WaitAnswer(int leader, uint64_t op, BoundedClock::time_point deadline);

 private:
  // A set that keeps the last kRemembered keys inserted.
  struct RecentSet {
    absl::flat_hash_set<uint64_t> keys;
    std::deque<uint64_t> order;
    void Insert(uint64_t key);
  };
  static uint64_t Key(uint64_t op) { return op & ~uint64_t{1}; }
  mutable std::mutex mu_;
  std::condition_variable answered_;
  RecentSet begun_;
  RecentSet ceded_;
  struct Answer {
    int leader;
    bool ceded;
  };
  absl::flat_hash_map<uint64_t, Answer> answers_;
  std::deque<uint64_t> answers_order_;
};

}  // namespace transport
}  // namespace optireduce
