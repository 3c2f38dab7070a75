#include "algorithms/bounded_transpose.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
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

// What arrived of the regions (of counted peers only, when `counted` is not empty) into
// `phase`: the bytes, and the holes — bytes missing below the furthest byte that arrived
// from the same peer. Holes are what the network lost on the way; a peer that has not
// started, or is still sending, leaves none.
void NoteArrivals(const BoundedReceive& rx, const std::vector<BoundedRegion>& regions,
                  const std::vector<bool>& counted, PhaseStats* phase) {
  phase->bytes_received = 0;
  phase->bytes_in_holes = 0;
  for (size_t i = 0; i < regions.size(); i++) {
    if (!counted.empty() && !counted[regions[i].peer]) continue;
    uint64_t arrived = 0;
    size_t furthest = 0;
    for (const ByteRange& r : rx.Arrived(i)) {
      arrived += r.size();
      furthest = std::max(furthest, r.end);
    }
    phase->bytes_received += arrived;
    phase->bytes_in_holes += furthest - arrived;
  }
}

// Records how late the latest peer started (its first phase-1 packet here; TimeoutPolicy
// learns the start grace from it), or that a peer had not started when phase 1 ended.
void NoteLateStarters(const BoundedReceive& rx1, const std::vector<BoundedRegion>& regions1,
                      Clock::time_point start, const BoundedTransposeArgs& a, OpStats* stats) {
  if (regions1.empty()) return;
  Clock::time_point latest = start;
  bool gave_up = false;
  for (size_t i = 0; i < regions1.size(); i++) {
    const int member = a.team.MemberOf(regions1[i].peer);
    if (!a.catching_up.empty() && a.catching_up[member]) continue;
    const std::optional<Clock::time_point> first = rx1.FirstArrival(i);
    if (first) {
      latest = std::max(latest, *first);
    } else {
      gave_up = true;
    }
  }
  stats->start_lag_gave_up = gave_up;
  stats->start_lag_ms =
      gave_up ? MsSince(start) : std::chrono::duration<double, std::milli>(latest - start).count();
}

// Waits for the decision until the operation's timeout; *from names who sent it.
void WaitDecision(gloo::transport::UnboundBuffer& buf, const BoundedTransposeArgs& a,
                  Clock::time_point until, int* from) {
  const std::string who =
      absl::StrCat("rank ", a.team.Rank(a.leader), " (this operation's leader) or rank ",
                   a.team.Rank(DeputyOf(a.leader, a.team.size)), " (its deputy)");
  bool ok = false;
  const auto left = std::max(std::chrono::milliseconds(1),
                             std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()));
  try {
    ok = buf.waitRecv(from, left);
  } catch (const gloo::IoException& e) {
    throw gloo::IoException(absl::StrCat("optireduce::allreduce (tag ", a.tag,
                                         ") failed waiting for the decision of ", who, ": ",
                                         e.what()));
  }
  if (!ok) {
    GLOO_THROW_IO_EXCEPTION("optireduce::allreduce (tag ", a.tag,
                            ") aborted while waiting for the decision of ", who);
  }
}

// The decision received from context rank `from`; raises when it does not decode.
Decision ReadDecision(const std::vector<uint64_t>& words, int n, uint64_t op, int from,
                      const BoundedTransposeArgs& a) {
  absl::StatusOr<Decision> got = Decision::Decode(words, n, op);
  if (!got.ok()) {
    throw gloo::IoException(absl::StrCat("optireduce::allreduce (tag ", a.tag, ") from rank ",
                                         from, ": ", got.status().message()));
  }
  Decision d = *std::move(got);
  d.decider = a.team.MemberOf(from);
  return d;
}

void WaitDecisionSent(gloo::transport::UnboundBuffer& buf, const BoundedTransposeArgs& a,
                      Clock::time_point until) {
  int to = -1;
  bool ok = false;
  const auto left = std::max(std::chrono::milliseconds(1),
                             std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()));
  try {
    ok = buf.waitSend(&to, left);
  } catch (const gloo::IoException& e) {
    throw gloo::IoException(absl::StrCat("optireduce::allreduce (tag ", a.tag,
                                         ") failed sending this operation's decision: ", e.what()));
  }
  if (!ok) {
    GLOO_THROW_IO_EXCEPTION("optireduce::allreduce (tag ", a.tag,
                            ") aborted while sending this operation's decision");
  }
}

// The elements [begin, end) of a region of `count` elements that an arrived byte range
// covers whole: a range that splits an element leaves that element missing.
template <typename T>
std::pair<size_t, size_t> WholeElements(const ByteRange& r, size_t count) {
  return {(r.begin + sizeof(T) - 1) / sizeof(T), std::min(count, r.end / sizeof(T))};
}

// Where the reduced shards go, in global elements, sorted: for a counted owner a copy of
// its shard as it arrived whole in phase 2 (src); for an owner left out by the decision,
// zero (src null) — on every rank, so the result is the same everywhere. This rank's own
// shard is listed only when it is left out itself (else its reduced values stay in place).
template <typename T>
struct Placement {
  size_t begin, end;
  const T* src;
};

// `counted` is indexed by context rank, the plan by team member.
template <typename T>
std::vector<Placement<T>> Placements(const TransposePlan& plan, const Team& team,
                                     const std::vector<BoundedRegion>& regions,
                                     const std::vector<bool>& counted) {
  std::vector<Placement<T>> parts;
  for (const BoundedRegion& r : regions) {
    const int owner = team.MemberOf(r.peer);
    const size_t base = plan.ShardBegin(owner);
    const size_t count = plan.ShardCount(owner);
    parts.push_back({base, base + count, counted[r.peer] ? static_cast<const T*>(r.dst) : nullptr});
  }
  const int me = team.member;
  if (!counted[team.Rank(me)] && plan.ShardCount(me) > 0) {
    parts.push_back({plan.ShardBegin(me), plan.ShardBegin(me) + plan.ShardCount(me), nullptr});
  }
  std::sort(parts.begin(), parts.end(),
            [](const Placement<T>& x, const Placement<T>& y) { return x.begin < y.begin; });
  return parts;
}

// Writes elements [x0, x1) of `part` (within it) into place.
template <typename T>
void Place(T* data, const Placement<T>& part, size_t x0, size_t x1) {
  if (part.src != nullptr) {
    std::memcpy(data + x0, part.src + (x0 - part.begin), (x1 - x0) * sizeof(T));
  } else {
    std::fill(data + x0, data + x1, T(0));
  }
}

// Moves the reduced shards from scratch into place (Placements).
template <typename T>
void PlaceReducedShards(T* data, const TransposePlan& plan, const Team& team,
                        const std::vector<BoundedRegion>& regions,
                        const std::vector<bool>& counted) {
  for (const Placement<T>& part : Placements<T>(plan, team, regions, counted)) {
    Place(data, part, part.begin, part.end);
  }
}

// PlaceReducedShards fused with the inverse Hadamard transform of the whole buffer: the
// placement is cut at the transform's blocks and each block is transformed right after its
// elements are written, while it is still in cache.
template <typename T>
void PlaceReducedShardsAndInverse(T* data, size_t elements, const TransposePlan& plan,
                                  const Team& team, const std::vector<BoundedRegion>& regions,
                                  const std::vector<bool>& counted, uint64_t seed,
                                  const hadamard::Options& options) {
  const std::vector<Placement<T>> parts = Placements<T>(plan, team, regions, counted);
  size_t first = 0;  // first part that may overlap the current block
  for (const hadamard::Block& block : hadamard::Blocks(elements, options)) {
    const size_t b0 = block.offset;
    const size_t b1 = b0 + (size_t{1} << block.log2_size);
    while (first < parts.size() && parts[first].end <= b0) first++;
    for (size_t q = first; q < parts.size() && parts[q].begin < b1; q++) {
      Place(data, parts[q], std::max(parts[q].begin, b0), std::min(parts[q].end, b1));
    }
    hadamard::InverseBlock(data, block, seed, options);
  }
}

// mine[e] += sources[0][e], then sources[1][e], ... — in that order for every element (the
// same bytes as one pass per source), a cache-sized run of `mine` at a time: it is read
// and written once instead of once per source.
template <typename T>
void SumInto(T* mine, size_t count, const std::vector<const T*>& sources) {
  constexpr size_t kRun = 4096;  // 16 KiB of float: the run stays in L1 across the sources
  for (size_t b = 0; b < count; b += kRun) {
    const size_t e1 = std::min(count, b + kRun);
    for (const T* src : sources) {
      for (size_t e = b; e < e1; e++) mine[e] += src[e];
    }
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

// Bytes of region `i` that arrived.
uint64_t ArrivedBytes(const BoundedReceive& rx, size_t i) {
  uint64_t got = 0;
  for (const ByteRange& r : rx.Arrived(i)) got += r.size();
  return got;
}

// Throws gloo::IoException when a region still incomplete belongs to a peer that is gone
// (its data never comes: OptiReduce mode absorbs lateness, never a dead peer).
void ThrowIfGone(const BoundedReceive& rx, const std::vector<BoundedRegion>& regions,
                 const std::vector<bool>& waited, const BoundedTransposeArgs& a,
                 const char* what) {
  for (size_t i = 0; i < regions.size(); i++) {
    if (!waited.empty() && !waited[regions[i].peer]) continue;
    const uint64_t got = ArrivedBytes(rx, i);
    const absl::Status peer = rx.PeerStatus(i);
    if (got < regions[i].nbytes && !peer.ok()) {
      throw gloo::IoException(absl::StrCat("optireduce::allreduce (tag ", a.tag, ") failed ",
                                           what, " rank ", regions[i].peer, ": ",
                                           peer.ToString()));
    }
  }
}

// Raises gloo::EnforceNotMet naming both sizes once a packet showed that the ranks called
// this operation with different sizes (the transport's check, BoundedReceive::SizeAgreement).
void EnforceSameSize(const BoundedReceive& rx, const BoundedTransposeArgs& a) {
  const absl::Status sizes = rx.SizeAgreement();
  GLOO_ENFORCE(sizes.ok(), "optireduce::allreduce (tag ", a.tag, ", rank ", a.context->rank,
               ", ", a.op_elements > 0 ? a.op_elements : a.elements,
               " elements): ", sizes.message());
}

// Repairs the regions of counted peers until they are complete, or throws at `until` (the
// operation's timeout) naming the first peer whose data is still missing.
void RepairToCompletion(BoundedReceive& rx, const std::vector<BoundedRegion>& regions,
                        const std::vector<bool>& counted, Clock::time_point until,
                        const BoundedTransposeArgs& a, const char* what, PhaseStats* p) {
  for (;;) {
    int missing = -1;
    for (size_t i = 0; i < regions.size() && missing < 0; i++) {
      if (!counted[regions[i].peer]) continue;
      const uint64_t got = ArrivedBytes(rx, i);
      if (got < regions[i].nbytes) missing = regions[i].peer;
    }
    if (missing < 0) return;
    EnforceSameSize(rx, a);
    ThrowIfGone(rx, regions, counted, a, what);
    for (size_t i = 0; i < regions.size(); i++) {
      if (!counted[regions[i].peer] || !rx.Released(i)) continue;
      const uint64_t got = ArrivedBytes(rx, i);
      if (got < regions[i].nbytes) {
        throw gloo::IoException(absl::StrCat(
            "optireduce::allreduce (tag ", a.tag, ") failed ", what, " rank ", regions[i].peer,
            ": its data is counted on every rank, but it released it before it arrived whole "
            "(its operation ended early; ", got, " of ", regions[i].nbytes,
            " bytes arrived; rank ", a.context->rank, " is ",
            counted[a.context->rank] ? "" : "not ", "counted by leader ",
            a.team.Rank(a.leader), ")"));
      }
    }
    const auto now = Clock::now();
    if (now >= until) {
      throw gloo::IoException(absl::StrCat(
          "optireduce::allreduce (tag ", a.tag, ") timed out ", what, " rank ", missing,
          ": its data is counted on every rank but did not arrive whole in time"));
    }
    p->repaired = true;
    // A counted peer has started (the leader has its data) and serves until its own phase
    // 2 is complete, which needs this data first: it is waited for, not given up.
    const auto grace = std::chrono::duration_cast<microseconds>(until - now);
    // One repair round per bound (Repair asks again 8 times a round): a lost repair is asked
    // for again within a fraction of the bound, not of the whole timeout.
    const auto round = std::max<Clock::duration>(a.bound.bound, std::chrono::milliseconds(8));
    rx.Repair(std::min(until, now + round), grace);
  }
}

bool RegionComplete(const BoundedReceive& rx, const std::vector<BoundedRegion>& regions,
                    size_t i) {
  return ArrivedBytes(rx, i) >= regions[i].nbytes;
}

bool AllStarted(const BoundedReceive& rx, size_t regions) {
  for (size_t i = 0; i < regions; i++) {
    if (!rx.FirstArrival(i)) return false;
  }
  return true;
}

// Waits for peers that have not started this operation (repair rounds ask them too; they
// answer "not started") until every one has, or `until`; with `watch` >= 0, also ends once
// region `watch`'s peer has started. With `grace_over` (the start grace has passed), also
// ends once every peer still missing answered that it has not started: the round is for
// a peer whose first packets were lost, not one that is still away.
void WaitForStarters(BoundedReceive& rx1, const std::vector<BoundedRegion>& regions1,
                     Clock::time_point until, bool grace_over, const BoundedTransposeArgs& a,
                     int watch, PhaseStats* p1) {
  const auto grace =
      grace_over ? microseconds(0)
                 : std::max(a.bound.quiet,
                            std::chrono::duration_cast<microseconds>(until - Clock::now()));
  const auto round = std::max<Clock::duration>(a.bound.quiet, std::chrono::milliseconds(2));
  for (;;) {
    const auto t = Clock::now();
    if (AllStarted(rx1, regions1.size()) || t >= until || !rx1.SizeAgreement().ok()) return;
    if (watch >= 0 && rx1.FirstArrival(static_cast<size_t>(watch))) return;
    p1->repaired = true;
    const auto round_end = std::min(until, t + round);
    const PhaseEnd end = rx1.Repair(round_end, grace);
    if (end == PhaseEnd::kPeerFailed) {
      ThrowIfGone(rx1, regions1, {}, a, "receiving phase-1 data from");
    }
    // Repair ends before its deadline once every sender still missing said it cannot serve.
    if (grace_over && end == PhaseEnd::kDeadline && Clock::now() < round_end) return;
  }
}

// The deputy's side of "who decides": true when the leader, which had not started by the
// start grace, handed this operation's decision over (this rank decides); false when the
// leader decides (it started, refused, or must be waited for however late).
bool DeputyTakesOver(BoundedReceive& rx1, const std::vector<BoundedRegion>& regions1,
                     Clock::time_point start_by, Clock::time_point complete_by,
                     const BoundedTransposeArgs& a, PhaseStats* p1) {
  if (!a.must_wait.empty() && a.must_wait[a.leader]) return false;
  int watch = -1;  // the leader's phase-1 region
  for (size_t i = 0; i < regions1.size(); i++) {
    if (regions1[i].peer == a.team.Rank(a.leader)) watch = static_cast<int>(i);
  }
  if (watch < 0) return false;  // nothing comes from the leader here: nothing to judge by
  const auto ask_round = std::max<Clock::duration>(a.bound.quiet, std::chrono::milliseconds(2));
  bool asked = false;
  for (;;) {
    // Once asked, only the answer says who decides: the leader may have ceded and begun
    // since (its data then arrives here, yet it waits for this rank's decision). A
    // request asked again gets the same answer.
    if (!asked) {
      const auto now = Clock::now();
      WaitForStarters(rx1, regions1, std::max(start_by, now + a.bound.quiet), now >= start_by, a,
                      watch, p1);
      if (rx1.FirstArrival(static_cast<size_t>(watch)) || !rx1.SizeAgreement().ok()) return false;
    }
    const auto now = Clock::now();
    if (now >= complete_by) return false;  // the wait for the decision then times out
    asked = true;
    switch (a.channel->AskToCede(a.team.Rank(a.leader), a.op, std::min(complete_by, now + ask_round))) {
      case BoundedChannel::CedeAnswer::kCeded:
        return true;
      case BoundedChannel::CedeAnswer::kRefused:
      case BoundedChannel::CedeAnswer::kUnsupported:
        return false;
      case BoundedChannel::CedeAnswer::kNoAnswer:
        ThrowIfGone(rx1, regions1, {}, a, "receiving phase-1 data from");
        break;  // lost, or the leader is slow to answer: ask again
    }
  }
}

template <typename T>
void Run(const BoundedTransposeArgs& args, OpStats* stats) {
  BoundedTransposeArgs a = args;  // a.bound may be settled below
  gloo::Context& ctx = *a.context;
  // Plans, leaders and decisions count team members (`rank`, `n`); the channel, Gloo's
  // buffers, the regions' peers and `counted` below name context ranks (team.Rank).
  const Team team = a.team;
  const int rank = team.member;
  const int n = team.size;
  const TransposePlan plan(a.elements, n);
  T* data = reinterpret_cast<T*>(a.data);
  const uint64_t op1 = a.op;
  const uint64_t op2 = SiblingPhaseOp(op1);
  const auto start = Clock::now();
  const std::chrono::milliseconds timeout =
      a.timeout.count() > 0 ? a.timeout
                            : std::chrono::duration_cast<std::chrono::milliseconds>(ctx.getTimeout());
  const Clock::time_point complete_by = start + timeout;

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
      regions1.push_back({team.Rank(plan.RecvPeer(rank, step)), dst, my_count * sizeof(T)});
      peer_data.push_back(dst);
    }
  }
  SourcesGuard guard(a.channel, op1, op2);
  a.channel->BeginOperation(op1, (a.op_elements > 0 ? a.op_elements : a.elements) * sizeof(T));
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
    regions2.push_back({team.Rank(owner), shards_memory + at, plan.ShardCount(owner) * sizeof(T)});
  }
  auto rx2 = a.channel->PostReceive(op2, regions2);
  // Who decides (bounded_agreement.h): the leader, or its deputy when the leader had not
  // begun the operation when the deputy asked for the decision. A leader's hand-over is
  // settled once it has begun the operation (BeginOperation, above). The receive of the
  // decision is posted before any data moves, so it is never staged; the deputy posts it
  // once it knows the leader decides.
  const int deputy = DeputyOf(a.leader, n);
  const bool is_leader = rank == a.leader;
  const bool is_deputy = rank == deputy && !is_leader;
  const bool ceded = is_leader && a.channel->Ceded(op1);
  std::vector<uint64_t> decision_words(Decision::WireWords(n), 0);
  auto decision_buf =
      ctx.createUnboundBuffer(decision_words.data(), decision_words.size() * sizeof(uint64_t));
  if (ceded) {
    decision_buf->recv(team.Rank(deputy), a.decision_slot);
  } else if (!is_leader && !is_deputy) {
    decision_buf->recv(std::vector<int>{team.Rank(a.leader), team.Rank(deputy)}, a.decision_slot);
  }
  // A rank that begins after its peers decided without it (a straggler: the decision is
  // already here) sends no phase-1 data: nobody counts it, and on a shared host its peers'
  // next operation would pay for receiving and dropping it. Only on a transport of our
  // own, whose poll of a receive ends without failing the context.
  Decision decision;
  int decision_from = -1;
  bool have_decision = false;
  // A deputy that already has its leader's phase-1 data knows that the leader decides
  // (DeputyTakesOver would say so without asking): it takes the decision as the others do.
  bool deputy_defers = false;
  if (is_deputy) {
    for (size_t i = 0; i < regions1.size(); i++) {
      if (regions1[i].peer == team.Rank(a.leader) && rx1->FirstArrival(i)) deputy_defers = true;
    }
    if (deputy_defers) decision_buf->recv(team.Rank(a.leader), a.decision_slot);
  }
  if ((ceded || (!is_leader && !is_deputy) || deputy_defers) &&
      a.channel == BoundedChannelOf(ctx)) {
    const std::optional<bool> polled =
        a.channel->PollRecv(*decision_buf, &decision_from, std::chrono::milliseconds(0));
    if (polled.has_value() && !*polled) {
      GLOO_THROW_IO_EXCEPTION("optireduce::allreduce (tag ", a.tag,
                              ") aborted while waiting for the decision");
    }
    if (polled.has_value()) {
      decision = ReadDecision(decision_words, n, op1, decision_from, a);
      have_decision = true;
    }
  }
  const bool left_out_already = have_decision && !decision.counted[rank];
  for (int step = 1; step < n && !left_out_already; step++) {
    const int owner = plan.SendPeer(rank, step);
    if (plan.ShardCount(owner) == 0) continue;
    a.channel->Send(team.Rank(owner), op1, data + plan.ShardBegin(owner),
                    plan.ShardCount(owner) * sizeof(T), /*estimated=*/false);
  }
  if (a.settle_bound) a.bound = a.settle_bound();
  stats->bound_ms = a.bound.bound.count() / 1000.0;
  stats->bound_capped = a.bound.capped;
  const auto half = a.bound.bound / 2;
  // A peer that has not started this allreduce by the start grace is left out by the
  // leader (its contribution is deferred, not lost). The grace is learned from how late
  // peers usually start (TimeoutPolicy); without history it is the whole first half and
  // the repair budget. With two ranks the late peer is half the job: it keeps the whole
  // budget too.
  const bool learned_grace = n > 2 && a.bound.start_grace_learned;
  const Clock::time_point start_by =
      learned_grace ? start + a.bound.start_grace : start + half + a.bound.repair_budget;
  stats->start_grace_ms = std::chrono::duration<double, std::milli>(start_by - start).count();

  PhaseStats& p1 = stats->phase[0];
  const auto phase1_start = Clock::now();
  for (const BoundedRegion& r : regions1) p1.bytes_expected += r.nbytes;
  // A peer that has not started by the start grace does not hold the wait: the decider
  // then decides without waiting out the peer timeout too, and the others wait for its
  // decision. What such a peer sends meanwhile still lands (it may be counted after all).
  p1.end = rx1->Wait(start + half, a.bound.quiet, a.bound.peer_factor, start_by);
  NoteArrivals(*rx1, regions1, {}, &p1);
  if (rx1->SizeAgreement().ok()) ThrowIfGone(*rx1, regions1, {}, a, "receiving phase-1 data from");

  if (!have_decision) {
    decision.op = op1;
    decision.decider = a.leader;
  }
  bool decides = is_leader && !ceded;
  if (is_deputy && !deputy_defers) {
    decides = DeputyTakesOver(*rx1, regions1, start_by, complete_by, a, &p1);
    if (!decides) decision_buf->recv(team.Rank(a.leader), a.decision_slot);
  }
  if (decides) {
    bool must_wait = false;
    for (size_t i = 0; i < regions1.size(); i++) {
      const int peer = regions1[i].peer;
      if (!rx1->FirstArrival(i) && !a.must_wait.empty() && a.must_wait[team.MemberOf(peer)]) {
        must_wait = true;
      }
    }
    if (!AllStarted(*rx1, regions1.size())) {
      // Peers that have not started are waited for until the start grace (until the
      // timeout when one of them must be waited for: left out too often, see
      // BoundedContextState::MustWait).
      const auto now = Clock::now();
      WaitForStarters(*rx1, regions1,
                      must_wait ? complete_by : std::max(start_by, now + a.bound.quiet),
                      !must_wait && now >= start_by, a, -1, &p1);
    }
    decision.decider = rank;
    decision.counted.assign(n, false);
    decision.counted[rank] = true;
    // Counted: a peer that had started by the start grace, one that must be waited for,
    // and one whose data is already whole (counting it costs nothing). A peer that started
    // later is as late as one that has not started yet: waiting for its transfer would
    // cost the others what the grace bounds.
    for (size_t i = 0; i < regions1.size(); i++) {
      const auto first = rx1->FirstArrival(i);
      if (!first) continue;
      const int member = team.MemberOf(regions1[i].peer);
      const bool waited_for = !a.must_wait.empty() && a.must_wait[member];
      if (*first <= start_by || waited_for || RegionComplete(*rx1, regions1, i)) {
        decision.counted[member] = true;
      }
    }
    // With this rank's shard empty (fewer elements than ranks) nobody sends it anything:
    // every rank counts.
    if (regions1.empty()) decision.counted.assign(n, true);
    const std::vector<uint64_t> words = decision.Encode();
    std::copy(words.begin(), words.end(), decision_words.begin());
    for (int peer = 0; peer < n; peer++) {
      if (peer != rank) decision_buf->send(team.Rank(peer), a.decision_slot);
    }
  } else if (!have_decision) {
    WaitDecision(*decision_buf, a, complete_by, &decision_from);
    decision = ReadDecision(decision_words, n, op1, decision_from, a);
  }
  // Sizes are checked once the decision is out: a leader that raised before sending it
  // would leave its peers waiting for it until their timeout.
  EnforceSameSize(*rx1, a);
  // The decision by context rank (ranks outside the team: not counted).
  std::vector<bool> counted(ctx.size, false);
  for (int m = 0; m < n; m++) counted[team.Rank(m)] = decision.counted[m];
  const bool me_counted = decision.counted[rank];
  for (size_t i = 0; i < regions1.size(); i++) {
    if (!counted[regions1[i].peer]) rx1->GiveUp(regions1[i].peer);
  }
  if (me_counted) {
    RepairToCompletion(*rx1, regions1, counted, complete_by, a, "receiving phase-1 data from",
                       &p1);
  }
  for (const BoundedRegion& r : regions1) {
    if (!counted[r.peer]) p1.late_peers.push_back(r.peer);
  }
  p1.ms = MsSince(phase1_start);
  NoteLateStarters(*rx1, regions1, start, a, stats);
  // Exactly the counted contributions, in step order: the owner's sum is the one value of
  // its shard on every rank.
  if (me_counted) {
    std::vector<const T*> sources;
    for (size_t i = 0; i < regions1.size(); i++) {
      if (counted[regions1[i].peer]) sources.push_back(peer_data[i]);
    }
    SumInto(mine, my_count, sources);
  }
  rx1.reset();

  // Phase 2: a counted owner sends its reduced shard to everyone; an owner left out sends
  // nothing (its shard is zero everywhere).
  PhaseStats& p2 = stats->phase[1];
  const auto phase2_start = Clock::now();
  if (my_count > 0 && me_counted) {
    for (int step = 1; step < n; step++) {
      a.channel->Send(team.Rank(plan.SendPeer(rank, step)), op2, mine, my_count * sizeof(T),
                      /*estimated=*/false);
    }
  }
  for (const BoundedRegion& r : regions2) {
    if (counted[r.peer]) {
      p2.bytes_expected += r.nbytes;
    } else {
      rx2->GiveUp(r.peer);
      p2.late_peers.push_back(r.peer);
    }
  }
  p2.end = rx2->Wait(phase2_start + half, a.bound.quiet, a.bound.peer_factor);
  EnforceSameSize(*rx2, a);
  NoteArrivals(*rx2, regions2, counted, &p2);
  RepairToCompletion(*rx2, regions2, counted, complete_by, a, "receiving phase-2 data from",
                     &p2);
  p2.ms = MsSince(phase2_start);
  // Phase-1 sources are released before they are overwritten; the reduced shard is copied
  // so that late phase-2 repairs (a rank left out, catching up) are still served while the
  // caller transforms the buffer back.
  a.channel->FinishSends(op1, Clock::now() + half);
  a.channel->Release(op1);

  // What of this rank's own contribution is not applied: all of it when it is not
  // counted, else its values in the shards of owners that are not counted. Written
  // straight into the caller's carry (a warm spare, BoundedContextState::SpareCarry),
  // before the placement below overwrites them.
  std::vector<std::pair<size_t, size_t>> carried;  // element ranges [begin, end)
  for (int o = 0; o < n; o++) {
    if (plan.ShardCount(o) == 0 || (me_counted && (decision.counted[o] || o == rank))) continue;
    carried.emplace_back(plan.ShardBegin(o), plan.ShardBegin(o) + plan.ShardCount(o));
  }
  // With the transform, a carried value spreads over its whole block when transformed
  // back: the blocks that hold one are the carry's ranges, zero outside the carried values.
  std::vector<hadamard::Block> carried_blocks;
  if (!carried.empty() && a.inverse_hadamard) {
    size_t next = 0;  // first carried range that may overlap the current block
    for (const hadamard::Block& block : hadamard::Blocks(a.elements, a.hadamard)) {
      const size_t b0 = block.offset;
      const size_t b1 = b0 + (size_t{1} << block.log2_size);
      while (next < carried.size() && carried[next].second <= b0) next++;
      if (next < carried.size() && carried[next].first < b1) carried_blocks.push_back(block);
    }
  }
  T* carry = nullptr;
  if (!carried.empty() && a.carry_out != nullptr) {
    std::vector<char>& values = a.carry_out->values;
    if (values.size() < a.elements * sizeof(T)) values.resize(a.elements * sizeof(T));
    carry = reinterpret_cast<T*>(values.data());
    auto& ranges = a.carry_out->ranges;
    ranges.clear();
    for (const hadamard::Block& block : carried_blocks) {
      const size_t b0 = block.offset;
      const size_t b1 = b0 + (size_t{1} << block.log2_size);
      std::memset(carry + b0, 0, (b1 - b0) * sizeof(T));
      if (!ranges.empty() && ranges.back().second == b0) {
        ranges.back().second = b1;
      } else {
        ranges.emplace_back(b0, b1);
      }
    }
    for (const auto& [b, e] : carried) std::memcpy(carry + b, data + b, (e - b) * sizeof(T));
    if (carried_blocks.empty()) ranges = carried;
  }
  if (me_counted) a.channel->Detach(op2);
  if (a.inverse_hadamard) {
    PlaceReducedShardsAndInverse(data, a.elements, plan, team, regions2, counted,
                                 a.hadamard_seed, a.hadamard);
  } else {
    PlaceReducedShards(data, plan, team, regions2, counted);
  }
  rx2.reset();
  if (carry != nullptr) {
    // The transform is block by block: blocks holding no carried value stay zero, so only
    // those that do are transformed back (a counted rank carries 1/N of the buffer at most
    // per owner left out).
    for (const hadamard::Block& block : carried_blocks) {
      hadamard::InverseBlock(carry, block, a.hadamard_seed, a.hadamard);
    }
  }
  if (a.decision_out != nullptr) *a.decision_out = decision;
  // The decision's sends complete when each peer has posted its receive — a straggler
  // only once it starts. On this project's transports the buffer may go before that (the
  // engine keeps a copy of a small message), so the decider returns at once; Gloo's own
  // transports (a channel override in tests) are waited for.
  if (decides && BoundedChannelOf(ctx) == nullptr) {
    for (int peer = 0; peer < n - 1; peer++) WaitDecisionSent(*decision_buf, a, complete_by);
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
  Decision local;
  BoundedTransposeArgs args = a;
  if (args.team.size == 0) args.team = Team::Flat(a.context->rank, a.context->size);
  if (args.decision_out == nullptr) args.decision_out = &local;
  if (a.type == DataType::kFloat64) {
    Run<double>(args, stats);
  } else {
    Run<float>(args, stats);
  }
  // What was deferred follows from the decision alone: the same on every rank.
  const Decision& d = *args.decision_out;
  const int n = static_cast<int>(d.counted.size());
  const TransposePlan plan(a.elements, n);
  int counted_ranks = 0;
  for (int r = 0; r < n; r++) {
    if (d.counted[r]) {
      counted_ranks++;
    } else {
      stats->deferred_ranks.push_back(args.team.Rank(r));
    }
  }
  uint64_t applied = 0;  // (element, contribution) pairs summed into the result
  for (int o = 0; o < n; o++) {
    if (d.counted[o]) applied += static_cast<uint64_t>(plan.ShardCount(o)) * counted_ranks;
  }
  const double total = static_cast<double>(a.elements) * n;
  stats->deferred_pct = total == 0 ? 0.0 : 100.0 * (1.0 - applied / total);
  stats->loss_pct = stats->deferred_pct;
  stats->damaged = !stats->deferred_ranks.empty();
  stats->leader = args.team.Rank(d.decider);
  stats->deputy_decided = d.decider != a.leader;
  // The transport's incast control learns from what the network lost before repairs: the
  // holes, not the data of a peer that started late or was still sending (a straggler is
  // not congestion).
  const uint64_t expected = stats->phase[0].bytes_expected + stats->phase[1].bytes_expected;
  const uint64_t holes = stats->phase[0].bytes_in_holes + stats->phase[1].bytes_in_holes;
  a.channel->OnOperationDone(expected == 0 ? 0.0 : static_cast<double>(holes) / expected,
                             stats->RanLate());
}

}  // namespace optireduce
