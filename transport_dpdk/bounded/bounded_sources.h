// The send side's memory for repairs (OptiReduce mode): which sources of which bounded
// operations are still valid, and the copies that outlive the caller's buffers.
//
// BoundedEndpoint registers every bounded send here (Send) and answers a peer's repair
// request from it (TryWith, on the progress thread); Detach copies an operation's sources
// so the caller may reuse its memory, and Release stops serving an operation at all.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "transport_dpdk/bounded/source_access.h"

namespace optireduce {
namespace transport {

// The send side's memory for repairs: which sources of which operations are still valid.
// Sources start as the caller's memory; Detach copies them into owned memory, kept within
// a byte budget (the oldest detached operations are forgotten first).
class BoundedSources {
 public:
  explicit BoundedSources(size_t detached_budget_bytes = 64 << 20)
      : budget_(detached_budget_bytes) {}
  // Detached operations kept at most (within the byte budget, which is what bounds them
  // but for small operations): OptiReduce mode's peers must receive a counted owner's
  // shard whole (algorithms/bounded_agreement.h), so a peer still repairing it must find
  // it here while this rank runs further operations — of other tags, which need nothing
  // from that peer, as fast as they come (two threads of small allreduces on a loaded
  // host ran 32 operations within one descheduling of the peer's repairing thread).
  // Reusing the copies keeps them hot (a fresh multi-MiB copy per operation costs page
  // faults).
  static constexpr size_t kDetachedOps = 1024;
  static constexpr size_t kMaxSpares = 8;
  // `estimated`: the bytes are an estimate (see BoundedChannel::Send); readers learn it.
  void Register(uint64_t op, int peer, const void* src, size_t nbytes, bool estimated);
  void Detach(uint64_t op);
  // Keeps enough touched spare copies of `bytes` for the detached operations the budget
  // allows (plus the one being detached), so that steady-state Detach never page-faults.
  void Reserve(size_t bytes);
  // Spare copies held now (for tests).
  size_t spares() const;
  void Release(uint64_t op);
  // kGone: released or forgotten (the data is never coming); kNotStarted: this rank has
  // registered neither this operation nor its pair (it has not called it yet); kPending:
  // not registered, but its pair is — operation ids come in pairs, the two phases of one
  // TAR (`op` even, `op + 1`; BoundedOpId), and this rank is still in the other phase — or
  // registered for other peers but not yet for this one (still in its send loop).
  using Access = SourceAccess;
  using ReadFn = std::function<void(const char* src, size_t nbytes, bool estimated)>;
  // Calls fn while the source is guaranteed valid (kDone); else why it cannot. Waits for
  // the lock (never kBusy).
  Access With(uint64_t op, int peer, const ReadFn& fn) const;
  // Like With, but never waits: kBusy when another thread holds or waits for the sources
  // (the progress thread then tries again next iteration instead of starving a Detach).
  Access TryWith(uint64_t op, int peer, const ReadFn& fn) const;

 private:
  struct Source {
    const char* src;
    size_t nbytes;
    bool estimated;
    std::shared_ptr<std::vector<char>> owned;  // set once detached
  };
  const size_t budget_;
  mutable std::mutex mu_;
  // Threads blocked in LockForUpdate (Register, Detach, Release, Reserve): TryWith backs
  // off while there are any.
  mutable std::atomic<int> updaters_{0};
  std::unique_lock<std::mutex> LockForUpdate() const;
  absl::flat_hash_map<uint64_t, std::vector<std::pair<int, Source>>> sources_;
  std::deque<uint64_t> detached_order_;
  size_t detached_bytes_ = 0;
  // Copies of forgotten operations, reused so that steady-state Detach neither allocates
  // nor page-faults (a fresh multi-MiB copy per allreduce costs more than the copy).
  std::vector<std::shared_ptr<std::vector<char>>> spare_;
  // Operations released or forgotten lately, to tell "gone" from "not started".
  absl::flat_hash_set<uint64_t> forgotten_;
  std::deque<uint64_t> forgotten_order_;
  void ForgetLocked(uint64_t op);
  Access MissingLocked(uint64_t op) const;
  // The lookup With and TryWith share, under mu_.
  Access ReadLocked(uint64_t op, int peer, const ReadFn& fn) const;
};

}  // namespace transport
}  // namespace optireduce
