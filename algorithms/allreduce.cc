// Transpose AllReduce over Gloo's public transport API (UnboundBuffer send/recv).
#include "algorithms/allreduce.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "algorithms/bounded_channel.h"
#include "algorithms/exact_transpose.h"
#include "algorithms/hadamard.h"
#include "algorithms/internal/thread_scratch.h"
#include "algorithms/op_stats.h"
#include "algorithms/operation_ledger.h"
#include "algorithms/recursive_doubling.h"
#include "algorithms/reduce_classifier.h"
#include "algorithms/transpose_plan.h"
#include "algorithms/two_level_plan.h"

namespace optireduce {
namespace {

using Impl = gloo::detail::AllreduceOptionsImpl;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Slot prefix for TAR messages; Gloo's own collectives use 0x01..0x08.
constexpr uint8_t kTransposeSlotPrefix = 0x20;
// Two-level TAR's four data slots (exact_transpose.h), apart from every flat TAR slot.
constexpr uint8_t kTwoLevelSlotPrefix = 0x21;
// Two-level OptiReduce mode's exact slots (its group's sizes, phase A, the column decisions,
// phase C), apart from exact two-level TAR's: a rank that calibrates while its peers run
// bounded never matches their data.
constexpr uint8_t kTwoLevelBoundedSlotPrefix = 0x22;
// A Gloo slot leaves 24 bits below the tag: TAR's two data slots, then one agreement slot
// per operation of the tag (its sequence, wrapping after 2^22 operations), then recursive
// doubling's.
constexpr uint64_t kMetaSlotSequenceMask = (uint64_t{1} << 22) - 1;
// Recursive doubling (exact operations up to the small-message size) above the agreement
// slots, so no operation's fingerprint ever shares a slot with another's data.
constexpr uint64_t kRecursiveDoublingSlotDelta = uint64_t{1} << 23;
// OptiReduce mode's decisions (bounded_agreement.h): one slot per operation of the tag,
// above recursive doubling's, wrapping like the agreement slots.
constexpr uint64_t kDecisionSlotDelta = kRecursiveDoublingSlotDelta + 1;

struct ImplAccess : gloo::AllreduceOptions {
  static const Impl& Get(const gloo::AllreduceOptions& opts) {
    return opts.*(&ImplAccess::impl_);
  }
};

// Built field by field (MakeJob): each value is named where it is set.
struct Job {
  const Impl& gloo;
  DataType type{};
  ReduceOp op{};
  bool hadamard{};
  // Hadamard::kDefault in OptiReduce mode: the transform belongs to the bounded mode, so a
  // transport without a bounded service (exact TAR instead) runs without it.
  bool hadamard_only_if_bounded{};
  uint64_t hadamard_seed{};
  int hadamard_log2_block{};
  size_t max_segment_bytes{};
  size_t pipeline_chunk_bytes{};  // 0: one chunk per round
  size_t small_message_bytes{};  // exact operations up to this size: recursive doubling
  bool bounded{};  // OptiReduce mode asked for, and the type/op allow it
  double max_loss{};
  Compensation compensation{};
  TimeoutPolicy* policy{};
  BoundedChannel* channel{};  // override; nullptr: the context transport's own
  OpStats* stats_out{};
  // Two-level TAR's group size (1 < G < N); 0: flat (ResolveGroupSize).
  int group_size{};
};

void Validate(const Impl& g) {
  GLOO_ENFORCE(g.context != nullptr, "optireduce::allreduce: no context");
  GLOO_ENFORCE(!g.out.empty(), "optireduce::allreduce: no output buffer (setOutput)");
  GLOO_ENFORCE(g.elementSize > 0, "optireduce::allreduce: element size is 0");
  GLOO_ENFORCE(static_cast<bool>(g.reduce),
               "optireduce::allreduce: no reduce function (setReduceFunction)");
  const size_t bytes = g.elements * g.elementSize;
  for (size_t i = 0; i < g.out.size(); i++) {
    GLOO_ENFORCE(g.out[i] != nullptr, "optireduce::allreduce: output ", i, " is null");
    GLOO_ENFORCE(bytes == 0 || g.out[i]->ptr != nullptr, "optireduce::allreduce: output ",
                 i, " has a null pointer and ", g.elements, " elements");
    GLOO_ENFORCE(g.out[i]->size >= bytes, "optireduce::allreduce: output ", i, " holds ",
                 g.out[i]->size, " bytes, ", bytes, " needed");
  }
  for (size_t i = 0; i < g.in.size(); i++) {
    GLOO_ENFORCE(g.in[i] != nullptr, "optireduce::allreduce: input ", i, " is null");
    GLOO_ENFORCE(bytes == 0 || g.in[i]->ptr != nullptr, "optireduce::allreduce: input ", i,
                 " has a null pointer and ", g.elements, " elements");
    GLOO_ENFORCE(g.in[i]->size >= bytes, "optireduce::allreduce: input ", i, " holds ",
                 g.in[i]->size, " bytes, ", bytes, " needed");
  }
}

hadamard::Options HadamardOptions(const Job& job) {
  hadamard::Options options;
  if (job.hadamard_log2_block > 0) options.log2_block = job.hadamard_log2_block;
  return options;
}

void HadamardTransform(const Job& job, char* data, uint64_t seed, bool forward) {
  const hadamard::Options options = HadamardOptions(job);
  const size_t n = job.gloo.elements;
  if (job.type == DataType::kFloat32) {
    auto* p = reinterpret_cast<float*>(data);
    forward ? hadamard::Forward(p, n, seed, options) : hadamard::Inverse(p, n, seed, options);
  } else {
    auto* p = reinterpret_cast<double*>(data);
    forward ? hadamard::Forward(p, n, seed, options) : hadamard::Inverse(p, n, seed, options);
  }
}

// What every rank must agree on before data moves. Sent to each peer ahead of the data on
// its own slot: on an ordered transport it arrives first, so a rank with a different count
// is reported with a clear error before any receive of the wrong size is posted (Gloo's
// TCP device aborts the process on a size mismatch).
// A calibrating operation in OptiReduce mode also carries the rank's proposal for the bound
// of its size (operation_ledger.h: how the ranks settle on one).
struct PeerFingerprint {
  uint64_t elements;
  uint32_t element_size;
  uint8_t type;
  uint8_t op;
  uint8_t hadamard;
  uint8_t version;
  uint64_t calibration_index;  // OperationLedger::Operation::calibration_index + 1; 0: none
  uint64_t proposal_us;        // TimeoutPolicy::Proposal; 0: no history yet
  uint64_t cap_us;             // the rank's hard cap
  uint32_t group_size;         // the layout the options name: Job::group_size (0: flat)
  uint32_t reserved;
};
static_assert(sizeof(PeerFingerprint) == 48, "fingerprint is sent as raw bytes");

// How error messages name a layout (a Job::group_size).
std::string LayoutName(uint32_t group_size) {
  return group_size > 1 ? absl::StrCat("two-level TAR with groups of ", group_size)
                        : std::string("flat TAR");
}

// What the fingerprints of a completed exchange settle the bound of their size to: the
// largest proposal within the smallest cap, or the smallest cap when a rank had no history.
std::optional<OperationLedger::Agreement> Agree(const std::vector<PeerFingerprint>& all) {
  OperationLedger::Agreement a;
  uint64_t largest = 0, cap = UINT64_MAX;
  bool every_rank_proposed = true;
  for (const PeerFingerprint& f : all) {
    if (f.calibration_index == 0) return std::nullopt;  // not a calibration in OptiReduce mode
    a.index = std::max<uint64_t>(a.index, f.calibration_index - 1);
    largest = std::max(largest, f.proposal_us);
    cap = std::min(cap, f.cap_us);
    every_rank_proposed = every_rank_proposed && f.proposal_us > 0;
  }
  a.capped = !every_rank_proposed || largest >= cap;
  a.bound = std::chrono::microseconds(a.capped ? cap : largest);
  return a;
}

// Like WaitOne for a receive, but in short slices polled through `channel` (a slice that
// ends is no failure there, unlike a Gloo wait that times out), returning false as soon
// as `leave()` says so (the operation's peers run it bounded: the exchange never
// completes).
bool WaitRecvUnless(BoundedChannel& channel, gloo::transport::UnboundBuffer& buf,
                    const char* what, uint32_t tag, const Deadline& deadline,
                    const std::function<bool()>& leave) {
  constexpr milliseconds kSlice{2};
  for (;;) {
    if (leave()) return false;
    // At the deadline, a last Gloo wait: it times out and fails the context (a poll would
    // leave the context usable and the receive posted).
    if (deadline.passed()) {
      WaitOne(buf, /*recv=*/true, what, -1, tag, deadline);
      return true;
    }
    milliseconds left = deadline.Remaining();
    if (left == gloo::transport::kUnsetTimeout || left > kSlice) left = kSlice;
    int rank = -1;
    std::optional<bool> done;
    try {
      done = channel.PollRecv(buf, &rank, left);
    } catch (const gloo::IoException& e) {
      throw gloo::IoException(
          absl::StrCat("optireduce::allreduce (tag ", tag, ") failed ", what, ": ", e.what()));
    }
    if (!done.has_value()) continue;
    if (!*done) {
      GLOO_THROW_IO_EXCEPTION("optireduce::allreduce (tag ", tag, ") aborted while ", what,
                              " rank ", rank);
    }
    return true;
  }
}

// Exchanges fingerprints with every peer and checks that they agree. With `leave` (a
// calibrating operation on a transport with a bounded service, polled through
// `channel`), returns false without completing the exchange once `leave()` is true.
// `mine` holds this rank's bound proposal; with the exchange complete, `*agreement` is
// what the fingerprints settle to (Agree).
bool VerifyPeersAgree(const Job& job, uint64_t slot, const Deadline& deadline,
                      BoundedChannel* channel, const std::function<bool()>& leave,
                      PeerFingerprint mine,
                      std::optional<OperationLedger::Agreement>* agreement) {
  const Impl& g = job.gloo;
  gloo::Context& ctx = *g.context;
  const int n = ctx.size;
  mine.elements = g.elements;
  mine.element_size = static_cast<uint32_t>(g.elementSize);
  mine.type = static_cast<uint8_t>(job.type);
  mine.op = static_cast<uint8_t>(job.op);
  mine.hadamard = static_cast<uint8_t>(job.hadamard);
  mine.group_size = static_cast<uint32_t>(job.group_size);
  mine.version = 3;
  std::vector<PeerFingerprint> theirs(n);
  auto send_buf = ctx.createUnboundBuffer(&mine, sizeof(mine));
  auto recv_buf = ctx.createUnboundBuffer(theirs.data(), theirs.size() * sizeof(mine));
  for (int peer = 0; peer < n; peer++) {
    if (peer == ctx.rank) continue;
    recv_buf->recv(peer, slot, peer * sizeof(mine), sizeof(mine));
    send_buf->send(peer, slot, 0, sizeof(mine));
  }
  for (int i = 0; i < n - 1; i++) {
    if (leave) {
      if (!WaitRecvUnless(*channel, *recv_buf, "exchanging operation sizes with", g.tag,
                          deadline, leave)) {
        // The bounded peers never take this rank's fingerprint: withdrawn, so that it
        // holds no credit and keeps no peer pending.
        channel->WithdrawSends(*send_buf);
        return false;
      }
    } else {
      WaitOne(*recv_buf, /*recv=*/true, "exchanging operation sizes with", -1, g.tag, deadline);
    }
  }
  for (int i = 0; i < n - 1; i++) {
    WaitOne(*send_buf, /*recv=*/false, "sending operation sizes to", -1, g.tag, deadline);
  }
  for (int peer = 0; peer < n; peer++) {
    if (peer == ctx.rank) continue;
    const PeerFingerprint& t = theirs[peer];
    GLOO_ENFORCE(t.elements == mine.elements && t.element_size == mine.element_size,
                 "optireduce::allreduce (tag ", g.tag, "): rank ", ctx.rank, " has ",
                 mine.elements, " elements of ", mine.element_size, " bytes but rank ", peer,
                 " has ", t.elements, " elements of ", t.element_size, " bytes");
    GLOO_ENFORCE(t.hadamard == mine.hadamard && t.op == mine.op,
                 "optireduce::allreduce (tag ", g.tag, "): ranks ", ctx.rank, " and ", peer,
                 " disagree on the reduce op or the Hadamard setting");
    GLOO_ENFORCE(t.group_size == mine.group_size, "optireduce::allreduce (tag ", g.tag,
                 "): ranks ", ctx.rank, " and ", peer, " disagree on the layout of ", n,
                 " ranks: rank ", ctx.rank, " has ", LayoutName(mine.group_size), ", rank ",
                 peer, " has ", LayoutName(t.group_size));
  }
  theirs[ctx.rank] = mine;
  *agreement = Agree(theirs);
  return true;
}

// Exact TAR's scratch per thread (flat: what OptiReduce mode's calibration runs).
size_t ReliableScratchBytes(const Job& job, int rank, int ranks) {
  return FlatScratchBytes(job.gloo.elements, job.gloo.elementSize, job.max_segment_bytes, rank,
                          ranks);
}

ExactTar ExactTarOf(const Job& job, const Deadline& deadline) {
  const Impl& g = job.gloo;
  ExactTar tar;
  tar.context = g.context.get();
  tar.element_size = g.elementSize;
  tar.reduce = &g.reduce;
  tar.tag = g.tag;
  tar.max_segment_bytes = job.max_segment_bytes;
  tar.pipeline_chunk_bytes = job.pipeline_chunk_bytes;
  tar.deadline = &deadline;
  return tar;
}

// Exact TAR over the transport's reliable service, after the agreement check: flat, or
// two-level when the job has a group size.
void RunReliable(const Job& job, char* data, uint64_t seed, const Deadline& deadline,
                 uint64_t slot1, uint64_t slot2) {
  const Impl& g = job.gloo;
  if (job.hadamard) HadamardTransform(job, data, seed, /*forward=*/true);
  const ExactTar tar = ExactTarOf(job, deadline);
  if (job.group_size > 1) {
    TwoLevelTransposeAllreduce(tar, data, g.elements, job.group_size,
                               gloo::Slot::build(kTwoLevelSlotPrefix, g.tag));
  } else {
    FlatTransposeAllreduce(tar, data, g.elements, slot1, slot2);
  }
  if (job.hadamard) HadamardTransform(job, data, seed, /*forward=*/false);
}

void WarnNoBoundedService() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::fprintf(stderr,
                 "optireduce: this context's transport has no bounded service (e.g. Gloo TCP); "
                 "OptiReduce mode runs exact TAR instead. Use the UDP or DPDK device.\n");
  });
}

// A phase ended by the adaptive peer timeout: a late peer, not the network, set the pace.
bool CutByPeerTimeout(const OpStats& stats) {
  for (const PhaseStats& p : stats.phase) {
    if (p.end == PhaseEnd::kPeerTimeout) return true;
  }
  return false;
}

// A phase ended at its deadline and no repair made it complete: the operation's duration
// says only that it needed at least the bound.
bool CutByDeadline(const OpStats& stats) {
  for (const PhaseStats& p : stats.phase) {
    if (p.end == PhaseEnd::kDeadline && p.bytes_received < p.bytes_expected) return true;
  }
  return false;
}

// Fills every output with NaN (OptiReduce mode: floating-point sums only).
void InvalidateOutputs(const Job& job) {
  const Impl& g = job.gloo;
  for (const auto& out : g.out) {
    if (job.type == DataType::kFloat64) {
      std::fill_n(static_cast<double*>(out->ptr), g.elements,
                  std::numeric_limits<double>::quiet_NaN());
    } else {
      std::fill_n(static_cast<float*>(out->ptr), g.elements,
                  std::numeric_limits<float>::quiet_NaN());
    }
  }
}

// Two-level OptiReduce mode, before any data moves: the members of this rank's group
// exchange their element counts (phase A would otherwise cut different parts), and a
// mismatch raises gloo::EnforceNotMet naming both counts. Ranks of other groups learn of
// a different size from phase B's packets (BoundedReceive::SizeAgreement).
void CheckGroupSizes(const Job& job, uint64_t slot, const Deadline& deadline) {
  const Impl& g = job.gloo;
  gloo::Context& ctx = *g.context;
  const Team group = Team::Group(ctx.rank, job.group_size);
  uint64_t mine = g.elements;
  std::vector<uint64_t> theirs(group.size, 0);
  auto send_buf = ctx.createUnboundBuffer(&mine, sizeof(mine));
  auto recv_buf = ctx.createUnboundBuffer(theirs.data(), theirs.size() * sizeof(uint64_t));
  for (int m = 0; m < group.size; m++) {
    if (m == group.member) continue;
    recv_buf->recv(group.Rank(m), slot, m * sizeof(uint64_t), sizeof(uint64_t));
    send_buf->send(group.Rank(m), slot, 0, sizeof(uint64_t));
  }
  for (int i = 0; i < group.size - 1; i++) {
    WaitOne(*recv_buf, /*recv=*/true, "exchanging operation sizes with", -1, g.tag, deadline);
  }
  for (int i = 0; i < group.size - 1; i++) {
    WaitOne(*send_buf, /*recv=*/false, "sending operation sizes to", -1, g.tag, deadline);
  }
  for (int m = 0; m < group.size; m++) {
    if (m == group.member) continue;
    GLOO_ENFORCE(theirs[m] == mine, "optireduce::allreduce (tag ", g.tag, "): rank ", ctx.rank,
                 " has ", mine, " elements but rank ", group.Rank(m), " of its group has ",
                 theirs[m], " elements");
  }
}

// Inverse Hadamard transform of the blocks of `data` that overlap elements [begin, end).
template <typename T>
void InverseBlocksOver(T* data, size_t elements, size_t begin, size_t end, uint64_t seed,
                       const hadamard::Options& options) {
  for (const hadamard::Block& block : hadamard::Blocks(elements, options)) {
    const size_t b0 = block.offset;
    const size_t b1 = b0 + (size_t{1} << block.log2_size);
    if (b1 > begin && b0 < end) hadamard::InverseBlock(data, block, seed, options);
  }
}

// Two-level OptiReduce mode (algorithms/README.md, "Two-level OptiReduce mode"), after
// CheckGroupSizes and the forward transform: phase A exact within the group, phase B a
// bounded TAR of this rank's part among the ranks of its member index (`args`, prepared
// as for flat TAR, is narrowed to it), phase C exact within the group, while the group's
// members exchange their columns' decisions. Returns the decision over every context rank:
// rank q·G + m is counted when column m's decision counted member q (its group's sum of
// part m was applied). `*carry` gets what of this rank's phase-B contribution (its group's
// sum of its part) was not applied, transformed back, as `elements` values; empty when
// nothing. Fills the stats' deferral fields from the whole decision: the same on every rank.
Decision BoundedTwoLevel(const Job& job, BoundedTransposeArgs args, uint64_t slot_base,
                         const Deadline& deadline, const std::vector<bool>& must_wait,
                         uint64_t op_key, Carry* carry, OpStats* stats) {
  const Impl& g = job.gloo;
  gloo::Context& ctx = *g.context;
  const int group_size = job.group_size;
  const int n = ctx.size;
  const int columns_ranks = n / group_size;  // ranks per column (the groups)
  const Team group = Team::Group(ctx.rank, group_size);
  const Team across = Team::Across(ctx.rank, n, group_size);
  const size_t esz = g.elementSize;
  ExactTar tar = ExactTarOf(job, deadline);
  tar.pipeline_chunk_bytes = 0;  // the bounded phase is not pipelined: neither are A and C
  char* data = args.data;

  TwoLevelScatter(tar, data, g.elements, group_size, slot_base + 1);

  size_t part_count = 0;
  const size_t part_begin = TwoLevelPart(g.elements, group_size, group.member, &part_count);
  Decision column;
  column.counted.assign(columns_ranks, true);
  Carry part_carry;
  if (part_count > 0) {
    args.team = across;
    args.data = data + part_begin * esz;
    args.elements = part_count;
    args.op_elements = g.elements;
    args.inverse_hadamard = false;
    args.leader = LeaderOf(op_key, columns_ranks);
    args.must_wait.assign(columns_ranks, false);
    if (!must_wait.empty()) {
      for (int q = 0; q < columns_ranks; q++) args.must_wait[q] = must_wait[across.Rank(q)];
    }
    if (!args.catching_up.empty()) {  // by context rank: to the column's members
      std::vector<bool> by_member(columns_ranks, false);
      for (int q = 0; q < columns_ranks; q++) by_member[q] = args.catching_up[across.Rank(q)];
      args.catching_up = std::move(by_member);
    }
    args.decision_out = &column;
    args.carry_out = &part_carry;
    BoundedTranspose(args, stats);
  }

  // The columns' decisions within the group, a byte per rank of a column, while phase C
  // runs.
  std::vector<uint8_t> flags(static_cast<size_t>(group_size) * columns_ranks, 0);
  for (int q = 0; q < columns_ranks; q++) {
    flags[group.member * columns_ranks + q] = column.counted[q] ? 1 : 0;
  }
  auto flags_buf = ctx.createUnboundBuffer(flags.data(), flags.size());
  const size_t row = columns_ranks;
  for (int m = 0; m < group_size; m++) {
    if (m == group.member) continue;
    flags_buf->recv(group.Rank(m), slot_base + 2, m * row, row);
    flags_buf->send(group.Rank(m), slot_base + 2, group.member * row, row);
  }
  TwoLevelGather(tar, data, g.elements, group_size, slot_base + 3);
  for (int i = 0; i < group_size - 1; i++) {
    WaitOne(*flags_buf, /*recv=*/true, "exchanging decisions with", -1, g.tag, deadline);
  }
  for (int i = 0; i < group_size - 1; i++) {
    WaitOne(*flags_buf, /*recv=*/false, "sending decisions to", -1, g.tag, deadline);
  }

  Decision whole;
  whole.op = column.op;
  whole.decider = -1;
  whole.counted.assign(n, false);
  uint64_t applied = 0;  // (element, contribution) pairs summed into the result
  for (int m = 0; m < group_size; m++) {
    size_t count = 0;
    TwoLevelPart(g.elements, group_size, m, &count);
    const TransposePlan pieces(count, columns_ranks);
    uint64_t counted_groups = 0;
    for (int q = 0; q < columns_ranks; q++) counted_groups += flags[m * row + q];
    for (int q = 0; q < columns_ranks; q++) {
      whole.counted[q * group_size + m] = flags[m * row + q] != 0;
      if (flags[m * row + q] != 0) {
        applied += static_cast<uint64_t>(pieces.ShardCount(q)) * counted_groups * group_size;
      }
    }
  }
  stats->deferred_ranks.clear();
  for (int r = 0; r < n; r++) {
    if (!whole.counted[r]) stats->deferred_ranks.push_back(r);
  }
  const double total = static_cast<double>(g.elements) * n;
  stats->deferred_pct = total == 0 ? 0.0 : 100.0 * (1.0 - applied / total);
  stats->loss_pct = stats->deferred_pct;
  stats->damaged = !stats->deferred_ranks.empty();

  carry->ranges.clear();
  if (!part_carry.empty()) {
    carry->values.assign(g.elements * esz, 0);
    for (const auto& [b, e] : part_carry.ranges) {
      std::memcpy(carry->values.data() + (part_begin + b) * esz,
                  part_carry.values.data() + b * esz, (e - b) * esz);
    }
    if (job.hadamard) {
      const hadamard::Options options = HadamardOptions(job);
      if (job.type == DataType::kFloat64) {
        InverseBlocksOver(reinterpret_cast<double*>(carry->values.data()), g.elements,
                          part_begin, part_begin + part_count, args.hadamard_seed, options);
      } else {
        InverseBlocksOver(reinterpret_cast<float*>(carry->values.data()), g.elements,
                          part_begin, part_begin + part_count, args.hadamard_seed, options);
      }
    }
    carry->ranges.emplace_back(0, g.elements);
  }
  return whole;
}

void Run(Job job) {
  const Impl& g = job.gloo;
  const size_t bytes = g.elements * g.elementSize;
  char* data = static_cast<char*>(g.out[0]->ptr);
  // In OptiReduce mode exact TAR's scratch grows (and is faulted in) before the clock
  // starts: a calibrating operation's time becomes its size's bound, and the first one
  // of a size must not time one-off page faults.
  if (job.bounded && g.context->size > 1 && g.elements > 0) {
    internal::ThreadScratch(internal::ScratchSlot::kReliableSteps,
                            ReliableScratchBytes(job, g.context->rank, g.context->size));
  }
  const auto start = Clock::now();

  // Local reduction into the first output, as stock Gloo does: the inputs when there are
  // any (the outputs only receive the result), else every output.
  if (bytes > 0) {
    if (!g.in.empty()) {
      if (g.in[0]->ptr != data) std::memcpy(data, g.in[0]->ptr, bytes);
      for (size_t i = 1; i < g.in.size(); i++) g.reduce(data, data, g.in[i]->ptr, g.elements);
    } else {
      for (size_t i = 1; i < g.out.size(); i++) g.reduce(data, data, g.out[i]->ptr, g.elements);
    }
  }

  gloo::Context& ctx = *g.context;
  if (ctx.size > 1) {
    // Every rank advances the context's ledger once per operation: the (tag, sequence) key
    // seeds the Hadamard signs and names bounded operations, and the per-size count decides
    // calibration, the same on every rank (operation_ledger.h).
    const std::shared_ptr<OperationLedger> ledger = OperationLedger::Of(g.context);
    const OperationLedger::Operation op =
        ledger->Next(g.tag, bytes, job.bounded ? job.policy->options().calibration_ops : 0);
    // A calibrating operation settles once however it ends: bounded operations of its size
    // read their agreed bound only after it (operation_ledger.h).
    std::optional<OperationLedger::Agreement> agreement;
    bool settled = false;
    const auto settle = [&] {
      if (!settled) ledger->Settle(bytes, op, agreement);
      settled = true;
    };
    absl::Cleanup settle_on_error = settle;
    const uint64_t seed = hadamard::OperationSeed(job.hadamard_seed, op.key);
    BoundedChannel* channel = nullptr;
    if (job.bounded) channel = job.channel != nullptr ? job.channel : BoundedChannelOf(ctx);
    // A contribution an earlier OptiReduce-mode operation on this buffer deferred joins this
    // one's input, whatever this one runs (bounded_agreement.h): late, never lost.
    const BoundedContextState::CarryKey carry_key{reinterpret_cast<uintptr_t>(data), g.elements,
                                                  job.type};
    bool carried_in = false;
    if (job.bounded && g.elements > 0) {
      // The flag comes from the mark every rank made, not from whether this rank holds a
      // carry: the result holds the carry on every rank (a carry dropped over the budget
      // still flags, as `carry_dropped` said).
      ledger->bounded_state().TakeCarry(carry_key, data);
      carried_in = ledger->bounded_state().TakeDeferredMark(carry_key);
    }
    if (job.bounded && channel == nullptr) WarnNoBoundedService();
    if (channel == nullptr && job.hadamard_only_if_bounded) job.hadamard = false;
    OpStats stats;
    stats.carried_in = carried_in;
    stats.tag = g.tag;
    stats.bytes = bytes;
    stats.rank = ctx.rank;
    stats.size = ctx.size;
    const Deadline deadline(g.timeout);
    const uint64_t slot1 = gloo::Slot::build(kTransposeSlotPrefix, g.tag);
    const uint64_t slot2 = gloo::Slot::build(kTransposeSlotPrefix, g.tag) + uint8_t{1};
    // The agreement exchange has a slot of its own operation (below the tag's next slot):
    // the fingerprint of a rank that left it to join bounded peers stays unmatched there,
    // and must not be taken by a later exchange with the tag.
    // In uint64_t: gloo::Slot's own operator+ takes a uint8_t delta (at most 0xff).
    const uint64_t slot_meta = static_cast<uint64_t>(gloo::Slot::build(kTransposeSlotPrefix, g.tag)) +
                               uint64_t{2} + (op.sequence & kMetaSlotSequenceMask);
    const uint64_t bounded_op = BoundedOpId(g.tag, op.sequence, 1);
    bool bounded = channel != nullptr && g.elements > 0 && !op.calibrate;
    if (!bounded) {
      // Also with 0 elements: a rank with 0 and a rank with more must both hear of it. A
      // calibrating rank whose peers run this operation bounded (their data for it is
      // here; operation_ledger.h says when ranks can disagree) joins them: they never
      // take part in the exchange.
      // Only on a transport of our own (its channel, not an override): its PollRecv ends a
      // slice without failing the context, while a Gloo wait that times out fails it.
      std::function<bool()> peers_bounded;
      if (channel != nullptr && job.channel == nullptr && g.elements > 0) {
        peers_bounded = [channel, bounded_op] {
          return channel->HasUnpostedData(bounded_op) || channel->HasUnpostedData(SiblingPhaseOp(bounded_op));
        };
      }
      PeerFingerprint proposal{};
      if (op.calibration_index >= 0) {
        proposal.calibration_index = static_cast<uint64_t>(op.calibration_index) + 1;
        proposal.proposal_us = job.policy->Proposal(bytes).value_or(std::chrono::microseconds(0)).count();
        proposal.cap_us = job.policy->options().hard_cap.count();
      }
      if (!VerifyPeersAgree(job, slot_meta, deadline, channel, peers_bounded, proposal,
                            &agreement)) {
        bounded = true;
        stats.joined_bounded = true;
      } else if (channel != nullptr && op.calibration_index >= 0 && g.elements > 0) {
        // Every rank sends its fingerprint as it starts: the last one arrived about as late
        // as the latest peer started. The start grace learns from it as from a bounded
        // operation's first packets, so the first bounded operations after calibration
        // already leave a straggler out at the learned grace, not after the repair budget.
        stats.start_lag_ms =
            std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      }
      settle();
    }
    if (bounded) {
      // OptiReduce mode. No agreement exchange here: it would wait for the slowest rank.
      stats.mode = OpMode::kBounded;
      stats.op = bounded_op;
      const uint64_t two_level_slots = gloo::Slot::build(kTwoLevelBoundedSlotPrefix, g.tag);
      if (job.group_size > 1) {
        try {
          CheckGroupSizes(job, two_level_slots, deadline);
        } catch (const gloo::EnforceNotMet&) {
          InvalidateOutputs(job);
          throw;
        }
      }
      if (job.hadamard) HadamardTransform(job, data, seed, /*forward=*/true);
      BoundedTransposeArgs args;
      args.context = &ctx;
      args.channel = channel;
      args.data = data;
      args.elements = g.elements;
      args.type = job.type;
      args.op = stats.op;
      args.tag = g.tag;
      // The agreed bound, read once this rank's phase-1 data is on its way: a calibration
      // of this size still running here may be one its peers are running bounded, and it
      // ends (joining them) only when this rank's data arrives there.
      const auto until = Clock::now() + (g.timeout.count() > 0 ? g.timeout : ctx.getTimeout());
      args.settle_bound = [&job, &ledger, &g, bytes, until] {
        bool calibrations_settled = false;
        const auto agreed = ledger->AgreedBound(bytes, until, &calibrations_settled);
        if (!calibrations_settled) {
          GLOO_THROW_IO_EXCEPTION("optireduce::allreduce (tag ", g.tag,
                                  ") timed out waiting for the calibrating operations of ",
                                  bytes, " bytes that run on this rank at the same time");
        }
        return agreed ? job.policy->BoundWith(bytes, agreed->bound, agreed->capped)
                      : job.policy->BoundFor(bytes);
      };
      args.max_loss = job.max_loss;
      args.compensation = job.compensation;
      // The inverse transform runs inside, fused with the placement of the result.
      args.inverse_hadamard = job.hadamard && job.group_size <= 1;
      args.hadamard_seed = seed;
      args.hadamard = HadamardOptions(job);
      args.leader = LeaderOf(op.key, ctx.size);
      args.decision_slot = static_cast<uint64_t>(gloo::Slot::build(kTransposeSlotPrefix, g.tag)) +
                           kDecisionSlotDelta + (op.sequence & kMetaSlotSequenceMask);
      args.timeout = g.timeout.count() > 0 ? g.timeout
                                           : std::chrono::duration_cast<milliseconds>(ctx.getTimeout());
      BoundedContextState& state = ledger->bounded_state();
      const BoundedContextState::WaitRule wait_rule =
          state.MustWait(ctx.size, BoundedContextState::MaxLeftOutInARow(bytes, ctx.size));
      args.must_wait = wait_rule.must_wait;
      args.catching_up = wait_rule.catching_up;
      for (int r = 0; r < ctx.size; r++) {
        if (wait_rule.slow[r] && ctx.rank == args.leader) stats.slow_ranks.push_back(r);
      }
      Decision decision;
      Carry carry = state.SpareCarry(bytes);
      args.decision_out = &decision;
      args.carry_out = &carry;
      try {
        if (job.group_size > 1) {
          decision = BoundedTwoLevel(job, args, two_level_slots, deadline, wait_rule.must_wait,
                                     op.key, &carry, &stats);
          if (job.hadamard) HadamardTransform(job, data, seed, /*forward=*/false);
          stats.group_size = job.group_size;
        } else {
          BoundedTranspose(args, &stats);
        }
      } catch (const gloo::EnforceNotMet&) {
        // The ranks' sizes differ: the buffer holds part of a transformed reduction, which
        // must not pass for a result.
        InvalidateOutputs(job);
        throw;
      }
      state.NoteDecision(decision, decision.decider);
      if (stats.damaged) state.MarkDeferred(carry_key);
      if (carry.empty()) {
        state.ReturnSpareCarry(std::move(carry));
      } else {
        stats.carry_dropped = state.AddCarry(carry_key, std::move(carry));
      }
    } else {
      if (g.elements > 0 && !job.bounded && !job.hadamard && bytes <= job.small_message_bytes) {
        RecursiveDoublingArgs rd;
        rd.context = &ctx;
        rd.data = data;
        rd.elements = g.elements;
        rd.element_size = g.elementSize;
        rd.reduce = g.reduce;
        rd.slot = static_cast<uint64_t>(gloo::Slot::build(kTransposeSlotPrefix, g.tag)) +
                  kRecursiveDoublingSlotDelta;
        rd.tag = g.tag;
        rd.timeout = deadline.Remaining();
        RecursiveDoublingAllreduce(rd);
      } else if (g.elements > 0) {
        // A calibrating operation measures what the bounded ones after it will take, and
        // the bounded transpose is not pipelined: neither is its calibration.
        if (channel != nullptr) job.pipeline_chunk_bytes = 0;
        RunReliable(job, data, seed, deadline, slot1, slot2);
        stats.group_size = job.group_size;
      }
      stats.mode = channel != nullptr ? OpMode::kCalibration : OpMode::kReliable;
    }
    const auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
    stats.duration_ms = elapsed.count() / 1000.0;
    if (stats.mode == OpMode::kCalibration) {
      // Outside the measured time: the bound must not include one-off page faults. The
      // bounded TAR of two-level OptiReduce mode is that of this rank's part in its column.
      size_t tar_elements = g.elements;
      Team team = Team::Flat(ctx.rank, ctx.size);
      if (job.group_size > 1) {
        TwoLevelPart(g.elements, job.group_size, ctx.rank % job.group_size, &tar_elements);
        team = Team::Across(ctx.rank, ctx.size, job.group_size);
      }
      PrepareBoundedTranspose(job.type, tar_elements, team.member, team.size);
      // The reduced shard a bounded operation detaches for late repairs.
      channel->ReserveDetach(TransposePlan(tar_elements, team.size).ShardCount(team.member) *
                             g.elementSize);
    }
    if (job.bounded && g.elements > 0) {
      // The lag leaves out ranks still catching up on an operation they were left out of
      // (BoundedTransposeArgs::catching_up): their lateness is a straggle, not the ranks'
      // usual skew, and would raise the grace the next straggler is measured against.
      if ((stats.mode == OpMode::kBounded || stats.mode == OpMode::kCalibration) &&
          stats.start_lag_ms >= 0) {
        job.policy->RecordStartLag(
            bytes, std::chrono::microseconds(static_cast<int64_t>(stats.start_lag_ms * 1000)),
            stats.start_lag_gave_up);
      }
      if (stats.mode == OpMode::kBounded && CutByDeadline(stats)) {
        job.policy->RecordCut(bytes, std::chrono::microseconds(
                                         static_cast<int64_t>(stats.bound_ms * 1000)));
      } else if (stats.mode == OpMode::kBounded && CutByPeerTimeout(stats)) {
        // A late peer, not the network, decided how long this one took: recording it would
        // let stragglers raise the bound (and with it the peer timeout) until they are
        // waited for again.
      } else {
        job.policy->Record(bytes, elapsed);
      }
      StatsRegistry::Get().Record(stats);
    }
    if (job.hadamard) stats.hadamard_seed = seed;
    if (job.stats_out != nullptr) *job.stats_out = stats;
  }

  for (size_t i = 1; i < g.out.size(); i++) {
    if (g.out[i]->ptr != data && bytes > 0) std::memcpy(g.out[i]->ptr, data, bytes);
  }
}

// The group size of two-level TAR the options name for N ranks; 0: flat TAR. An explicit
// group size must divide N: a pure function of the options, so every rank raises alike.
int ResolveGroupSize(const AllreduceOptions& extras, int ranks) {
  const size_t named = extras.groupSize();
  GLOO_ENFORCE(named == 0 || (named <= static_cast<size_t>(ranks) && ranks % named == 0),
               "optireduce::allreduce: group size ", named, " does not divide the ", ranks,
               " ranks (two-level TAR needs N/G groups of G)");
  using Layout = AllreduceOptions::Layout;
  if (extras.layout() == Layout::kFlat) return 0;
  if (extras.layout() == Layout::kAuto && ranks < AllreduceOptions::kTwoLevelMinRanks) return 0;
  const int group = named != 0 ? static_cast<int>(named) : TwoLevelGroupSize(ranks);
  return group > 1 && group < ranks ? group : 0;
}

Job MakeJob(const Impl& g, const AllreduceOptions& extras) {
  Validate(g);
  DataType type = extras.dataType();
  ReduceOp op = extras.reduceOp();
  if (type == DataType::kUnknown || op == ReduceOp::kUnknown) {
    const ReduceKind kind = ClassifyReduce(g.reduce, g.elementSize);
    if (type == DataType::kUnknown) type = kind.type;
    if (op == ReduceOp::kUnknown) op = kind.op;
  }
  const bool float_sum = IsFloatingPoint(type) && op == ReduceOp::kSum &&
                         ElementSize(type) == g.elementSize;
  const bool bounded = extras.mode() == AllreduceOptions::Mode::kBounded && float_sum;
  auto mode = extras.hadamard();
  const bool by_default = mode == AllreduceOptions::Hadamard::kDefault;
  if (by_default) {
    mode = bounded ? AllreduceOptions::Hadamard::kAuto : AllreduceOptions::Hadamard::kOff;
  }
  GLOO_ENFORCE(mode != AllreduceOptions::Hadamard::kOn || float_sum,
               "optireduce::allreduce: the Hadamard transform needs a float32/float64 sum, "
               "got type ", DataTypeName(type), " and op ", ReduceOpName(op));
  GLOO_ENFORCE(extras.maxSegmentBytes() > 0, "optireduce::allreduce: max segment bytes is 0");
  GLOO_ENFORCE(extras.maxLoss() >= 0 && extras.maxLoss() <= 1,
               "optireduce::allreduce: max loss must be a fraction in [0, 1], got ",
               extras.maxLoss());
  TimeoutPolicy* policy =
      extras.timeoutPolicy() ? extras.timeoutPolicy().get() : &DefaultTimeoutPolicy();
  int log2_block = extras.hadamardLog2Block();
  if (log2_block <= 0 && bounded) log2_block = AllreduceOptions::kBoundedHadamardLog2Block;
  if (by_default && bounded && !HadamardSpreadsShards(g.elements, g.context->size, log2_block)) {
    mode = AllreduceOptions::Hadamard::kOff;
  }
  Job job{g};
  job.type = type;
  job.op = op;
  job.hadamard = mode != AllreduceOptions::Hadamard::kOff && float_sum;
  job.hadamard_only_if_bounded = by_default && bounded;
  job.hadamard_seed = extras.hadamardSeed();
  job.hadamard_log2_block = log2_block;
  job.max_segment_bytes = extras.maxSegmentBytes();
  job.pipeline_chunk_bytes = extras.pipelineChunkBytes();
  job.small_message_bytes = extras.smallMessageBytes();
  job.bounded = bounded;
  job.max_loss = extras.maxLoss();
  job.compensation = extras.compensation();
  job.policy = policy;
  job.channel = extras.boundedChannel();
  job.stats_out = extras.statsOutput();
  job.group_size = ResolveGroupSize(extras, g.context->size);
  return job;
}

}  // namespace

bool HadamardSpreadsShards(size_t elements, int ranks, int log2_block) {
  if (ranks <= 1 || log2_block < 0 || log2_block >= 63) return false;
  return elements / static_cast<size_t>(ranks) < (size_t{1} << log2_block);
}

const gloo::detail::AllreduceOptionsImpl& GlooOptionsOf(const gloo::AllreduceOptions& opts) {
  return ImplAccess::Get(opts);
}

TimeoutPolicy& DefaultTimeoutPolicy() {
  static TimeoutPolicy* policy = new TimeoutPolicy();
  return *policy;
}

void SetDefaultTimeoutOptions(const TimeoutOptions& options) {
  DefaultTimeoutPolicy().Configure(options);
}

void allreduce(const AllreduceOptions& opts) { Run(MakeJob(opts.glooOptions(), opts)); }

void allreduce(const gloo::AllreduceOptions& opts, const AllreduceOptions& extras) {
  Run(MakeJob(GlooOptionsOf(opts), extras));
}

void allreduce(const gloo::AllreduceOptions& opts, AllreduceOptions::Hadamard hadamard) {
  AllreduceOptions extras(GlooOptionsOf(opts).context);
  extras.setHadamard(hadamard);
  Run(MakeJob(GlooOptionsOf(opts), extras));
}

}  // namespace optireduce
