#include "algorithms/bounded_transpose.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/context.h>

#include "absl/strings/str_cat.h"
#include "algorithms/transpose_plan.h"
#include "algorithms/internal/splitmix64.h"
#include "algorithms/internal/thread_scratch.h"

namespace optireduce {
namespace {

using Clock = BoundedClock;
using std::chrono::microseconds;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double LossFraction(const PhaseStats& p) {
  return p.bytes_expected == 0
             ? 0.0
             : 1.0 - static_cast<double>(p.bytes_received) / p.bytes_expected;
}

uint64_t ArrivedBytes(const BoundedReceive& rx, size_t regions) {
  uint64_t total = 0;
  for (size_t i = 0; i < regions; i++) {
    for (const ByteRange& r : rx.Arrived(i)) total += r.size();
  }
  return total;
}

// Waits for a phase, repairs it if the loss is above the limit, and records the outcome.
// Repairs of both phases share one budget: the operation ends by `repair_end` at the latest.
// `start_by`: until when a peer that answers a repair with "not started" is waited for to
// start; nullopt: only for the quiet period.
void FinishPhase(BoundedReceive& rx, const std::vector<BoundedRegion>& regions,
                 Clock::time_point deadline, Clock::time_point repair_end,
                 std::optional<Clock::time_point> start_by, const BoundedTransposeArgs& a,
                 const char* what, PhaseStats* p) {
  const auto start = Clock::now();
  p->bytes_expected = 0;
  for (const BoundedRegion& r : regions) p->bytes_expected += r.nbytes;
  p->end = rx.Wait(deadline, a.bound.quiet, a.bound.peer_factor);
  p->bytes_received = ArrivedBytes(rx, regions.size());
  if (p->end != PhaseEnd::kPeerFailed && LossFraction(*p) > a.max_loss &&
      a.bound.repair_budget.count() > 0) {
    p->repaired = true;
    const auto now = Clock::now();
    const microseconds grace =
        start_by ? std::max(a.bound.quiet,
                            std::chrono::duration_cast<microseconds>(*start_by - now))
                 : a.bound.quiet;
    if (rx.Repair(std::min(now + a.bound.repair_budget, repair_end), grace) ==
        PhaseEnd::kPeerFailed) {
      p->end = PhaseEnd::kPeerFailed;
    }
    p->bytes_received = ArrivedBytes(rx, regions.size());
  }
  const absl::Status sizes = rx.SizeAgreement();
  GLOO_ENFORCE(sizes.ok(), "optireduce::allreduce (tag ", a.tag, ", rank ", a.context->rank,
               ", ", a.elements, " elements): ", sizes.message());
  for (size_t i = 0; i < regions.size(); i++) {
    uint64_t got = 0;
    for (const ByteRange& r : rx.Arrived(i)) got += r.size();
    // Loss and lateness are absorbed, a peer that is gone is not: its data never comes,
    // and every later operation would silently run without it.
    const absl::Status peer = rx.PeerStatus(i);
    if (got < regions[i].nbytes && !peer.ok()) {
      throw gloo::IoException(absl::StrCat("optireduce::allreduce (tag ", a.tag, ") failed ",
                                           what, " rank ", regions[i].peer, ": ",
                                           peer.ToString()));
    }
    if (got < regions[i].nbytes) p->late_peers.push_back(regions[i].peer);
    if (rx.Estimated(i)) p->estimated_peers.push_back(regions[i].peer);
  }
  p->ms = MsSince(start);
}

// Records how late the latest peer started (its first phase-1 packet here; TimeoutPolicy
// learns the start grace from it), or that a peer had not started when phase 1 ended. That
// peer sends its reduced shard only after its own phase 1; with `skip_in_phase2` phase 2
// does not wait for it (with the learned grace, waiting until the peer timeout cost ~40 ms
// per straggler at 16 MiB, as much as the grace had saved). With the budget grace phase 2
// still waits: the shard often comes meanwhile, and filling the whole of it from this rank's
// own contribution made DDP replicas drift (tta.py --quick: min replica accuracy 77.5% in
// 4 of 12 runs, never below 86.4% while waiting).
void NoteLateStarters(const BoundedReceive& rx1, const std::vector<BoundedRegion>& regions1,
                      Clock::time_point start, bool skip_in_phase2, BoundedReceive* rx2,
                      OpStats* stats) {
  if (regions1.empty()) return;
  Clock::time_point latest = start;
  bool gave_up = false;
  for (size_t i = 0; i < regions1.size(); i++) {
    const std::optional<Clock::time_point> first = rx1.FirstArrival(i);
    if (first) {
      latest = std::max(latest, *first);
    } else {
      gave_up = true;
      if (skip_in_phase2) rx2->GiveUp(regions1[i].peer);
    }
  }
  stats->start_lag_gave_up = gave_up;
  stats->start_lag_ms =
      gave_up ? MsSince(start) : std::chrono::duration<double, std::milli>(latest - start).count();
}

// The elements [begin, end) of a region of `count` elements that an arrived byte range
// covers whole: a range that splits an element leaves that element missing.
template <typename T>
std::pair<size_t, size_t> WholeElements(const ByteRange& r, size_t count) {
  return {(r.begin + sizeof(T) - 1) / sizeof(T), std::min(count, r.end / sizeof(T))};
}

// Sums the arrived ranges of every peer into `mine` and compensates what is missing. Only
// the missing ranges are visited twice: without loss this is a plain vectorised sum.
template <typename T>
void ReduceArrived(T* mine, size_t count, const std::vector<T*>& peer_data,
                   const BoundedReceive& rx, int ranks, Compensation compensation) {
  // (element, +1) where a peer's missing range starts, (element, -1) where it ends.
  std::vector<std::pair<size_t, int>> events;
  for (size_t p = 0; p < peer_data.size(); p++) {
    const T* src = peer_data[p];
    size_t next = 0;  // first element not yet known to have arrived from this peer
    for (const ByteRange& r : rx.Arrived(p)) {
      const auto [begin, end] = WholeElements<T>(r, count);
      if (end <= begin) continue;  // less than one whole element
      if (begin > next) {
        events.emplace_back(next, +1);
        events.emplace_back(begin, -1);
      }
      for (size_t i = begin; i < end; i++) mine[i] += src[i];
      next = end;
    }
    if (next < count) {
      events.emplace_back(next, +1);
      events.emplace_back(count, -1);
    }
  }
  if (compensation != Compensation::kDebias || events.empty()) return;
  // Every element has the owner's own value; where `missing` peers lack it, the sum of the
  // others is scaled by N / (N - missing).
  std::sort(events.begin(), events.end());
  int missing = 0;
  size_t at = 0;
  for (const auto& [pos, delta] : events) {
    if (missing > 0 && pos > at) {
      const T scale = static_cast<T>(ranks) / static_cast<T>(ranks - missing);
      for (size_t i = at; i < pos; i++) mine[i] *= scale;
    }
    missing += delta;
    at = pos;
  }
}

// Where the other owners' reduced shards go, in global elements, sorted: a copy of what
// arrived in phase 2 (src), or, for a range that never arrived, the rank's own contribution
// still in the buffer, scaled by N — the unbiased estimate of the sum from one of N similar
// contributions (src null). Mine is not listed.
template <typename T>
struct Placement {
  size_t begin, end;
  const T* src;
};

template <typename T>
std::vector<Placement<T>> Placements(const TransposePlan& plan, const BoundedReceive& rx,
                                     const std::vector<BoundedRegion>& regions) {
  std::vector<Placement<T>> parts;
  for (size_t i = 0; i < regions.size(); i++) {
    const int owner = regions[i].peer;
    const size_t base = plan.ShardBegin(owner);
    const size_t count = plan.ShardCount(owner);
    const T* arrived = static_cast<const T*>(regions[i].dst);
    size_t next = 0;  // first element not yet known to have arrived
    for (const ByteRange& r : rx.Arrived(i)) {
      const auto [begin, end] = WholeElements<T>(r, count);
      if (begin > next) parts.push_back({base + next, base + begin, nullptr});
      if (end > begin) parts.push_back({base + begin, base + end, arrived + begin});
      next = std::max(next, end);
    }
    if (next < count) parts.push_back({base + next, base + count, nullptr});
  }
  std::sort(parts.begin(), parts.end(),
            [](const Placement<T>& x, const Placement<T>& y) { return x.begin < y.begin; });
  return parts;
}

// Writes elements [x0, x1) of `part` (within it) into place.
template <typename T>
void Place(T* data, const Placement<T>& part, size_t x0, size_t x1, T n) {
  if (part.src != nullptr) {
    std::memcpy(data + x0, part.src + (x0 - part.begin), (x1 - x0) * sizeof(T));
  } else {
    for (size_t e = x0; e < x1; e++) data[e] *= n;
  }
}

// Moves the reduced shards that arrived in phase 2 from scratch into place (Placements).
template <typename T>
void PlaceReducedShards(T* data, const TransposePlan& plan, const BoundedReceive& rx,
                        const std::vector<BoundedRegion>& regions) {
  const T n = static_cast<T>(plan.ranks());
  for (const Placement<T>& part : Placements<T>(plan, rx, regions)) {
    Place(data, part, part.begin, part.end, n);
  }
}

// PlaceReducedShards fused with the inverse Hadamard transform of the whole buffer: the
// placement is cut at the transform's blocks and each block is transformed right after its
// elements are written, while it is still in cache.
template <typename T>
void PlaceReducedShardsAndInverse(T* data, size_t elements, const TransposePlan& plan,
                                  const BoundedReceive& rx,
                                  const std::vector<BoundedRegion>& regions, uint64_t seed,
                                  const hadamard::Options& options) {
  const T n = static_cast<T>(plan.ranks());
  const std::vector<Placement<T>> parts = Placements<T>(plan, rx, regions);
  size_t first = 0;  // first part that may overlap the current block
  for (const hadamard::Block& block : hadamard::Blocks(elements, options)) {
    const size_t b0 = block.offset;
    const size_t b1 = b0 + (size_t{1} << block.log2_size);
    while (first < parts.size() && parts[first].end <= b0) first++;
    for (size_t q = first; q < parts.size() && parts[q].begin < b1; q++) {
      Place(data, parts[q], std::max(parts[q].begin, b0), std::min(parts[q].end, b1), n);
    }
    hadamard::InverseBlock(data, block, seed, options);
  }
}

// Scratch of one thread's operations: the peers' phase-1 contributions to this rank's
// shard and the other owners' phase-2 shards (internal::ThreadScratch: touched when it
// grows, since the first bounded operation of a size otherwise missed its deadlines on
// every rank to page faults). Hence also PrepareBoundedTranspose, which the calibration
// operations call.
template <typename T>
struct Scratch {
  T* peers = nullptr;   // (N - 1) x my shard
  T* shards = nullptr;  // every shard but mine

  static Scratch Get(const TransposePlan& plan, int rank) {
    const size_t mine = plan.ShardCount(rank);
    const size_t peers = mine * (plan.ranks() - 1);
    const size_t others = plan.elements() - mine;
    return {reinterpret_cast<T*>(internal::ThreadScratch(internal::ScratchSlot::kBoundedPeers,
                                                         peers * sizeof(T))),
            reinterpret_cast<T*>(internal::ThreadScratch(internal::ScratchSlot::kBoundedShards,
                                                         others * sizeof(T)))};
  }
};

// Releases both phases' sources when the operation ends by an exception (a send that
// failed, a peer that is gone): after allreduce returns, the caller's buffer is never read
// again, so no later repair may be served from it.
class SourcesGuard {
 public:
  SourcesGuard(BoundedChannel* channel, uint64_t op1, uint64_t op2)
      : channel_(channel), op1_(op1), op2_(op2) {}
  SourcesGuard(const SourcesGuard&) = delete;
  SourcesGuard& operator=(const SourcesGuard&) = delete;
  ~SourcesGuard() {
    if (!armed_) return;
    channel_->Release(op1_);
    channel_->Release(op2_);
  }
  void Disarm() { armed_ = false; }

 private:
  BoundedChannel* channel_;
  uint64_t op1_, op2_;
  bool armed_ = true;
};

template <typename T>
void Run(const BoundedTransposeArgs& args, OpStats* stats) {
  BoundedTransposeArgs a = args;  // a.bound may be settled below
  gloo::Context& ctx = *a.context;
  const int rank = ctx.rank;
  const int n = ctx.size;
  const TransposePlan plan(a.elements, n);
  T* data = reinterpret_cast<T*>(a.data);
  const uint64_t op1 = a.op;
  const uint64_t op2 = SiblingPhaseOp(op1);
  const auto start = Clock::now();

  // Phase 1: receive my shard from every peer into scratch, send every owner its shard.
  const size_t my_count = plan.ShardCount(rank);
  T* mine = data + plan.ShardBegin(rank);
  const Scratch<T> scratch_memory = Scratch<T>::Get(plan, rank);
  T* scratch = scratch_memory.peers;
  std::vector<BoundedRegion> regions1;
  std::vector<T*> peer_data;
  if (my_count > 0) {
    for (int step = 1; step < n; step++) {
      T* dst = scratch + (step - 1) * my_count;
      regions1.push_back({plan.RecvPeer(rank, step), dst, my_count * sizeof(T)});
      peer_data.push_back(dst);
    }
  }
  SourcesGuard guard(a.channel, op1, op2);
  a.channel->BeginOperation(op1, a.elements * sizeof(T));
  auto rx1 = a.channel->PostReceive(op1, regions1);
  // Phase 2's receive is posted now, before phase 1 starts: shards of owners that finish
  // phase 1 before this rank are then not staged (copied twice). They land in scratch, not
  // in place: in place they are still the sources of this rank's phase-1 sends (queued
  // behind the staggered order, or asked for by a repair) until Release(op1) below.
  T* shards_memory = scratch_memory.shards;
  std::vector<BoundedRegion> regions2;
  for (int step = 1; step < n; step++) {
    const int owner = plan.RecvPeer(rank, step);
    if (plan.ShardCount(owner) == 0) continue;
    // Shards before mine keep their offset; those after it move down by my_count.
    const size_t at = plan.ShardBegin(owner) - (owner > rank ? my_count : 0);
    regions2.push_back({owner, shards_memory + at, plan.ShardCount(owner) * sizeof(T)});
  }
  auto rx2 = a.channel->PostReceive(op2, regions2);
  for (int step = 1; step < n; step++) {
    const int owner = plan.SendPeer(rank, step);
    if (plan.ShardCount(owner) == 0) continue;
    a.channel->Send(owner, op1, data + plan.ShardBegin(owner),
                    plan.ShardCount(owner) * sizeof(T), /*estimated=*/false);
  }
  if (a.settle_bound) a.bound = a.settle_bound();
  stats->bound_ms = a.bound.bound.count() / 1000.0;
  stats->bound_capped = a.bound.capped;
  const auto half = a.bound.bound / 2;
  const auto repair_end = start + a.bound.bound + a.bound.repair_budget;
  // A peer that has not started this allreduce when phase 1 asks it for a repair may just
  // have been descheduled (ranks call an allreduce some time apart): it is waited for until
  // the start grace, learned from how late peers usually start (TimeoutPolicy) — a fixed
  // quarter of the bound cut the tail under stragglers but cost DDP accuracy on a loaded
  // host (tests/python, digits: -2.6 points); without history, the whole repair budget.
  // An owner that has not started by the time phase 2 asks for its shard is a straggler
  // for certain: it gets only the quiet period.
  // With two ranks the late peer is half the job: its contribution is not estimated from
  // the other half alone; it keeps the whole repair budget (measured: a 2-rank DDP test on
  // a loaded host drifted up to 3 points when it was given up at the learned grace).
  const bool learned_grace = n > 2 && a.bound.start_grace_learned;
  const Clock::time_point start_by =
      learned_grace ? start + a.bound.start_grace : start + half + a.bound.repair_budget;
  stats->start_grace_ms = std::chrono::duration<double, std::milli>(start_by - start).count();
  FinishPhase(*rx1, regions1, start + half, repair_end, start_by, a,
              "receiving phase-1 data from", &stats->phase[0]);
  NoteLateStarters(*rx1, regions1, start, learned_grace, rx2.get(), stats);
  ReduceArrived(mine, my_count, peer_data, *rx1, n, a.compensation);
  rx1.reset();

  // Phase 2: send my reduced shard to everyone, marked as an estimate when its inputs stayed
  // incomplete beyond the limit: the damage is then every rank's, not only this one's.
  const bool estimated = LossFraction(stats->phase[0]) > a.max_loss;
  const auto phase2_start = Clock::now();
  if (my_count > 0) {
    for (int step = 1; step < n; step++) {
      a.channel->Send(plan.SendPeer(rank, step), op2, mine, my_count * sizeof(T), estimated);
    }
  }
  FinishPhase(*rx2, regions2, phase2_start + half, repair_end, std::nullopt, a,
              "receiving phase-2 data from", &stats->phase[1]);
  // Phase-1 sources are released before they are overwritten (what is still queued for
  // them is dropped; an owner still repairing gets no answer and compensates); the
  // reduced shard is copied so that late phase-2 repairs are still served while the
  // caller transforms the buffer back.
  a.channel->FinishSends(op1, Clock::now() + half);
  a.channel->Release(op1);
  if (a.inverse_hadamard) {
    // Mine is transformed back below: the copy that serves late phase-2 repairs (which
    // ask for the transformed values) is taken first.
    a.channel->Detach(op2);
    PlaceReducedShardsAndInverse(data, a.elements, plan, *rx2, regions2, a.hadamard_seed,
                                 a.hadamard);
    rx2.reset();
  } else {
    PlaceReducedShards(data, plan, *rx2, regions2);
    rx2.reset();
    a.channel->Detach(op2);
  }
  // Returns only once this rank's phase-2 data has left it (normally at once: it went
  // out while the peers' came in), as a Gloo collective returns once its sends are with
  // the transport: a rank that exits right after its last allreduce (its part done) must
  // not take its peers' results with it.
  a.channel->FinishSends(op2, Clock::now() + half);
  guard.Disarm();
}

}  // namespace

uint64_t BoundedOpId(uint32_t tag, uint64_t counter, int phase) {
  // Phase ids of one operation are a pair (SiblingPhaseOp); the mix keeps operations of
  // different tags and counters apart.
  const uint64_t first =
      internal::SplitMix64((static_cast<uint64_t>(tag) << 40) ^ counter) & ~uint64_t{1};
  return phase == 1 ? first : SiblingPhaseOp(first);
}

void PrepareBoundedTranspose(DataType type, size_t elements, int rank, int ranks) {
  const TransposePlan plan(elements, ranks);
  if (type == DataType::kFloat64) {
    Scratch<double>::Get(plan, rank);
  } else {
    Scratch<float>::Get(plan, rank);
  }
}

void BoundedTranspose(const BoundedTransposeArgs& a, OpStats* stats) {
  if (a.type == DataType::kFloat64) {
    Run<double>(a, stats);
  } else {
    Run<float>(a, stats);
  }
  const uint64_t expected = stats->phase[0].bytes_expected + stats->phase[1].bytes_expected;
  const uint64_t received = stats->phase[0].bytes_received + stats->phase[1].bytes_received;
  stats->loss_pct = expected == 0 ? 0.0 : 100.0 * (1.0 - static_cast<double>(received) / expected);
  stats->damaged = stats->loss_pct > 100.0 * a.max_loss ||
                   LossFraction(stats->phase[0]) > a.max_loss ||
                   !stats->phase[1].estimated_peers.empty();
  a.channel->OnOperationDone(stats->loss_pct / 100.0, stats->RanLate());
}

}  // namespace optireduce
